"""conch's version, one source: the package, the CLI's --version, the server metadata and
the OpenAPI document read it here (pyproject.toml and the chart carry the same number).
"""

__version__ = "0.1.0"
