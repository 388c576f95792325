"""The ``h2`` transport's threads: a call's thread is reused, not started for each call,
and ``Slots`` bounds the calls that run at once.

In ``conch grpc`` these threads are greenlets (the process is gevent-patched), where
starting one costs far more than waking one that waits: a new greenlet's frames need a
fresh stack of their own from the system, freed again when it ends. So a thread that has
run its function waits for the next one (``spawn``), and a few are kept waiting however
many calls come and go. Each function runs in an empty ``contextvars`` context, as on a
new thread, so that nothing one call set is seen by the next.

``Slots`` is ``threading.BoundedSemaphore`` as the connections use it (``with slots:``),
on one lock instead of a condition's several: taken and given back once per unary call.
Those waiting for a slot get one in the order they came.

Written against the standard library's ``_thread``, never gevent's API (see
``h2_connection``); the unit tests run it on real threads.
"""

from __future__ import annotations

import _thread
import collections
import contextvars
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# Threads kept waiting for work; one that finds this many already waiting ends instead.
KEEP_IDLE = 256


class _Parked:
    """A thread waiting for its next function: ``wake`` is released once ``job`` is set."""

    __slots__ = ("job", "wake")

    def __init__(self) -> None:
        self.wake = _thread.allocate_lock()
        self.wake.acquire()  # held: the thread blocks on it until woken
        self.job: tuple[Callable[..., Any], tuple[Any, ...]] | None = None


_idle: list[_Parked] = []


def spawn(function: Callable[..., Any], *args: Any) -> None:
    """``function(*args)`` on a thread of its own: one that waits, else a new one."""
    try:
        parked = _idle.pop()
    except IndexError:
        _thread.start_new_thread(_serve, (function, args))
        return
    parked.job = (function, args)
    parked.wake.release()


def _serve(function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """A thread's life: run its function, then wait for the next, until enough wait."""
    parked: _Parked | None = None
    while True:
        try:
            contextvars.Context().run(function, *args)
        except Exception:
            log.exception("a gRPC transport thread failed")
        if len(_idle) >= KEEP_IDLE:
            return
        if parked is None:
            parked = _Parked()
        _idle.append(parked)
        parked.wake.acquire()
        assert parked.job is not None
        (function, args), parked.job = parked.job, None


class Slots:
    """At most ``size`` holders at once (``with slots:``); the rest wait, first come first
    served, and one that leaves hands its slot straight to the next."""

    __slots__ = ("_free", "_lock", "_waiting")

    def __init__(self, size: int) -> None:
        self._free = size
        self._lock = _thread.allocate_lock()
        self._waiting: collections.deque[Any] = collections.deque()

    def __enter__(self) -> Slots:
        with self._lock:
            if self._free:
                self._free -= 1
                return self
            wake = _thread.allocate_lock()
            wake.acquire()
            self._waiting.append(wake)
        wake.acquire()  # released by the holder that gave its slot to this one
        return self

    def __exit__(self, *_exc: object) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.popleft().release()
            else:
                self._free += 1


__all__ = ["KEEP_IDLE", "Slots", "spawn"]
