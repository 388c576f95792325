"""The dynamic batcher: one drain loop per model instance, inside the worker.

It follows Triton's ``dynamic_batching``: a batch is cut when it holds
``max_batch_size`` rows, or when the oldest request in it has waited
``max_queue_delay_microseconds`` since the gateway enqueued it; a batch that has
reached a preferred size goes at once, and so does its largest prefix of a preferred
size (in Triton's queue order: priority first, requests its queue policy delayed last
within their level).
A request held while its batch forms is checked again when its queue timeout or
deadline passes, so that one that times out never holds the others back. Without ``dynamic_batching`` every request runs
alone, as under Triton's default scheduler. Nothing is held in worker memory beyond
the batch being formed (and the rows that overflowed it, which lead the next batch).

``Batcher`` is the loop and the forming: how many to pop, when to cut, what is carried to
the next batch and what is handed back. It owns the two other parts of a drain loop, and
calls each once a pop or once a batch: ``admission.Admission`` (a popped message becomes
a batch item, or is dealt with) and ``runner.Runner`` (a batch run on its backend, its
replies sent).
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext

import redis

from conch.core import timeline
from conch.core.batch_policy import BatchPolicy
from conch.core.request_scope import about
from conch.wire import broker, outage
from conch.wire.rate_limits import Stopped
from conch.worker.admission import Admission, Item, request_tag
from conch.worker.drain import Popped, ack, requeue
from conch.worker.in_flight import InFlight
from conch.worker.loop_parts import QueueParts
from conch.worker.offline_share import OfflineShare
from conch.worker.reply_order import Sequencer
from conch.worker.runner import Runner, telemetry

__all__ = ["BatchPolicy", "Batcher", "InFlight", "OfflineShare", "Sequencer"]

log = logging.getLogger(__name__)

# A model without dynamic batching still runs each request alone; a pop takes as many as
# run within this budget (by recent time per request, at most ALONE_MAX_POP) so their
# replies and the next pop share one round trip.
ALONE_BUDGET_S = 0.0005
ALONE_MAX_POP = 16
_NEVER = float("inf")


def _queue_order(item: Item) -> tuple[int, bool]:
    """Triton's queue order: by priority level, the requests its queue policy delayed
    behind the rest of their own level (each level is a queue with a delayed tail)."""
    return item.msg.priority, item.msg.delayed


def _first_lapse(items: list[Item]) -> float:
    """When the first of ``items`` runs out of time in the queue (its deadline, or its
    queue policy's timeout unless it was delayed already); infinity when none can."""
    first = _NEVER
    for item in items:
        msg = item.msg
        if msg.deadline and msg.deadline < first:
            first = msg.deadline
        if msg.queue_deadline and not msg.delayed and msg.queue_deadline < first:
            first = msg.queue_deadline
    return first


class Batcher(threading.Thread):
    """Drains one model's queue into one instance slot, by its ``parts``
    (``loop_parts.QueueParts``: the slot's backends, one per loaded version, so a batch
    splits by the version its requests ask for; requests from its ``drain``, replies to
    its ``sink``, the seams a test fakes), batching by ``policy``. A model with N
    instances has N batchers on the same queue. The thread forms the batches; its
    ``admission`` admits what it pops, and its ``runner`` runs each batch and sends the
    replies.

    Each execution's Triton statistics go to Redis (``conch.wire.statistics``) with its
    replies. ``parts.on_batch(model, counts)``, if given, also gets each batch's counts for
    the worker's own telemetry (``telemetry.WorkerTelemetry``); ``parts.on_send``, if
    given, may add commands to the round trip that sends a batch's replies (the worker's
    custom metrics, ``metrics_publisher``).
    """

    def __init__(self, parts: QueueParts, policy: BatchPolicy, *, idle_poll: float = 1.0) -> None:
        super().__init__(name=parts.name, daemon=True)
        self.parts = parts
        self.policy = policy
        self.idle_poll = idle_poll
        self.admission = Admission(parts, batching=policy.batch_dimension)
        self.runner = Runner(parts, prefetched=self._keep_prefetched)
        self._carry: list[Item] = []
        # Messages popped in the same round trip as the last batch's replies
        # (``Runner.reply``), not yet admitted; None when no pop rode along.
        self._prefetched: list[Popped] | None = None
        self._per_request_s = 0.0  # recent run time per request, without dynamic batching
        self.offline_share = OfflineShare()  # how many offline messages a pop may take
        self._redis_away = False  # the last round trip found Redis unreachable

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        while not self.parts.stopping.is_set():
            try:
                self.runner.streams.reap()  # a decoupled model's requests left without an end
                self._once()
                self._redis_away = False
            except redis.RedisError as exc:
                if not self._redis_away:  # once an outage, not every retry
                    log.warning("%s: Redis error (%s); retrying", self.name, exc)
                self._redis_away = outage.is_outage(exc)
                time.sleep(outage.RECONNECT_S)
            except Exception:
                log.exception("%s: unexpected error in the batch loop", self.name)
                time.sleep(0.1)
        if self._prefetched:
            self._carry += self._admit(self._prefetched)
        self._prefetched = None
        self._hand_back(self._carry)
        self._carry = []
        self.runner.streams.stop()  # a decoupled model's requests still streaming

    def stop(self) -> None:
        self.parts.stopping.set()

    def _once(self) -> None:
        items, self._carry = self._carry, []
        if not items:
            if self._prefetched is not None:
                popped, self._prefetched = self._prefetched, None
                items = self._admit(popped)
                if not items and popped:
                    return  # all dealt with on admission: pop again at once
            else:
                items = self._take(self._count())
            if not items:
                self._idle()
                return
        if self.policy.max_batch_size == 1:  # no dynamic batching: each request alone
            self.execute(items, alone=True)
            return
        rows = sum(i.rows for i in items)
        while self._forming(items, rows):
            now = time.time()
            lapses = _first_lapse(items)
            if lapses < now:  # a held request timed out: it holds the others back no more
                items = self.admission.expire(items)
                if not items:
                    return
                rows = sum(i.rows for i in items)
                continue
            left = min(i.msg.enqueued for i in items) + self.policy.max_queue_delay - now
            try:
                if self.parts.drain.waiting == 0:  # nothing queued: wait for more, or for the delay
                    if left <= 0 or self.parts.stopping.is_set():
                        break
                    if not self.parts.drain.wait(min(left, lapses - now)):
                        continue  # nothing was published meanwhile: no pop to make
                more = self._take(self.policy.max_batch_size - rows)
            except redis.RedisError as exc:  # run what is held; its replies wait for Redis
                log.warning("%s: Redis error while forming a batch (%s)", self.name, exc)
                break
            items += more
            rows += sum(i.rows for i in more)
            if not more and left <= 0:
                break
        n = self.policy.cut([i.rows for i in items])
        batch, carry = items[:n], items[n:]
        oldest = min(i.msg.enqueued for i in batch)
        cut = self.policy.why_cut(sum(i.rows for i in batch), bool(carry), oldest, time.time())
        # Offline messages past the batch go back to the queue rather than wait here,
        # where they would run before online requests that come meanwhile.
        offline = [i for i in carry if i.msg.priority >= broker.PRIORITY_OFFLINE]
        if offline:
            self._hand_back(offline, quiet=True)
            self.offline_share.refund(sum(i.rows for i in offline))
        self._carry = [i for i in carry if i.msg.priority < broker.PRIORITY_OFFLINE]
        self.execute(batch, cut=cut)

    def _idle(self) -> None:
        """Nothing to run: block until work may have come. Offline work held back
        (OfflineShare) wakes nobody, so the wait ends when it may run.

        The pop waits for the next turn of the loop, a round trip of its own: one sent
        behind the BLPOP would run the moment Redis serves the BLPOP, and take a message
        even while this worker cannot run it (stopped, or stalled), where it would sit in
        flight instead of queued for a worker that can."""
        held = self.offline_share.held_for()
        self.parts.drain.wait(self.idle_poll if held is None else min(self.idle_poll, held))

    def _forming(self, items: list[Item], rows: int) -> bool:
        """Whether the batch held waits for more. As Triton's queue is, ``items`` is kept
        in priority order (pop order within a level), the requests its queue policy
        delayed (DELAY) behind the rest of their level; the batch goes at once when it is
        full, or when a prefix of it in that order makes a preferred size (``cut`` takes
        the largest such prefix; the rest lead the next batch)."""
        policy = self.policy
        if len(items) > 1:
            items.sort(key=_queue_order)  # stable, and cheap on a list in order already
        if rows >= policy.max_batch_size or policy.ready(rows):
            return False
        if not policy.preferred:
            return True
        acc = 0
        for item in items:
            acc += item.rows
            if acc > policy.max_batch_size:
                break
            if acc in policy.preferred:
                return False
        return True

    # -- taking messages --------------------------------------------------------------
    def _count(self) -> int:
        """How many messages one pop takes: a batch's worth; for a model without dynamic
        batching, as many as run one after another within ``ALONE_BUDGET_S`` (by the
        recent time per request), so fast models share round trips and a slow one never
        holds requests another instance could be running."""
        if self.policy.max_batch_size > 1:
            return self.policy.max_batch_size
        if not self._per_request_s:
            return 1
        return max(1, min(ALONE_MAX_POP, int(ALONE_BUDGET_S / self._per_request_s)))

    def _offline_limit(self, count: int) -> tuple[int | None, bool]:
        """The most offline messages a pop of ``count`` may take, and whether the ones
        left are held back (OfflineShare) or only not taken now: a batching model takes
        the messages that fill its batch's rows (each carries many: line_packing) and run
        briefly (``OfflineShare.fill``), not ``count`` of them, which would run ahead of
        online requests that come next."""
        share = self.offline_share.allowance()
        if self.policy.max_batch_size <= 1:
            return share, share is not None
        fill = self.offline_share.fill(count)
        return (fill, False) if share is None else (min(share, fill), True)

    def _take(self, count: int) -> list[Item]:
        """Pop up to ``count`` messages and admit them; with ``preserve_ordering`` the pop
        takes their tickets under the sequencer's lock."""
        offline, held = self._offline_limit(count)
        if self.parts.sequencer is None:
            return self._admit(self.parts.drain.pop(count, offline, held))
        with self.parts.sequencer.lock:
            popped = self.parts.drain.pop(count, offline, held)
            first = self.parts.sequencer.issue(len(popped))
        return self._admit(popped, first)

    def _admit(self, popped: list[Popped], first_ticket: int | None = None) -> list[Item]:
        """``popped`` as batch items (``Admission``); the offline ones spend their share."""
        items = self.admission.admit(popped, first_ticket)
        if items:
            timeline.stamp("worker.admitted")
        offline = [i.rows for i in items if i.msg.priority >= broker.PRIORITY_OFFLINE]
        if offline:
            self.offline_share.took(sum(offline), len(offline))
        return items

    def _keep_prefetched(self, popped: list[Popped]) -> None:
        """What the pop that rode with a batch's replies took: the next batch's start."""
        self._prefetched = popped

    def _hand_back(self, items: list[Item], *, quiet: bool = False) -> None:
        """Return held, unexecuted requests to the head of their queue (warm shutdown, or
        ``quiet``: offline messages a batch had no room for)."""
        if not items:
            return
        pipe = self.parts.client.pipeline(transaction=True)
        for item in reversed(items):
            requeue(
                pipe,
                self.parts.drain.queue,
                item.msg.to_dict(),
                tag=item.key,
                priority=item.msg.priority,
                reply_to=item.msg.reply_to,
                head=True,
            )
        tags = self.parts.ledger.settle(items)
        ack(pipe, self.parts.drain.queue, tags)
        pipe.execute()
        self.parts.inflight.discard(tags)
        if self.parts.sequencer is not None:
            for item in items:
                self.parts.sequencer.finish(item.ticket)
        if not quiet:
            log.info("%s: handed back %d request(s) it held", self.name, len(items))

    # -- a batch ----------------------------------------------------------------------
    def execute(self, batch: list[Item], *, alone: bool = False, cut: str = "") -> None:
        """Run ``batch`` as one execution, or with ``alone`` each request as one of its
        own (``Runner.run``); either way the replies go together (``Runner.reply``).
        ``cut``: why the dynamic batcher cut it (counted once, with its first execution).
        Every line logged meanwhile (a Python model's too) names the batch's requests."""
        with about(*(request_tag(i.msg) for i in batch)):
            log.debug(
                "%s: executing %d request(s), %d row(s)",
                self.name,
                len(batch),
                sum(i.rows for i in batch),
            )
            # Its requests leave a bounded queue as Triton's do when their batch goes.
            self.parts.drain.release({i.tag for i in batch})
            try:
                with self.parts.gate() if self.parts.gate is not None else nullcontext():
                    # What waited past its deadline since it was admitted never runs.
                    batch = self.admission.overdue(batch)
                    if not batch:
                        return
                    started = time.time()
                    result = self.runner.run(batch, alone=alone, cut=cut)
            except Stopped:
                # The loop stopped while the batch waited for its rate-limit resources: it
                # never ran, so it leads what the loop hands back as it ends.
                self._carry = batch + self._carry
                return
            self._ran(batch, time.time() - started, alone)
            if self.parts.sequencer is None:
                # The next pop rides with these replies: one round trip per batch, not two.
                # Not with requests carried over (they lead the next batch), nor while
                # stopping; with preserve_ordering pops take tickets, so they go alone.
                count = self._count() if not self._carry and not self.parts.stopping.is_set() else 0
                offline, held = self._offline_limit(count)
                self.runner.reply(batch, result, prefetch=count, offline=offline, held=held)
            else:
                self.runner.reply(batch, result)
            if self.parts.on_batch is not None:
                executions = len(batch) if alone else 1
                self.parts.on_batch(self.parts.model, telemetry(batch, result.replies, executions))

    def _ran(self, batch: list[Item], seconds: float, alone: bool) -> None:
        """Keep the accounts the next pops go by: offline work's share of the time, and
        the time a request takes run alone."""
        offline = sum(i.rows for i in batch if i.msg.priority >= broker.PRIORITY_OFFLINE)
        self.offline_share.ran(seconds, sum(i.rows for i in batch) - offline, offline)
        if alone:
            took = seconds / max(1, len(batch))
            self._per_request_s = (
                took if not self._per_request_s else (0.8 * self._per_request_s + 0.2 * took)
            )
