"""Which requests the code running now is about, so that every log line can say so.

A gateway serves many requests at once (threads, greenlets) and a worker runs them in
batches, so the ids cannot be passed to every ``log`` call. They live in a context
variable instead: the code that takes a request on (the data plane's infer call, the
batcher's execution of a batch) enters ``about(...)`` for as long as it works on it, and
``conch.server_log`` stamps the ids on each record logged meanwhile. Context variables
follow threads, and greenlets too (greenlet >= 1.0 gives each its own context), so two
requests served side by side never see each other's ids.

A line about one request carries that request's ids; a line about a batch, every
request's, in batch order.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import NamedTuple


class RequestTag(NamedTuple):
    """One request's ids: the client's ``id`` ("" when it gave none), conch's own
    message id ("" until the request is queued) and its OpenTelemetry trace id ("" when
    it is not traced; ``conch.core.tracing``). A named tuple: two are made for every
    request a gateway takes, and a frozen dataclass costs several times as much."""

    request_id: str = ""
    conch_id: str = ""
    trace_id: str = ""


_CURRENT: ContextVar[tuple[RequestTag, ...]] = ContextVar("conch_requests", default=())


class about:
    """Log lines written inside the block are about these requests. A class rather than
    a generator: it is entered on every request's path, twice in a gateway's."""

    __slots__ = ("_tags", "_token")

    def __init__(self, *tags: RequestTag) -> None:
        self._tags = tags

    def __enter__(self) -> None:
        self._token = _CURRENT.set(self._tags)

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)


def current() -> tuple[RequestTag, ...]:
    """The requests the running code is about (none outside any ``about`` block)."""
    return _CURRENT.get()


__all__ = ["RequestTag", "about", "current"]
