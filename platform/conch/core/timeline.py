"""Hand-off stamps: when each thread and process took a request up and handed it on.

``bench/timeline.py`` follows one request at a time through the gateway, Redis and the
worker. The places where a request changes hands call ``stamp(point)``; the tool merges
every process's stamps into one timeline (bench/README.md, "bench/timeline.py").

Stamping is off unless the environment names a folder (``CONCH_TIMELINE_DIR``), and
then costs a clock read and a record written into memory. The variable is read here, by
the instrument itself, and not through ``conch.settings``: it is no setting of the
server, and every process that handles a request (gunicorn's forked workers, Celery's
worker, process instances) inherits it without each role passing it on.

Each process writes its own file, ``<folder>/<pid>.stamps``: fixed-size records in a
memory-mapped file, so a process killed without warning keeps what it stamped and a
stamp makes no system call. A record holds the point's name, the time on
``CLOCK_MONOTONIC`` (one clock for every process on a host, so the files merge) and the
thread (under gevent, the greenlet) that stamped it.
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "CONCH_TIMELINE_DIR"
RECORD = struct.Struct("<qQ24s")  # monotonic ns, thread ident, point (ASCII, padded)
CAPACITY = 1 << 18  # records a process keeps; later stamps are dropped
SUFFIX = ".stamps"

_folder = os.environ.get(ENV, "")


@dataclass(frozen=True, slots=True)
class Stamp:
    """One record read back: which process and thread reached ``point``, and when."""

    pid: int
    ns: int  # CLOCK_MONOTONIC, nanoseconds
    thread: int
    point: str


class _Book:
    """This process's file of records, mapped, and where the next record goes."""

    def __init__(self, folder: str) -> None:
        path = Path(folder) / f"{os.getpid()}{SUFFIX}"
        with open(path, "w+b") as f:
            f.truncate(CAPACITY * RECORD.size)  # sparse: pages are written as stamps come
            self.map = mmap.mmap(f.fileno(), CAPACITY * RECORD.size)
        self.count = itertools.count()  # next() is atomic under the GIL


_book: _Book | None = None
_opening = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child writes a file of its own, never into its parent's mapping."""
    global _book, _opening
    _book, _opening = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def stamp(point: str) -> None:
    """Record that this thread reached ``point`` now (nothing when stamping is off)."""
    if _folder:
        _record(point, time.monotonic_ns())


def _record(point: str, ns: int) -> None:
    global _book
    book = _book
    if book is None:
        with _opening:
            if _book is None:
                _book = _Book(_folder)
            book = _book
    i = next(book.count)
    if i < CAPACITY:
        RECORD.pack_into(book.map, i * RECORD.size, ns, threading.get_ident(), point.encode())


def read(path: Path) -> list[Stamp]:
    """The records of one process's file (``<pid>.stamps``), in the order stamped."""
    pid = int(path.name.removesuffix(SUFFIX))
    data = path.read_bytes()
    out: list[Stamp] = []
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        ns, thread, name = RECORD.unpack_from(data, offset)
        if ns == 0:  # past the last record written (sparse zeros)
            break
        out.append(Stamp(pid, ns, thread, name.rstrip(b"\0").decode("ascii", "replace")))
    return out
