"""A decoupled model's responses, each sent as the model makes it, and its requests that
are still streaming after their batch returned.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers a request
with any number of responses, from ``execute`` or from threads it starts, until one comes
with the final flag. The runner gives each of its requests a ``Stream`` (the backend's
``Responder``): every ``send`` hands one ``Reply`` for the request's reply list to the
drain loop's ``Outbox`` at once, from whatever thread calls it, numbered from 0
(``seq``), the last one ``final``; the outbox's thread sends it with whatever else was
sent meanwhile, in order (``stream_outbox``). An error ends the request. The request's message is acked, and let go of by the heartbeat,
only with its final response, so a worker that dies mid-stream leaves it in flight for
the visibility timeout to bring back.

``Streams`` holds one drain loop's requests still streaming. A request that never gets
its final response is ended with an error (and the error logged) once its deadline
passes, or, for a request without one, after ``IDLE_S`` with no response; requests still
open when the drain loop stops get ``STOP_GRACE_S`` to end before the same. A response
sent after the final one is logged and dropped. An execution's statistics are recorded
once, when its last request ends (``StreamGroup``).

Each reply carries the request's run (``Reply.attempt``: its delivery), so that a caller
told the responses of a run that a dead worker left unfinished drops them when the next
run's come. A kept request's replies are also appended to its log
(``conch.wire.stream_log``), for a client that reconnects. A watched request is cancelled
once its lease lapses (every reader gone): ``is_cancelled`` asks Redis at most every
``CANCEL_CHECK_S``, and stays true once true. A collected request (an async job, a batch
job's line) is answered once, at its end, with every response: a run lost with its worker
never leaves half an answer.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import redis

from conch.backends import BackendResult
from conch.core import tensors
from conch.core.errors import ConchError, Internal, Unavailable
from conch.wire import statistics, stream_log
from conch.wire.messages import MAX_COLLECTED, Reply, WireTensor
from conch.wire.redis_link import Commands
from conch.worker.admission import Item
from conch.worker.drain import ack
from conch.worker.loop_parts import QueueParts
from conch.worker.stream_outbox import Outbox, Parcel

log = logging.getLogger(__name__)

IDLE_S = 300.0  # a request without a deadline ends this long after its last response
STOP_GRACE_S = 10.0  # how long a stopping drain loop waits for its streams to end
CANCEL_CHECK_S = 0.5  # how stale a watched request's is_cancelled() may be
MAX_COLLECTED_BYTES = 64 * 1024 * 1024  # a collected request's answer, in tensor bytes


@dataclass(eq=False)
class StreamGroup:
    """One execution of a decoupled model, and its statistics: recorded once, with the
    final response of the last of its requests to end (or with the batch's replies, if
    they all ended before ``execute`` returned)."""

    run: statistics.Execution
    open: int  # its requests not ended yet
    returned: bool = False  # execute returned: the phases are in ``run``
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ended(self, item: Item, took_ns: int, first_ns: int, queue_ns: int, failed: bool) -> bool:
        """Count a request that ended; whether the execution is now ready to record."""
        with self.lock:
            run = self.run
            if failed:
                run.failed(statistics.BACKEND, took_ns)
            else:
                run.success += 1
                run.rows += item.rows
                run.success_ns += took_ns
                run.queue_ns += queue_ns
                run.responses_ns.append(first_ns)  # the time to its first response
                run.queues_ns.append(queue_ns)
            self.open -= 1
            return self.open == 0 and self.returned

    def execute_returned(self, phases: tuple[int, int, int]) -> bool:
        """``execute`` returned after ``phases``; whether every request had ended by then
        (the runner records the execution with the batch's replies)."""
        with self.lock:
            self.run.input_ns, self.run.infer_ns, self.run.output_ns = phases
            self.returned = True
            return self.open == 0


class Stream:
    """One request of a decoupled model: the ``Responder`` its backend sends through."""

    def __init__(
        self, streams: Streams, item: Item, version: int, started: float, group: StreamGroup
    ) -> None:
        self.streams = streams
        self.item = item
        self.version = version
        self.group = group
        self.queue_ns = max(0, int((started - item.msg.enqueued) * 1e9))
        self.seq = 0
        self.ended = False
        self.first_ns = 0
        self.last_sent = time.monotonic()
        self.lock = threading.Lock()  # one send at a time, so replies leave in order
        self._cancelled = False
        self._checked = 0.0  # monotonic time of the last lease check
        self.collected: list[list[WireTensor]] = []  # a collected request's responses so far
        self.collected_bytes = 0

    def is_cancelled(self) -> bool:
        """Whether everyone reading this request went away (its lease lapsed)."""
        msg = self.item.msg
        if self._cancelled or not msg.watched:
            return self._cancelled
        now = time.monotonic()
        if now - self._checked >= CANCEL_CHECK_S:
            self._checked = now
            try:
                self._cancelled = not stream_log.held(self.streams.parts.sink.client, [msg.id])[0]
            except redis.RedisError:
                return False  # unknown during an outage: keep going
        return self._cancelled

    def send(self, result: BackendResult | None, final: bool) -> None:
        with self.lock:
            if self.ended:
                log.error(
                    "%s: model '%s' sent a response for request '%s' after its final one; dropped",
                    self.streams.parts.name,
                    self.streams.parts.model,
                    self.item.msg.id,
                )
                return
            self._send(self._reply(result, final))

    def fail(self, error: ConchError) -> None:
        """End the request with ``error``, unless it ended already."""
        with self.lock:
            if not self.ended:
                self._send(self._reply(error, True))

    def _reply(self, result: BackendResult | None, final: bool) -> Reply:
        msg = self.item.msg
        attempt = self.item.attempts
        if isinstance(result, ConchError):
            return Reply(msg.id, error=result, seq=self.seq, version=self.version, attempt=attempt)
        try:
            outputs = (
                tensors.named_outputs(result, msg.outputs, self.streams.output_types)
                if result
                else []
            )
        except Exception as exc:
            bad = Internal(f"model '{self.streams.parts.model}' returned a bad output: {exc}")
            return Reply(msg.id, error=bad, seq=self.seq, version=self.version, attempt=attempt)
        return Reply(
            msg.id,
            outputs=outputs,
            timing={"queue": self.queue_ns},
            batch_size=self.group.run.batch_size,
            version=self.version,
            final=final,
            seq=self.seq,
            attempt=attempt,
        )

    def _collect(self, reply: Reply) -> Reply | None:
        """A collected request's reply (``InferMessage.collect``): held, and None, until
        the last; then the one answer with every response (an error ends it as it would
        a stream). Past ``MAX_COLLECTED`` responses or ``MAX_COLLECTED_BYTES`` it ends
        with an error: the answer must fit in one message."""
        if reply.error is not None:
            return reply
        if reply.outputs or not reply.final:  # an empty final response is only a flag
            self.collected.append(list(reply.outputs or ()))
            self.collected_bytes += sum(len(t.raw) for t in reply.outputs or ())
        if len(self.collected) > MAX_COLLECTED or self.collected_bytes > MAX_COLLECTED_BYTES:
            return Reply(
                reply.id,
                error=Internal(
                    f"model '{self.streams.parts.model}' sent more than {MAX_COLLECTED} responses "
                    f"or {MAX_COLLECTED_BYTES} bytes for request '{reply.id}', more than an "
                    "async or batch job's answer holds: stream it instead"
                ),
                attempt=reply.attempt,
            )
        if not reply.final:
            return None
        return Reply(
            reply.id,
            responses=self.collected,
            timing=reply.timing,
            batch_size=reply.batch_size,
            version=reply.version,
            attempt=reply.attempt,
        )

    def _send(self, reply: Reply) -> None:
        took = max(0, int((time.time() - self.item.msg.enqueued) * 1e9))
        if self.seq == 0:
            self.first_ns = took
        self.seq += 1
        self.last_sent = time.monotonic()
        msg = self.item.msg
        if msg.collect:
            collected = self._collect(reply)
            if collected is None:
                return  # held for the answer at the end
            reply = collected
        final = reply.final or reply.error is not None
        self.ended = final
        streams = self.streams
        pipe = Commands()
        streams.parts.sink.deliver(pipe, msg, reply)
        if msg.keep_s:
            stream_log.append(pipe, msg.id, reply, msg.keep_s)
        tags: list[str] = []
        if final:
            ready = self.group.ended(
                self.item, took, self.first_ns, self.queue_ns, reply.error is not None
            )
            if ready:
                now_ms = int(time.time() * 1000)
                statistics.record(
                    pipe, streams.parts.model, self.group.run, now_ms, samples=streams.parts.samples
                )
            tags = streams.settle(self.item)
            ack(pipe, streams.parts.drain.queue, tags)

        def let_go() -> None:  # sent, or given up (for the visibility timeout to bring back)
            streams.parts.inflight.discard(tags)
            streams.closed(self)

        streams.outbox.put(Parcel(pipe, msg.id, let_go if final else None))


class Streams:
    """One drain loop's decoupled requests: opened by its runner, ended by their final
    responses (from any thread), by ``reap`` or by ``stop``."""

    def __init__(self, parts: QueueParts, *, output_types: dict[str, str]) -> None:
        self.parts = parts
        self.output_types = output_types
        self._open: dict[int, Stream] = {}
        self._changed = threading.Condition()
        self.outbox = Outbox(parts.sink, parts.stopping, parts.name)

    def open(self, item: Item, version: int, started: float, group: StreamGroup) -> Stream:
        stream = Stream(self, item, version, started, group)
        with self._changed:
            self._open[id(stream)] = stream
        return stream

    def closed(self, stream: Stream) -> None:
        with self._changed:
            self._open.pop(id(stream), None)
            self._changed.notify_all()

    def settle(self, item: Item) -> list[str]:
        """The tags to ack now that ``item`` ended (a bundle's once its last one has)."""
        return self.parts.ledger.settle([item])

    def __len__(self) -> int:
        with self._changed:
            return len(self._open)

    def reap(self, now: float | None = None) -> None:
        """End, with an error, the requests whose model sent no final response in time:
        by their deadline, or for one without, ``IDLE_S`` after their last response."""
        if not self._open:
            return
        now = time.time() if now is None else now
        idle_since = time.monotonic() - IDLE_S
        with self._changed:
            streams = list(self._open.values())
        for stream in streams:
            deadline = stream.item.msg.deadline
            if (deadline and now > deadline) or (not deadline and stream.last_sent < idle_since):
                why = "before its deadline" if deadline else f"within {IDLE_S:.0f} s of its last"
                self._abandon(stream, why, Internal)

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Wait up to ``grace`` for the open requests to end; end the rest with an error."""
        until = time.monotonic() + grace
        with self._changed:
            while self._open and time.monotonic() < until:
                self._changed.wait(until - time.monotonic())
            streams = list(self._open.values())
        for stream in streams:
            self._abandon(stream, "before the model stopped serving", Unavailable)
        self.outbox.drained(grace)

    def _abandon(self, stream: Stream, why: str, kind: type[ConchError]) -> None:
        message = (
            f"model '{self.parts.model}' sent no final response (TRITONSERVER_RESPONSE_COMPLETE_FINAL) "
            f"for request '{stream.item.msg.id}' {why}"
        )
        log.error("%s: %s; ending it with an error", self.parts.name, message)
        stream.fail(kind(message))
