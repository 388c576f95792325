"""A decoupled request's responses kept in Redis, and the lease that says someone reads them.

A client of a decoupled model may lose its connection in the middle of a stream. Triton
loses the stream with it; conch keeps the responses of a *kept* request (an SSE stream:
``InferMessage.keep_s``) in a Redis stream, ``conch.stream.<id>``, for that many seconds,
so that the client can come back, to the same gateway or another, and read exactly the
responses it had not yet received.

- The gateway writes the log's head when it queues the request: entry ``0-1``, with the
  model, version and the client's request id, so the log exists, and can be read, before
  the first response.
- The worker appends each response as it sends it, under the entry id
  ``<attempt>-<seq>``: the run of the request (its delivery) and the response's place in
  that run. Entry ids only grow, so a run that comes after a worker died writes after the
  dead run's responses, and a reader knows that the responses restart where the attempt
  changes. A run older than the log's newest entry cannot write at all (Redis refuses an
  id at or below the top): the log never holds two interleaved runs.
- An SSE event's id is its entry id (``Position``); ``Last-Event-ID`` names where a
  reconnecting reader resumes.

A *watched* request (``InferMessage.watched``: every gateway stream) has a lease key that
the gateways reading it keep alive (``hold``, refreshed well within its time to live).
When every reader is gone and the lease runs out, the request is cancelled: the model's
``is_cancelled()`` turns true, and a worker that admits it later drops it unrun. A gRPC
stream whose call is cancelled ends its lease at once (``release``); an SSE stream whose
client goes away lets it run out, which is the client's grace time to come back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from conch.wire.keys import STREAM_LEASE_SUFFIX, STREAM_PREFIX
from conch.wire.messages import BadMessage, Reply
from conch.wire.redis_link import CommandQueue

# The most responses one request's log keeps: past it the oldest go (approximately, as
# Redis trims), and a reader that resumes before the oldest kept one is refused.
MAX_KEPT = 100_000
_ID = re.compile(r"[0-9a-f]{32}")
_POSITION = re.compile(r"([0-9]{1,10})-([0-9]{1,19})")
_HEAD_ID = "0-1"


def is_stream_id(text: str) -> bool:
    """Whether ``text`` can name a stream: a request's message id (32 hex digits)."""
    return bool(_ID.fullmatch(text))


def log_key(stream_id: str) -> str:
    return STREAM_PREFIX + stream_id


def lease_key(stream_id: str) -> str:
    return STREAM_PREFIX + stream_id + STREAM_LEASE_SUFFIX


@dataclass(frozen=True, order=True)
class Position:
    """Where a response sits in its log: its run (``attempt``, from 1) and its ``seq``
    in that run. ``HEAD`` (0, 1) is before every response."""

    attempt: int
    seq: int

    @classmethod
    def parse(cls, text: str) -> Position:
        """An SSE ``Last-Event-ID``; ``ValueError`` when it is not one of ours."""
        m = _POSITION.fullmatch(text.strip())
        if m is None:
            raise ValueError(f"'{text[:64]}' is not a stream position (<attempt>-<seq>)")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.attempt}-{self.seq}"


HEAD = Position(0, 1)


def of(reply: Reply) -> Position:
    return Position(reply.attempt, reply.seq)


@dataclass(frozen=True)
class StreamHead:
    """What the gateway that queued the request wrote first: enough to answer a reader
    that reconnects elsewhere."""

    model: str
    version: int
    client_id: str  # the "id" the client gave its request
    deadline: float  # epoch seconds the request ends by; 0: none


@dataclass(frozen=True)
class Entry:
    """One response read back from a log."""

    position: Position
    reply: Reply


def open_log(pipe: CommandQueue, stream_id: str, head: StreamHead, keep_s: int) -> None:
    """Start the log of a kept request (queued on the publish's pipeline)."""
    fields = {
        "model": head.model,
        "version": str(head.version),
        "cid": head.client_id,
        "deadline": repr(head.deadline),
    }
    pipe.xadd(log_key(stream_id), fields, id=_HEAD_ID)
    pipe.expire(log_key(stream_id), keep_s)


def append(pipe: CommandQueue, stream_id: str, reply: Reply, keep_s: int) -> None:
    """Add one response; an older run's is refused by Redis (the module docstring)."""
    key = log_key(stream_id)
    pipe.xadd(key, {"r": reply.pack()}, id=str(of(reply)), maxlen=MAX_KEPT, approximate=True)
    pipe.expire(key, keep_s)


def head(client: redis.Redis, stream_id: str) -> StreamHead | None:
    """The log's head; None when there is no such log (never was, or expired)."""
    rows = client.xrange(log_key(stream_id), _HEAD_ID, _HEAD_ID, count=1)
    if not rows:
        return None
    fields = _fields(rows[0][1])
    try:
        return StreamHead(
            fields["model"],
            int(fields["version"]),
            fields.get("cid", ""),
            float(fields.get("deadline", "0")),
        )
    except (KeyError, ValueError):
        return None


def oldest(client: redis.Redis, stream_id: str) -> Position | None:
    """The first response still kept; None when there is none yet."""
    rows = client.xrange(log_key(stream_id), "1-0", "+", count=1)
    return _position(rows[0][0]) if rows else None


def holds(client: redis.Redis, stream_id: str, at: Position) -> bool:
    """Whether the log still holds a response at ``at``."""
    key = str(at)
    return bool(client.xrange(log_key(stream_id), key, key, count=1))


def read(
    client: redis.Redis, stream_id: str, after: Position, *, block_ms: int, count: int
) -> list[Entry]:
    """Up to ``count`` responses after ``after``, waiting up to ``block_ms`` for one."""
    got = client.xread({log_key(stream_id): str(after)}, count=count, block=block_ms)
    entries: list[Entry] = []
    for _key, rows in got or ():
        for entry_id, fields in rows:
            raw = _fields_raw(fields).get(b"r")
            if raw is None:
                continue  # the head
            try:
                entries.append(Entry(_position(entry_id), Reply.unpack(raw)))
            except (BadMessage, ValueError):
                continue  # not ours: skipped, never decoded further
    return entries


def hold(pipe: CommandQueue, stream_ids: Iterable[str], ttl_ms: int) -> None:
    """Keep the leases of ``stream_ids`` alive for ``ttl_ms`` more."""
    for stream_id in stream_ids:
        pipe.set(lease_key(stream_id), b"1", px=ttl_ms)


def release(pipe: CommandQueue, stream_id: str) -> None:
    """End a lease now: its request is cancelled."""
    pipe.delete(lease_key(stream_id))


def rejoin(client: redis.Redis, stream_id: str, ttl_ms: int) -> bool:
    """Hold the lease of a stream a reader comes back to, now; whether it was still
    alive (False: it lapsed, and the request was cancelled)."""
    pipe = client.pipeline(transaction=False)
    pipe.exists(lease_key(stream_id))
    hold(pipe, [stream_id], ttl_ms)
    return bool(pipe.execute()[0])


def held(client: redis.Redis, stream_ids: list[str]) -> list[bool]:
    """Whether each request's lease is alive (someone still reads it)."""
    if not stream_ids:
        return []
    pipe = client.pipeline(transaction=False)
    for stream_id in stream_ids:
        pipe.exists(lease_key(stream_id))
    return [bool(n) for n in pipe.execute()]


def _position(entry_id: Any) -> Position:
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return Position.parse(text)


def _fields_raw(fields: Any) -> dict[bytes, bytes]:
    if not isinstance(fields, dict):
        return {}
    return {
        (k.encode() if isinstance(k, str) else k): (v.encode() if isinstance(v, str) else v)
        for k, v in fields.items()
    }


def _fields(fields: Any) -> dict[str, str]:
    return {
        k.decode(errors="replace"): v.decode(errors="replace")
        for k, v in _fields_raw(fields).items()
        if isinstance(k, bytes) and isinstance(v, bytes)
    }
