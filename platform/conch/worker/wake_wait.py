"""A wait on wake lists shorter than Redis's clock tick lets a BLPOP time: a batch waiting
out its queue delay for more requests (``Drain.wait``) or more sequence heads
(``SequenceBatcher``), ended the moment a wake token comes, with no poll.

Redis times a blocked command out on its clock tick (100 ms at the default ``hz 10``), so
a wait of a few ticks is a BLPOP on a connection of its own (``PendingReply``), waited for
here as long as asked. When that time passes first, the BLPOP stays pending in Redis,
where it could take a token another instance should get, until Redis's own timeout ends
it a few ticks later, or sooner the ``CLIENT UNBLOCK`` that ``unblock`` gives the caller
to send with its next commands.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis

from conch.core import timeline
from conch.wire.redis_link import PendingReply

REDIS_TICK_S = 0.1  # a blocking command's timeout may overrun by this much


class WakeWait:
    """Short waits on wake lists, one pending BLPOP at a time, on a connection named
    ``name`` (CLIENT LIST shows it)."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self._reply = PendingReply(client, name)
        self._lapsed = False  # the last wait ended at its own time, its BLPOP pending

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        """Block until a token comes on one of ``keys`` (True: something was queued), or
        ``timeout`` seconds pass (False: nothing was). A BLPOP still pending from an earlier
        wait is read first: its token, if one came meanwhile, counts."""
        if timeout <= 0:
            return False
        reply, until = self._reply, time.monotonic() + timeout
        while True:
            if not reply.pending:
                self._lapsed = False
                # Redis ends it itself a few ticks after the wait would, at the latest.
                reply.send(("BLPOP", *keys, round(timeout + 3 * REDIS_TICK_S, 3)))
            came, got = reply.receive(until - time.monotonic())
            if not came:
                self._lapsed = True
                return False
            if got is not None:  # a token (or an error, which the caller's next step meets)
                timeline.stamp("worker.woke")
                return True
            if time.monotonic() >= until:  # ended by Redis, or by an unblock: none came
                return False

    def unblock(self) -> list[tuple]:
        """The command that ends a lapsed wait's BLPOP, for the caller to send with its
        next ones (its reply, nil, is read by the next wait); none when none is pending."""
        if not (self._lapsed and self._reply.pending):
            return []
        self._lapsed = False
        return [("CLIENT", "UNBLOCK", self._reply.client_id)]
