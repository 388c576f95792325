"""A request whose caller went away while a worker runs it: the mark its model reads.

A frontend whose caller goes away (a cancelled gRPC call, an HTTP client that hung up)
takes the request's message back out of its queue if no worker has taken it
(``conch.frontend.producer``). If one has, the model is running it, and Triton's models
ask ``request.is_cancelled()`` to stop early. So the frontend leaves a mark,
``conch.cancel.<id>`` (the request's message id), and the worker reads it when the model
asks: at most every ``CHECK_S`` per request, and never again once it is there. A request
whose caller stays costs nothing: no key is written, and none is read unless the model
asks. The mark outlives the request's deadline by a little, or lasts ``MARK_TTL_S`` for
one without a deadline.

A decoupled model's watched requests have a lease instead (``conch.wire.stream_log``):
there the readers, not a single caller, decide when the request is cancelled.
"""

from __future__ import annotations

import time

import redis

from conch.wire.keys import CANCEL_PREFIX

CHECK_S = 0.5  # how stale a request's is_cancelled() may be
MARK_TTL_S = 3600  # a mark's life where its request has no deadline
_SLACK_S = 5  # and past the deadline of one that has


def key(request_id: str) -> str:
    return CANCEL_PREFIX + request_id


def mark(client: redis.Redis, request_id: str, deadline: float = 0.0) -> None:
    """Say that the request's caller went away (``deadline``: the request's, epoch s)."""
    ttl = MARK_TTL_S
    if deadline:
        ttl = max(1, min(MARK_TTL_S, int(deadline - time.time()) + _SLACK_S))
    client.set(key(request_id), b"1", ex=ttl)


class Check:
    """One running request's ``is_cancelled()``: whether its mark is there."""

    __slots__ = ("_cancelled", "_checked", "client", "request_id")

    def __init__(self, client: redis.Redis, request_id: str) -> None:
        self.client = client
        self.request_id = request_id
        self._cancelled = False
        self._checked = 0.0  # monotonic time of the last read

    def __call__(self) -> bool:
        if self._cancelled:
            return True
        now = time.monotonic()
        if now - self._checked >= CHECK_S:
            self._checked = now
            try:
                self._cancelled = bool(self.client.exists(key(self.request_id)))
            except redis.RedisError:
                return False  # unknown during an outage: keep going
        return self._cancelled


__all__ = ["CHECK_S", "MARK_TTL_S", "Check", "key", "mark"]
