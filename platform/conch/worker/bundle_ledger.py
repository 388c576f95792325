"""When a message is done with: at once for one request, at its last request for a bundle.

A bundle (``conch.wire.broker``) carries several requests under one delivery tag, and its
requests may end apart: some dropped at admission, some in one batch, some carried to the
next, some handed back. Its tag is acked, and let go of by the heartbeat, only once every
one of them is settled: before that, a worker that dies must leave the whole bundle in
flight, for the visibility timeout to bring back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol


class Settling(Protocol):
    """A request that ends: the tag of its message, and whether that message is a bundle."""

    @property
    def tag(self) -> str: ...

    @property
    def bundled(self) -> bool: ...


class BundleLedger:
    """The bundles one drain loop holds, each with its count of unsettled requests.

    Used by its loop's thread (admission, batch forming and replies run there), and by
    the threads a decoupled model sends its final responses from (``conch.worker.streams``):
    hence the lock.
    """

    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def open(self, tag: str, requests: int) -> None:
        """A bundle of ``requests`` was admitted (twice, if the visibility timeout brought
        it back while this loop still held it: then both copies settle first)."""
        with self._lock:
            self._open[tag] = self._open.get(tag, 0) + requests

    def settle(self, ended: Iterable[Settling]) -> list[str]:
        """The tags of the messages that the requests ``ended`` leave with nothing
        unsettled, each once, in order: what to ack."""
        out: dict[str, None] = {}
        with self._lock:
            for request in ended:
                if not request.bundled:
                    out[request.tag] = None
                    continue
                left = self._open.get(request.tag, 1) - 1
                if left > 0:
                    self._open[request.tag] = left
                else:
                    self._open.pop(request.tag, None)
                    out[request.tag] = None
        return list(out)

    def forget(self, tags: Iterable[str]) -> None:
        """Let go of these bundles unsettled (Redis failed mid-admission: they stay in
        flight in Redis, and come back whole)."""
        with self._lock:
            for tag in tags:
                self._open.pop(tag, None)

    def __len__(self) -> int:
        return len(self._open)
