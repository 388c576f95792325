"""repo_sync: mirror a Triton model repository from S3 (or a folder) into a local cache.

Run as ``conch sync`` or ``python -m repo_sync``. What it does and guarantees (when a
version is taken, atomicity, refused keys, the repository events it publishes) is in
``repo_sync/README.md``. The path rules are conch's (``conch.core.repository_keys``) and
the Redis names are conch's (``conch.wire.keys``); repo_sync imports nothing else of
conch, and conch imports repo_sync only in its CLI.
"""

from __future__ import annotations

from typing import Any

from .events import (
    CHANNEL,
    GENERATION_KEY,
    Publisher,
    decode_event,
    make_event,
    publish_events,
    read_generation,
)

_LAZY = {
    "Syncer": "sync",
    "SyncOptions": "sync",
    "PassResult": "sync",
    "CacheError": "sync",
    "CacheBusy": "sync",
    "open_source": "sources",
    "S3Source": "sources",
    "LocalSource": "sources",
}


def __getattr__(name: str) -> Any:  # the sync machinery is imported on first use
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CHANNEL",
    "GENERATION_KEY",
    "CacheBusy",
    "CacheError",
    "LocalSource",
    "PassResult",
    "Publisher",
    "S3Source",
    "SyncOptions",
    "Syncer",
    "decode_event",
    "make_event",
    "open_source",
    "publish_events",
    "read_generation",
]
