"""A worker's admission: each popped message becomes a batch item, or is dealt with here.

A message is decoded, then checked in this order: its deadline (passed: dropped, or a
job's result says why), its queue policy's timeout (Triton's REJECT answers it, DELAY puts
it back behind the requests still in time), its deliveries (past ``max_attempts``:
dead-lettered), and whether its caller cancelled it while it waited. What is dealt with is
acked in one round trip, with the statistics of the requests that failed; the rest are
``Item``s for a batch. The gateway's half of Triton's queue policy (which priority step,
which timeout) is ``conch.frontend.admission``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from conch.backends import Backend
from conch.core import tracing
from conch.core.errors import Internal, Unavailable
from conch.core.request_scope import RequestTag, about
from conch.wire import broker, statistics
from conch.wire.messages import BadMessage, InferMessage, Reply
from conch.worker.drain import Drain, Popped, ack, dead_letter, requeue
from conch.worker.in_flight import InFlight
from conch.worker.replies import ReplySink
from conch.worker.reply_order import Sequencer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Item:
    """A request admitted to a batch."""

    tag: str  # the delivery tag of its message
    msg: InferMessage
    rows: int  # its first input's first dimension when the model batches, else 1
    attempts: int
    ticket: int | None = None  # pop order, when the model preserves ordering


def request_tag(msg: InferMessage) -> RequestTag:
    """The ids a log line about ``msg``'s request names."""
    return RequestTag(msg.client_id, msg.id, tracing.trace_id(msg.traceparent))


@dataclass(eq=False, kw_only=True)
class Admission:
    """Admits one drain loop's popped messages (``admit``).

    ``batching``: the model batches dynamically, so a request's rows are its first input's
    first dimension (else each counts as one). ``backends`` names the versions served, for
    the statistics of requests that fail here without naming one. With a ``sequencer``, a
    message dealt with here finishes its ticket.
    """

    client: redis.Redis
    model: str
    backends: dict[int, Backend]
    batching: bool
    drain: Drain
    sink: ReplySink
    inflight: InFlight
    sequencer: Sequencer | None
    max_attempts: int
    name: str  # the drain loop's, for its log lines

    def admit(self, popped: list[Popped], first_ticket: int | None = None) -> list[Item]:
        """``popped`` as batch items (with tickets from ``first_ticket`` on, in pop order,
        when the model preserves ordering); the messages dealt with here are acked."""
        if not popped:
            return []
        self.inflight.add([p.tag for p in popped])
        try:
            return self._admit_popped(popped, first_ticket)
        except BaseException:
            # Redis went away mid-admission: let go of all of them. They stay in flight in
            # Redis, where the visibility timeout brings them back to run (none has run).
            self.inflight.discard([p.tag for p in popped])
            if self.sequencer is not None and first_ticket is not None:
                for ticket in range(first_ticket, first_ticket + len(popped)):
                    self.sequencer.finish(ticket)
            raise

    def _admit_popped(self, popped: list[Popped], first_ticket: int | None) -> list[Item]:
        items: list[Item] = []
        now = time.time()
        pipe = self.client.pipeline(transaction=True)  # requeue and ack go together
        done: list[tuple[str, int | None]] = []  # (tag, ticket)
        failed: list[tuple[str, InferMessage]] = []  # (Triton's reason, request)
        for k, p in enumerate(popped):
            ticket = None if first_ticket is None else first_ticket + k
            item = self._admit(pipe, now, p, failed)
            if item is None:
                done.append((p.tag, ticket))
            else:
                item.ticket = ticket
                items.append(item)
        redelivered = sum(1 for p in popped if p.attempts > 1)
        if redelivered:  # came back after the worker that held them went away
            statistics.count_model(pipe, self.model, statistics.REDELIVERED, redelivered)
        gone = self.sink.cancelled(i.msg for i in items)
        if gone:  # cancelled while queued: never run
            done += [(i.tag, i.ticket) for i in items if i.msg.id in gone]
            failed += [(statistics.CANCELED, i.msg) for i in items if i.msg.id in gone]
            items = [i for i in items if i.msg.id not in gone]
        if done or redelivered:
            self._record_failures(pipe, now, failed)
            ack(pipe, self.drain.queue, [tag for tag, _ in done])
            pipe.execute()
            self.inflight.discard([tag for tag, _ in done])
            if self.sequencer is not None:
                for _, ticket in done:
                    self.sequencer.finish(ticket)
        return items

    def _admit(
        self,
        pipe: redis.client.Pipeline,
        now: float,
        popped: Popped,
        failed: list[tuple[str, InferMessage]],
    ) -> Item | None:
        """The popped message as a batch item, or None once it is dealt with here (a
        request that failed here is added to ``failed``, with Triton's reason)."""
        tag, raw, attempts = popped.tag, popped.raw, popped.attempts
        try:
            _, payload, _ = broker.decode(raw)
            msg = InferMessage.from_dict(payload)
        except BadMessage as exc:
            log.error("%s: dead-lettering message %s: %s", self.name, tag, exc)
            dead_letter(pipe, self.model, tag, raw, str(exc))
            return None
        if msg.deadline and now > msg.deadline:
            with about(request_tag(msg)):
                log.info("%s: dropping a request: its deadline passed in the queue", self.name)
            failed.append((statistics.REJECTED, msg))
            if msg.job_ttl:  # nobody waits on a job: its result says why it never ran
                error = Unavailable(
                    f"Request timeout expired: the job waited in the queue of model "
                    f"'{self.model}' past its 'timeout' of {msg.timeout_us} us"
                )
                self.sink.deliver(pipe, msg, Reply(msg.id, error=error))
            return None
        if msg.queue_deadline and now > msg.queue_deadline and not msg.delayed:
            if msg.delay_on_timeout:
                # Triton's DELAY: behind every request still in time, not dropped.
                msg.delayed = True
                requeue(
                    pipe,
                    self.drain.queue,
                    msg.to_dict(),
                    tag=tag,
                    priority=broker.ONLINE_STEPS - 1,
                    reply_to=msg.reply_to,
                    head=False,
                )
            else:
                error = Unavailable(
                    f"Request timeout expired: the request waited longer than the queue policy "
                    f"of model '{self.model}' allows"
                )
                self.sink.deliver(pipe, msg, Reply(msg.id, error=error))
                failed.append((statistics.REJECTED, msg))
            return None
        if attempts > self.max_attempts:
            reason = (
                f"request for model '{self.model}' was dead-lettered after {attempts - 1} "
                f"attempts: each one ended with its worker dying"
            )
            with about(request_tag(msg)):
                log.error("%s: %s", self.name, reason)
            dead_letter(pipe, self.model, tag, raw, reason)
            self.sink.deliver(pipe, msg, Reply(msg.id, error=Internal(reason)))
            failed.append((statistics.OTHER, msg))
            return None
        batched = self.batching and msg.inputs and msg.inputs[0][2]
        return Item(tag, msg, max(1, msg.inputs[0][2][0]) if batched else 1, attempts)

    def _record_failures(
        self, pipe: redis.client.Pipeline, now: float, failed: list[tuple[str, InferMessage]]
    ) -> None:
        """Count requests that failed before they ran, by version and reason."""
        latest = max(self.backends) if self.backends else -1
        groups: dict[tuple[int, str], list[int]] = {}
        for reason, msg in failed:
            version = latest if msg.version == -1 else msg.version
            took = max(0, int((now - msg.enqueued) * 1e9))
            groups.setdefault((version, reason), []).append(took)
        for (version, reason), took_ns in groups.items():
            if version > 0:
                statistics.record_failures(pipe, self.model, version, reason, took_ns)
