"""A kept stream read back from its log: what a client that reconnects gets.

An SSE client whose connection dropped comes back, to any gateway, with the stream's id
and the id of the last event it received (``Last-Event-ID``). It gets exactly the
responses after that one: those the log already holds, then the rest as the worker
sends them, up to the final one (``conch.wire.stream_log``). Reading renews the stream's
lease, so the request is not cancelled while someone reads it.

Every check comes before anything is sent, each a 400 that says what to do: a stream id
that is not one, a stream that is unknown or expired, a ``Last-Event-ID`` that is not
one of the stream's events (or one its log no longer keeps). A run that replaced one
lost with its worker shows as a response marked ``restarted`` (``InferOutcome``), when
the client had received responses of the earlier run.
"""

from __future__ import annotations

import time

import redis

from conch.core.errors import Cancelled, InvalidArgument, Unavailable
from conch.core.inference import InferRequest
from conch.frontend.dataplane import DataPlane, InferOutcome
from conch.frontend.producer import Abandonment
from conch.frontend.stream_leases import MIN_TTL_S
from conch.wire import outage, stream_log
from conch.wire.stream_log import Position

READ_BLOCK_MS = 1000  # how long one read waits for a response (then the client is checked)
READ_COUNT = 256  # responses taken per read


class ResumedStream:
    """The responses of a kept stream after ``after``, as ``InferStream`` hands them
    out: iterate for ``InferOutcome``s; ``position`` is the last one's; ``close()``."""

    def __init__(
        self,
        plane: DataPlane,
        stream_id: str,
        head: stream_log.StreamHead,
        after: Position,
        abandonment: Abandonment,
    ) -> None:
        self._plane = plane
        self._client = plane.dispatcher.client
        self._id = stream_id
        self._head = head
        self._abandonment = abandonment
        self._target = plane.target(head.model, str(head.version) if head.version > 0 else "")
        self._request = InferRequest(
            id=head.client_id, inputs=[], outputs=None, binary_data_output=False, parameters={}
        )
        self._buffer: list[stream_log.Entry] = []
        self._over = False
        grace_s = max(plane.settings.stream_grace_s, MIN_TTL_S)
        self._lapsed = not stream_log.rejoin(self._client, stream_id, int(grace_s * 1000))
        self._grace_s = grace_s
        self._heard = time.monotonic()  # when the log last gave a response
        self.position = after
        self.message_id = stream_id
        self.kept = True
        plane.dispatcher.leases.add(stream_id, grace_s)

    def __iter__(self) -> ResumedStream:
        return self

    def __next__(self) -> InferOutcome:
        if self._over:
            raise StopIteration
        try:
            entry = self._next_entry()
        except BaseException:
            self.close()
            raise
        reply = entry.reply
        restarted = entry.position.attempt > self.position.attempt >= 1
        self.position = entry.position
        if reply.error is not None:
            self.close()
            raise reply.error
        if reply.final:
            self.close()
        version = reply.version if reply.version > 0 else self._head.version
        outcome = self._plane.outcome(
            self._target.entry, self._request, version, list(reply.outputs or ())
        )
        outcome.final = reply.final
        outcome.restarted = restarted
        return outcome

    def _next_entry(self) -> stream_log.Entry:
        while not self._buffer:
            gone = self._abandonment.gone
            if gone is not None:
                raise Cancelled(gone)
            deadline = self._head.deadline
            if deadline and time.time() > deadline:
                raise Unavailable(
                    f"Request timeout expired for model '{self._head.model}': its responses "
                    "did not end in time"
                )
            try:
                got = stream_log.read(
                    self._client, self._id, self.position, block_ms=READ_BLOCK_MS, count=READ_COUNT
                )
            except redis.RedisError as exc:
                raise outage.unavailable(exc) from None
            now = time.monotonic()
            if got:
                self._heard = now
            elif self._lapsed and now - self._heard > self._grace_s:
                # Cancelled before this reader came: its model may still end it, but
                # nothing came for a grace time.
                raise Cancelled(
                    f"stream '{self._id}' was cancelled: no client read it within its grace "
                    "time, and it sends no more"
                )
            self._buffer = got
        return self._buffer.pop(0)

    def close(self) -> None:
        if not self._over:
            self._over = True
            self._plane.dispatcher.leases.drop(self._id)


def resume(
    plane: DataPlane, stream_id: str, last_event_id: str, abandonment: Abandonment
) -> ResumedStream:
    """The kept stream ``stream_id`` after the event ``last_event_id`` ("" : from its
    start); every 400 about them is raised here."""
    if not stream_log.is_stream_id(stream_id):
        raise InvalidArgument(
            f"'{stream_id[:64]}' is not a stream id: use the id of the stream's "
            "Content-Location (32 hex digits)"
        )
    client = plane.dispatcher.client
    try:
        head = stream_log.head(client, stream_id)
        if head is None:
            raise InvalidArgument(
                f"stream '{stream_id}' is unknown or expired: streams are kept "
                f"--stream-keep-secs ({plane.settings.stream_keep_s} s here)"
            )
        after = stream_log.HEAD
        if last_event_id:
            try:
                after = Position.parse(last_event_id)
            except ValueError as exc:
                raise InvalidArgument(f"Last-Event-ID: {exc}") from None
            if not stream_log.holds(client, stream_id, after):
                raise InvalidArgument(
                    f"Last-Event-ID '{last_event_id.strip()}' is not an event of stream "
                    f"'{stream_id}' (or no longer kept): reconnect without it to read the "
                    "stream from its start"
                )
        return ResumedStream(plane, stream_id, head, after, abandonment)
    except redis.RedisError as exc:
        raise outage.unavailable(exc) from None
