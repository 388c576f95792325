"""A process's copy of something kept elsewhere (the workers' reports, the traffic splits,
in Redis), read again ahead of its age so that no request waits for the read.

A copy older than half its ``max_age_s`` is still given out, and one background thread
reads it again meanwhile; only a copy older than ``max_age_s`` (never read, the process
just started, the background reads keep failing) is read by the request that finds it
so, as before. A steady flow of requests thus never pays a round trip for it, and an
idle process reads nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class ReadAhead(Generic[T]):
    """``read``'s value, at most ``max_age_s`` old, read again once half that old by a
    background thread (``name``), or by the caller once older than ``max_age_s``: what
    ``read`` raises then is the caller's. A background read that fails leaves the copy
    to age."""

    def __init__(self, read: Callable[[], T], initial: T, max_age_s: float, *, name: str):
        self._read = read
        self._value = initial
        self.max_age_s = max_age_s
        self._name = name
        self._read_at = float("-inf")  # monotonic time the copy was read
        self._lock = threading.Lock()  # one inline read at a time
        self._reading = False  # a background read is under way
        self._generation = 0  # bumped by invalidate: a read begun before it is not kept

    def get(self, max_age_s: float | None = None) -> T:
        """The copy; ``max_age_s``: a caller's own, stricter bound (read inline past it,
        never ahead)."""
        limit = self.max_age_s if max_age_s is None else max_age_s
        age = time.monotonic() - self._read_at
        if age > limit:
            with self._lock:
                if time.monotonic() - self._read_at > limit:
                    generation = self._generation
                    self._store(self._read(), generation)
        elif max_age_s is None and age > limit / 2 and not self._reading:
            self._reading = True
            threading.Thread(target=self._read_behind, name=self._name, daemon=True).start()
        return self._value

    @property
    def current(self) -> T:
        """The copy as it is, read or not (for a ``read`` that keeps it when it fails)."""
        return self._value

    def invalidate(self) -> None:
        """Read again on the next ``get`` (this process just changed what it copies)."""
        self._generation += 1
        self._read_at = float("-inf")

    def _store(self, value: T, generation: int) -> None:
        if generation == self._generation:
            self._value, self._read_at = value, time.monotonic()

    def _read_behind(self) -> None:
        generation = self._generation
        try:
            value = self._read()
        except Exception as exc:  # the copy ages; a request reads it itself once too old
            log.debug("%s: not read again (%r); the copy ages", self._name, exc)
        else:
            with self._lock:
                self._store(value, generation)
        finally:
            self._reading = False
