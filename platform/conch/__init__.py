"""conch: Triton-compatible inference serving on Celery and Redis.

``conch.Server`` (``conch.server``) runs conch inside an application. It is imported on
first use, so that ``import conch`` stays as light as every process needs it to be.
"""

from __future__ import annotations

from typing import Any

from conch.version import __version__

# What ``import conch`` offers of ``conch.server`` (the in-process API), imported on first
# use; ``conch.server`` exports exactly these.
API = (
    "AsyncResponseIterator",
    "ConchError",
    "InferenceResponse",
    "Model",
    "ModelControlMode",
    "ModelIndex",
    "ResponseIterator",
    "Server",
)


def __getattr__(name: str) -> Any:
    if name in API:
        from conch import server

        return getattr(server, name)
    raise AttributeError(f"module 'conch' has no attribute {name!r}")


__all__ = ["__version__", *API]
