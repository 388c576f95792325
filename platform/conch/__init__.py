"""conch: Triton-compatible inference serving on Celery and Redis.

``conch.Server`` (``conch.server``) runs conch inside an application. It is imported on
first use, so that ``import conch`` stays as light as every process needs it to be.
"""

from __future__ import annotations

from typing import Any

from conch.api import API  # what ``import conch`` offers of ``conch.server``, on first use
from conch.version import __version__


def __getattr__(name: str) -> Any:
    if name in API:
        from conch import server

        return getattr(server, name)
    raise AttributeError(f"module 'conch' has no attribute {name!r}")


__all__ = ["__version__", *API]
