"""A worker's admission: each popped message becomes a batch item, or is dealt with here.

A message is decoded, then checked in this order: its deadline (passed: dropped, or a
job's result says why), its queue policy's timeout (Triton's REJECT answers it, DELAY puts
it back behind the requests still in time), its deliveries (past ``max_attempts``:
dead-lettered), and whether its caller cancelled it while it waited. What is dealt with is
acked in one round trip, with the statistics of the requests that failed; the rest are
``Item``s for a batch. A bundle's requests are admitted one by one, and its message is
acked once the last of them is settled (``bundle_ledger``). The gateway's half of Triton's queue policy (which priority step,
which timeout) is ``conch.frontend.admission``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from conch.core import tracing
from conch.core.errors import Internal, Unavailable
from conch.core.request_scope import RequestTag, about
from conch.wire import broker, statistics
from conch.wire.messages import BadMessage, InferMessage, Reply
from conch.worker.drain import Popped, ack, dead_letter, requeue
from conch.worker.loop_parts import QueueParts

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Item:
    """A request admitted to a batch."""

    tag: str  # the delivery tag of its message (a bundle's requests share it)
    msg: InferMessage
    rows: int  # its first input's first dimension when the model batches, else 1
    attempts: int
    ticket: int | None = None  # pop order, when the model preserves ordering
    bundled: bool = False  # its message is a bundle (``bundle_ledger``)

    @property
    def key(self) -> str:
        """What names this request among a batch's (its replies are keyed by it): its
        message's tag, or for a bundle's request its own id."""
        return self.msg.id if self.bundled else self.tag


def request_tag(msg: InferMessage) -> RequestTag:
    """The ids a log line about ``msg``'s request names."""
    return RequestTag(msg.client_id, msg.id, tracing.trace_id(msg.traceparent))


# Whether an item's time ran out, dealing with it if so: (pipeline, now, item, the
# failures to count) -> True when it is not to run.
_Lapse = Callable[[redis.client.Pipeline, float, Item, list[tuple[str, InferMessage]]], bool]


class Admission:
    """Admits one drain loop's popped messages (``admit``), with the loop's ``parts``.

    ``batching``: the model's requests carry a batch dimension, so a request's rows are
    its first input's first dimension, with or without a dynamic batcher (else each
    counts as one). The loop's backends name the versions served, for the statistics of
    requests that fail here without naming one. With a sequencer, a message dealt with
    here finishes its ticket; past the loop's ``max_attempts``, one is dead-lettered.
    """

    def __init__(self, parts: QueueParts, *, batching: bool) -> None:
        self.parts = parts
        self.batching = batching

    def admit(self, popped: list[Popped], first_ticket: int | None = None) -> list[Item]:
        """``popped`` as batch items (with tickets from ``first_ticket`` on, in pop order,
        when the model preserves ordering); the messages dealt with here are acked."""
        if not popped:
            return []
        self.parts.inflight.add([p.tag for p in popped])
        try:
            return self._admit_popped(popped, first_ticket)
        except BaseException:
            # Redis went away mid-admission: let go of all of them. They stay in flight in
            # Redis, where the visibility timeout brings them back to run (none has run).
            self.parts.inflight.discard([p.tag for p in popped])
            self.parts.ledger.forget(p.tag for p in popped)
            if self.parts.sequencer is not None and first_ticket is not None:
                for ticket in range(first_ticket, first_ticket + len(popped)):
                    self.parts.sequencer.finish(ticket)
            raise

    def _admit_popped(self, popped: list[Popped], first_ticket: int | None) -> list[Item]:
        items: list[Item] = []
        now = time.time()
        pipe = self.parts.client.pipeline(transaction=True)  # requeue and ack go together
        done: list[tuple[str, int | None]] = []  # whole messages dealt with: (tag, ticket)
        settled: list[Item] = []  # a bundle's requests dealt with, one by one
        failed: list[tuple[str, InferMessage]] = []  # (Triton's reason, request)
        redelivered = 0  # requests that came back after the worker that held them died
        lettered: set[str] = set()  # a message is dead-lettered once, whatever it holds
        for k, p in enumerate(popped):
            ticket = None if first_ticket is None else first_ticket + k
            try:
                decoded = broker.decode(p.raw)
                msgs = [InferMessage.from_dict(payload) for payload in decoded.payloads]
            except BadMessage as exc:
                log.error("%s: dead-lettering message %s: %s", self.parts.name, p.tag, exc)
                dead_letter(pipe, self.parts.model, p.tag, p.raw, str(exc))
                done.append((p.tag, ticket))
                continue
            if p.attempts > 1:
                redelivered += len(msgs)
            if decoded.bundle and self.parts.sequencer is not None:
                self._unbundle(pipe, msgs)
                done.append((p.tag, ticket))
                continue
            if decoded.bundle:
                self.parts.ledger.open(p.tag, len(msgs))
            for msg in msgs:
                item = Item(p.tag, msg, 1, p.attempts, ticket, decoded.bundle)
                if self._admit(pipe, now, p, item, lettered, failed):
                    items.append(item)
                elif item.bundled:
                    settled.append(item)
                else:
                    done.append((p.tag, ticket))
        gone = self.parts.sink.cancelled(i.msg for i in items)
        if gone:  # cancelled while queued: never run
            for i in items:
                if i.msg.id not in gone:
                    continue
                if i.bundled:
                    settled.append(i)
                else:
                    done.append((i.tag, i.ticket))
                failed.append((statistics.CANCELED, i.msg))
            items = [i for i in items if i.msg.id not in gone]
        if redelivered:  # came back after the worker that held them went away
            statistics.count_model(pipe, self.parts.model, statistics.REDELIVERED, redelivered)
        if done or settled or redelivered:
            self._settle(pipe, now, done, settled, failed)
        return items

    def expire(self, items: list[Item]) -> list[Item]:
        """Of ``items``, held while their batch forms, those still in time; the rest are
        dealt with as at admission (their deadline passed: dropped; their queue policy's
        timeout: REJECT answers them, DELAY puts them back behind the requests still in
        time), so that a request that times out never holds the others back."""
        return self._keep(items, self._lapsed)

    def overdue(self, items: list[Item]) -> list[Item]:
        """Of ``items``, about to run, those whose deadline has not passed; the rest are
        dropped as at admission. A batch can wait after its requests were admitted (for
        its rate-limit resources, or while it forms), and a request is never run past
        its deadline. Nothing is asked of Redis unless one is dropped."""
        now = time.time()
        if all(not i.msg.deadline or now <= i.msg.deadline for i in items):
            return items
        return self._keep(items, self._past_deadline)

    def _keep(self, items: list[Item], lapsed: _Lapse) -> list[Item]:
        """Of ``items``, those ``lapsed`` keeps (it deals with the others), the rest
        acked in one round trip."""
        now = time.time()
        pipe = self.parts.client.pipeline(transaction=True)
        done: list[tuple[str, int | None]] = []
        settled: list[Item] = []
        failed: list[tuple[str, InferMessage]] = []
        kept = []
        for item in items:
            if not lapsed(pipe, now, item, failed):
                kept.append(item)
            elif item.bundled:
                settled.append(item)
            else:
                done.append((item.tag, item.ticket))
        if len(kept) < len(items):
            self._settle(pipe, now, done, settled, failed)
        return kept

    def _settle(
        self,
        pipe: redis.client.Pipeline,
        now: float,
        done: list[tuple[str, int | None]],
        settled: list[Item],
        failed: list[tuple[str, InferMessage]],
    ) -> None:
        """What was dealt with acked (whole messages ``done``; a bundle's requests
        ``settled``, once its last is), with the failures' statistics, in one round trip."""
        self._record_failures(pipe, now, failed)
        tags = [tag for tag, _ in done] + self.parts.ledger.settle(settled)
        ack(pipe, self.parts.drain.queue, tags)
        pipe.execute()
        self.parts.inflight.discard(tags)
        if self.parts.sequencer is not None:
            for _, ticket in done:
                self.parts.sequencer.finish(ticket)

    def _unbundle(self, pipe: redis.client.Pipeline, msgs: list[InferMessage]) -> None:
        """A bundle's requests for a model that preserves ordering, whose pops take one
        ticket a message: put back at the head of their queue one message each, in their
        order, to be popped again (gateways bundle none of its requests, but a bundle
        queued before its config said so may come)."""
        for msg in reversed(msgs):
            requeue(
                pipe,
                self.parts.drain.queue,
                msg.to_dict(),
                tag=msg.id,
                priority=msg.priority,
                reply_to=msg.reply_to,
                head=True,
            )

    def _admit(
        self,
        pipe: redis.client.Pipeline,
        now: float,
        popped: Popped,
        item: Item,
        lettered: set[str],
        failed: list[tuple[str, InferMessage]],
    ) -> bool:
        """Whether ``item`` (a request of ``popped``) joins a batch, its ``rows`` set;
        False once it is dealt with here (a request that failed here is added to
        ``failed``, with Triton's reason). ``lettered``: the tags of the messages
        dead-lettered already (a bundle's earlier request did)."""
        if self._lapsed(pipe, now, item, failed):
            return False
        msg = item.msg
        if popped.attempts > self.parts.max_attempts:
            reason = (
                f"request for model '{self.parts.model}' was dead-lettered after "
                f"{popped.attempts - 1} attempts: each one ended with its worker dying"
            )
            with about(request_tag(msg)):
                log.error("%s: %s", self.parts.name, reason)
            if popped.tag not in lettered:
                lettered.add(popped.tag)
                dead_letter(pipe, self.parts.model, popped.tag, popped.raw, reason)
            self.parts.sink.deliver(pipe, msg, Reply(msg.id, error=Internal(reason)))
            failed.append((statistics.OTHER, msg))
            return False
        if self.batching and msg.inputs and msg.inputs[0].shape:
            item.rows = max(1, msg.inputs[0].shape[0])
        return True

    def _lapsed(
        self,
        pipe: redis.client.Pipeline,
        now: float,
        item: Item,
        failed: list[tuple[str, InferMessage]],
    ) -> bool:
        """Whether ``item``'s time ran out in the queue (its deadline, or its queue
        policy's timeout), dealt with here if so (a failure added to ``failed``)."""
        msg = item.msg
        if self._past_deadline(pipe, now, item, failed):
            return True
        if msg.queue_deadline and now > msg.queue_deadline and not msg.delayed:
            if msg.delay_on_timeout:
                # Triton's DELAY: behind every request still in time, not dropped.
                msg.delayed = True
                requeue(
                    pipe,
                    self.parts.drain.queue,
                    msg.to_dict(),
                    tag=item.key,
                    priority=broker.ONLINE_STEPS - 1,
                    reply_to=msg.reply_to,
                    head=False,
                )
            else:
                error = Unavailable(
                    f"Request timeout expired: the request waited longer than the queue policy "
                    f"of model '{self.parts.model}' allows"
                )
                self.parts.sink.deliver(pipe, msg, Reply(msg.id, error=error))
                failed.append((statistics.REJECTED, msg))
            return True
        return False

    def _past_deadline(
        self,
        pipe: redis.client.Pipeline,
        now: float,
        item: Item,
        failed: list[tuple[str, InferMessage]],
    ) -> bool:
        """Whether ``item``'s deadline has passed, dropped if so (a job's result says
        why; any other caller has stopped waiting)."""
        msg = item.msg
        if not msg.deadline or now <= msg.deadline:
            return False
        with about(request_tag(msg)):
            log.info("%s: dropping a request: its deadline passed before it ran", self.parts.name)
        failed.append((statistics.REJECTED, msg))
        if msg.job_ttl:  # nobody waits on a job: its result says why it never ran
            error = Unavailable(
                f"Request timeout expired: the job waited in the queue of model "
                f"'{self.parts.model}' past its 'timeout' of {msg.timeout_us} us"
            )
            self.parts.sink.deliver(pipe, msg, Reply(msg.id, error=error))
        return True

    def _record_failures(
        self, pipe: redis.client.Pipeline, now: float, failed: list[tuple[str, InferMessage]]
    ) -> None:
        """Count requests that failed before they ran, by version and reason."""
        latest = max(self.parts.backends) if self.parts.backends else -1
        groups: dict[tuple[int, str], list[int]] = {}
        for reason, msg in failed:
            version = latest if msg.version == -1 else msg.version
            took = max(0, int((now - msg.enqueued) * 1e9))
            groups.setdefault((version, reason), []).append(took)
        for (version, reason), took_ns in groups.items():
            if version > 0:
                statistics.record_failures(pipe, self.parts.model, version, reason, took_ns)
