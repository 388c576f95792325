"""Where an object key of the source lands in the cache, or why it is refused.

The rules are the model repository's own, defined once in ``conch.core.repository_keys``
(the server reads what the sync writes by the same rules); this module names them for
repo_sync.
"""

from __future__ import annotations

from conch.core.repository_keys import (
    IGNORED,
    MAX_KEY_CHARS,
    MAX_SEGMENT_BYTES,
    MODEL_FILE,
    MODEL_NAME,
    READY,
    READY_MARKER,
    VERSION_DIR,
    VERSION_FILE,
    VERSION_NAME,
    Place,
    RefusedKey,
    classify,
)

__all__ = [
    "IGNORED",
    "MAX_KEY_CHARS",
    "MAX_SEGMENT_BYTES",
    "MODEL_FILE",
    "MODEL_NAME",
    "READY",
    "READY_MARKER",
    "VERSION_DIR",
    "VERSION_FILE",
    "VERSION_NAME",
    "Place",
    "RefusedKey",
    "classify",
]
