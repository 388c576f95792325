"""Triton's ``preserve_ordering``: replies released in the order their requests were popped."""

from __future__ import annotations

import threading


class Sequencer:
    """Releases replies in the order their requests were popped (``preserve_ordering``).

    Shared by one model's batchers in a worker: each pop takes consecutive tickets under
    ``lock``, and a batch sends each reply only once every earlier ticket is finished.
    Ordering holds within a worker, as Triton's holds within a server.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._cond = threading.Condition()
        self._issued = 0
        self._next = 0
        self._finished: set[int] = set()

    def issue(self, n: int) -> int:
        """First of ``n`` new tickets; call with ``lock`` held, around the pop."""
        first, self._issued = self._issued, self._issued + n
        return first

    def wait_turn(self, ticket: int) -> None:
        with self._cond:
            while self._next != ticket:
                self._cond.wait(0.5)

    def finish(self, ticket: int) -> None:
        with self._cond:
            self._finished.add(ticket)
            while self._next in self._finished:
                self._finished.remove(self._next)
                self._next += 1
            self._cond.notify_all()
