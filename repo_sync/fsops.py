"""Atomic file-system steps: readers of the cache see the old state or the new, never a mix.

A folder is swapped with ``renameat2(RENAME_EXCHANGE)`` where Linux and the file system
offer it (one atomic step); elsewhere the old folder is renamed aside, then the new one
renamed in. Either way a version folder is never seen half-written. The old copy is left
in the scratch folder for the caller to delete (after a grace period: a reader may have
opened it just before the swap). No symbolic link is ever created, and files are opened
with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _renameat2: Any = _libc.renameat2
    _renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    _renameat2.restype = ctypes.c_int
except (OSError, AttributeError, TypeError):
    _renameat2 = None


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False where the system cannot."""
    if _renameat2 is None:
        return False
    rc = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def unique(folder: Path, stem: str) -> Path:
    return folder / f"{stem}.{uuid.uuid4().hex[:12]}"


def remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def set_aside(path: Path, scratch: Path) -> Path:
    """Take ``path`` away atomically (a rename into ``scratch``); returns where it went."""
    aside = unique(scratch, "old")
    os.rename(path, aside)
    return aside


def put_dir(new: Path, target: Path, scratch: Path) -> Path | None:
    """Move the folder ``new`` to ``target`` atomically, replacing whatever is there.

    Returns where the replaced content now is (inside ``scratch``, for the caller to
    delete), or None when ``target`` did not exist."""
    if not target.exists() and not target.is_symlink():
        os.rename(new, target)
        return None
    if exchange(new, target):
        return new  # now holds the old content
    aside = set_aside(target, scratch)
    os.rename(new, target)
    return aside


def new_file(path: Path) -> int:
    """Create a file that must not exist yet, never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)


def put_file(data: bytes, target: Path, scratch: Path) -> None:
    """Write ``target`` atomically: a temporary file in ``scratch``, then ``os.replace``."""
    tmp = unique(scratch, "file")
    fd = new_file(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)


def put_json(obj: Any, target: Path, scratch: Path) -> None:
    tmp = unique(scratch, "json")
    fd = new_file(tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)


def link_or_copy(src: Path, dest: Path) -> None:
    """Reuse an unchanged file of the current version: a hard link, else a copy."""
    try:
        os.link(src, dest, follow_symlinks=False)
    except OSError:
        fd = new_file(dest)
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out, 1 << 20)


def within(root: Path, rel: str) -> Path:
    """``root/rel`` for an already-checked relative key; refuses anything outside ``root``."""
    segments = rel.split("/")
    if any(seg in ("", ".", "..") for seg in segments):
        raise ValueError(f"{rel!r} is not a plain relative path")
    path = root.joinpath(*segments)
    base = os.path.normpath(root)
    if os.path.commonpath([base, os.path.normpath(path)]) != base or path == root:
        raise ValueError(f"{rel!r} is not inside {root}")
    return path
