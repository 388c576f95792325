"""The names of the in-process API: what ``import conch`` offers of ``conch.server``.

A module of its own, below both: the package root reads it to import ``conch.server`` on
first use, and ``conch.server`` exports exactly these, so neither imports the other's
module to agree on the list.
"""

from __future__ import annotations

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
