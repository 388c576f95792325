"""repo_sync: mirror a Triton model repository from S3 (or a folder) into a local cache.

Run as ``conch sync`` or ``python -m repo_sync``. Every ``--repository-poll-secs`` it lists
the source (``s3://bucket/prefix`` through boto3 with the usual AWS settings, or a local
folder) and brings the cache folder (``--model-repository``, which workers and gateways
read) up to date. Only objects whose ETag/size (S3) or size/mtime (folder) changed are
downloaded again; unchanged files of a changed version are hard-linked from the old copy.
A manifest of what the cache holds is kept in ``<cache>/.conch-sync.json``.

When a version is taken (completeness)
--------------------------------------
A version folder ``<model>/<version>/`` of the source is copied into the cache when

(a) its marker object ``<model>/<version>/.ready`` exists and no object of the version
    is newer than the marker (write the marker last): taken at the next poll; or
(b) without a usable marker (and unless ``--require-ready-marker``): every object under
    the version prefix is the same (keys, ETags, sizes) in two consecutive polls, AND the
    model file is there: the config's ``default_model_filename``, else its platform's or
    backend's default (model.onnx, model.pt, model.plan, model.py), else (no config, or no
    platform/backend in it) any of those; an ensemble needs none; a file or a folder of
    that name counts. A version is thus taken within two poll intervals after its upload
    ended.

A version still being uploaded (a file missing, or objects changing between polls) is
never taken; the cache keeps what it had (the previous copy of a changed version keeps
serving). ``--once`` runs a pass and, if versions wait to settle, a second pass one poll
interval later, then exits. A new model appears in the cache with its first taken
version (never as an empty folder). Model-level files (config.pbtxt, label files) are
single objects, taken as soon as they are listed. Removals are immediate: a model or
version gone from the source is gone from the cache at the next poll.

Atomicity
---------
A version (or a new model) is built in ``<cache>/.conch-sync-tmp/`` (dot-prefixed: readers
skip it) and renamed into place; a changed version is swapped with the old one
(``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere old renamed aside, new renamed in).
Model-level files are written to a temporary file and ``os.replace``-d. A removed model
or version is renamed aside. Old copies are deleted ``--delete-delay-secs`` later (a
reader may have opened one just before the swap). No reader of the cache ever sees a
half-copied version. Symbolic links are never created.

Refused keys
------------
Keys that could escape the cache or confuse readers are refused, logged with a warning
naming the key, and never written: ``..`` or ``.`` segments, absolute paths, empty segments,
backslashes, control or invisible characters (NUL, U+0001..U+001F, U+007F, bidi overrides,
other Unicode category C), model folders that are not the repository's safe model name
(``[A-Za-z0-9_-][A-Za-z0-9_.-]*``), a file named like a version folder, a path that is both
a file and a folder, objects over ``--max-object-bytes``, and (folder source) symbolic
links and special files. Like Triton, files at the repository root, non-numeric (or
zero-padded) version folders and dot folders are ignored.

Events
------
After the files are in place, one JSON message per change is published on the Redis
channel ``conch.repository.events`` (``--redis-url``, default ``$REDIS_URL``; without one
events are only logged)::

    {"model": "m", "version": 3, "change": "added"|"changed"|"removed",
     "at": <epoch seconds>, "generation": <int>}

``version`` is null for the model itself (model added or removed; a model-level file such
as config.pbtxt changed). The Redis key ``conch.repository.generation`` is INCRemented once
per pass that changed anything, before its events are published. ``publish_events`` and
``Publisher`` (``repo_sync.events``) are the publishing, for reuse.
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
