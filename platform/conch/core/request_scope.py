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

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestTag:
    """One request's ids: the client's ``id`` ("" when it gave none), conch's own
    message id ("" until the request is queued) and its OpenTelemetry trace id ("" when
    it is not traced; ``conch.core.tracing``)."""

    request_id: str = ""
    conch_id: str = ""
    trace_id: str = ""


_CURRENT: ContextVar[tuple[RequestTag, ...]] = ContextVar("conch_requests", default=())


@contextmanager
def about(*tags: RequestTag) -> Iterator[None]:
    """Log lines written inside the block are about these requests."""
    token = _CURRENT.set(tags)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> tuple[RequestTag, ...]:
    """The requests the running code is about (none outside any ``about`` block)."""
    return _CURRENT.get()


__all__ = ["RequestTag", "about", "current"]
