"""A model repository's path rules: model names, and where a relative path lands.

A key is a path relative to the repository root, ``/``-separated: an object key under
repo_sync's source prefix, or a load request's ``file:`` override. Keys that could escape
the repository or confuse a reader are *refused* (``RefusedKey``): never written. Keys
that are merely not part of a Triton repository (files at the root, non-numeric version
folders, dot folders) are *ignored*, as Triton ignores them.

The repository (``conch.core.repository``), the control bus (``file:`` overrides) and
repo_sync all use these rules, so what the sync writes is what the server reads. Only
the standard library here: importing repo_sync stays cheap.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# Version folders as ModelRepository reads them: decimal, no leading zero, int64.
VERSION_NAME = re.compile(r"[1-9][0-9]{0,17}")
READY_MARKER = ".ready"
MAX_SEGMENT_BYTES = 255  # NAME_MAX on Linux file systems
MAX_KEY_CHARS = 1024  # S3's own limit on key length

# What a key is, once checked.
MODEL_FILE = "model-file"  # <model>/<file>: config.pbtxt, labels, ...
VERSION_FILE = "version-file"  # <model>/<version>/<path...>
VERSION_DIR = "version-dir"  # <model>/<version>/ (a folder marker object, or an empty folder)
READY = "ready"  # <model>/<version>/.ready
IGNORED = "ignored"  # not part of a model repository; skipped quietly


class RefusedKey(ValueError):
    """A key that must never be written; ``reason`` says why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key!r}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Place:
    kind: str
    model: str = ""
    version: int | None = None
    path: str = ""  # relative to the model folder (MODEL_FILE) or version folder (VERSION_FILE)
    why: str = ""  # for IGNORED keys


def _bad_char(ch: str) -> bool:
    if ch in "\\\x7f" or ord(ch) < 32:
        return True
    # Other (Cc, Cf, Cs, Co, Cn): invisible, bidi overrides, unassigned; line separators.
    cat = unicodedata.category(ch)
    return cat[0] == "C" or cat in ("Zl", "Zp")


def _bad_chars(text: str) -> str | None:
    """What ``text`` holds that no key or name may hold (the first one), or None."""
    for ch in text:
        if _bad_char(ch):
            return (
                "a backslash" if ch == "\\" else f"control or invisible character U+{ord(ch):04X}"
            )
    return None


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a model, or None when it can.

    Triton takes any folder name that is not blank and cannot climb out of the
    repository ('..', '/'): commas, spaces, any letter. conch takes the same, less hidden
    folders ('.' first: skipped as not part of the repository) and what would confuse a
    log line, a Redis key or a URL: backslashes, control and invisible characters.
    Names reach URLs percent-encoded, Redis keys as UTF-8 bytes, metric labels escaped,
    and ``--models`` lists escaped (``conch.settings``).
    """
    if not name.strip():
        return "it is empty"
    if name.startswith("."):
        return "it starts with '.'"
    if "/" in name:
        return "it holds '/'"
    bad = _bad_chars(name)
    if bad:
        return f"it holds {bad}"
    if len(name.encode("utf-8")) > MAX_SEGMENT_BYTES:
        return f"it is longer than {MAX_SEGMENT_BYTES} bytes"
    return None


def is_model_name(name: str) -> bool:
    return model_name_problem(name) is None


def classify(key: str) -> Place:
    """Check one relative key; raise ``RefusedKey`` if it may not be written."""
    if key == "":
        return Place(IGNORED, why="the repository prefix itself")
    if len(key) > MAX_KEY_CHARS:
        raise RefusedKey(key, f"longer than {MAX_KEY_CHARS} characters")
    bad = _bad_chars(key)
    if bad:
        raise RefusedKey(key, f"holds {bad}")
    if key.startswith("/"):
        raise RefusedKey(key, "is an absolute path")
    is_dir = key.endswith("/")
    segments = key[:-1].split("/") if is_dir else key.split("/")
    for seg in segments:
        if seg == "":
            raise RefusedKey(key, "has an empty path segment ('//')")
        if seg in (".", ".."):
            raise RefusedKey(key, f"has a '{seg}' path segment")
        if len(seg.encode("utf-8")) > MAX_SEGMENT_BYTES:
            raise RefusedKey(key, f"has a path segment longer than {MAX_SEGMENT_BYTES} bytes")
    model = segments[0]
    if len(segments) == 1:
        return Place(IGNORED, why="not inside a model folder")
    if model.startswith("."):
        return Place(IGNORED, why="hidden folder")
    problem = model_name_problem(model)
    if problem:
        raise RefusedKey(key, f"'{model}' is not a valid model name: {problem}")
    second, rest = segments[1], segments[2:]
    if VERSION_NAME.fullmatch(second):
        version = int(second)
        if not rest:
            if is_dir:
                return Place(VERSION_DIR, model, version)
            raise RefusedKey(key, f"a file named like version folder '{second}'")
        if is_dir:
            return Place(IGNORED, why="folder marker inside a version")
        if rest == [READY_MARKER]:
            return Place(READY, model, version)
        return Place(VERSION_FILE, model, version, "/".join(rest))
    if rest or is_dir:
        return Place(IGNORED, why=f"'{second}' is not a version folder")
    return Place(MODEL_FILE, model, None, second)


__all__ = [
    "IGNORED",
    "MODEL_FILE",
    "READY",
    "READY_MARKER",
    "VERSION_DIR",
    "VERSION_FILE",
    "Place",
    "RefusedKey",
    "classify",
    "is_model_name",
    "model_name_problem",
]
