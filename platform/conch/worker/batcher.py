"""The dynamic batcher: one drain loop per model instance, inside the worker.

It follows Triton's ``dynamic_batching``: a batch is cut when it holds
``max_batch_size`` rows, or when the oldest request in it has waited
``max_queue_delay_microseconds`` since the gateway enqueued it; a batch that has
reached a preferred size goes at once. Without ``dynamic_batching`` every request runs
alone, as under Triton's default scheduler. Nothing is held in worker memory beyond
the batch being formed (and the rows that overflowed it, which lead the next batch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from conch.backends import Backend, BackendRequest
from conch.core import tensors, tracing
from conch.core.errors import ConchError, Internal, InvalidArgument, NotFound, Unavailable
from conch.core.model_config import output_types
from conch.core.request_scope import RequestTag, about
from conch.wire import broker, outage, statistics
from conch.wire.messages import BadMessage, InferMessage, Reply
from conch.wire.redis_link import CommandQueue, Commands, RedisLink
from conch.worker.drain import Drain, ack, dead_letter, requeue
from conch.worker.replies import ReplySink

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)

# A model without dynamic batching still runs each request alone; a pop takes as many as
# run within this budget (by recent time per request, at most ALONE_MAX_POP) so their
# replies and the next pop share one round trip.
ALONE_BUDGET_S = 0.0005
ALONE_MAX_POP = 16


class BulkShare:
    """How many batch-job lines a pop may take, so that offline work never starves online.

    Batch-job lines (the lowest step) fill what online requests and async jobs leave. A
    slot is not free on a model whose rows cost compute: a batch padded with lines runs
    longer, and the online requests in it and behind it wait for them. So while online or
    async work has come within ``QUIET_S``, lines may take only ``SHARE`` of the model's
    execution time: each execution with such work earns lines that share of its duration,
    spent at the recent time per row, and a pop takes the messages the credit buys (a
    message of a batch job carries several lines' rows: line_packing). With no such work
    about, lines take every slot. Why ``SHARE`` is what it is, and what online traffic kept
    beside a batch job at other shares: bench/README.md, text_embedding runs 3 and 4.
    """

    SHARE = 0.05
    QUIET_S = 0.5
    MAX_CREDIT_S = 0.1  # unused credit does not pile up into a burst of lines
    LINES_RUN_S = 0.1  # lines one pop takes when it may take every slot, in execution time

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.protected_at = float("-inf")  # when online or async rows last ran
        self.credit_s = 0.0
        self.row_s = 0.0  # recent execution time per row
        self.message_rows = 0.0  # recent rows per batch-job message (0: none seen yet)

    def allowance(self) -> int | None:
        """Batch-job messages the next pop may take (None: no limit)."""
        if self.clock() - self.protected_at > self.QUIET_S:
            return None
        if self.row_s <= 0 or self.credit_s <= 0:
            return 0
        if not self.message_rows:  # how many rows a message holds is not known yet
            return min(1, int(self.credit_s / self.row_s))
        return int(self.credit_s / (self.row_s * self.message_rows))

    def held_for(self) -> float | None:
        """How long lines are held back for now (until online work has been quiet for
        ``QUIET_S``), or None when they are not."""
        left = self.protected_at + self.QUIET_S - self.clock()
        return left if left > 0 else None

    def ran(self, seconds: float, protected_rows: int, bulk_rows: int) -> None:
        """An execution of ``seconds`` ran these rows (online/async, and batch-job lines;
        the lines' cost was spent when they were taken: ``took``)."""
        rows = protected_rows + bulk_rows
        if rows <= 0:
            return
        per_row = seconds / rows
        self.row_s = per_row if not self.row_s else 0.8 * self.row_s + 0.2 * per_row
        if not protected_rows:
            # Time spent on lines alone is not quiet time: online work that came meanwhile
            # waits in the queue unseen, so a long run of lines must not count as its
            # absence (else the lines take every slot next and starve it).
            if self.clock() - seconds - self.protected_at <= self.QUIET_S:
                self.protected_at += seconds
        else:
            self.protected_at = self.clock()
            earned = seconds * self.SHARE / (1 - self.SHARE)
            # Unused credit stays bounded, but never below what one message costs.
            cap = max(self.MAX_CREDIT_S, self.row_s * self.message_rows)
            self.credit_s = min(cap, self.credit_s + earned)

    def took(self, bulk_rows: int, bulk_messages: int) -> None:
        """A pop took ``bulk_messages`` batch-job messages of ``bulk_rows`` rows (negative:
        gave them back unrun). Their time is spent now, so the pops before they run (a
        prefetch, the next batch's) cannot spend it again."""
        if bulk_messages > 0:
            each = bulk_rows / bulk_messages
            self.message_rows = (
                each if not self.message_rows else 0.8 * self.message_rows + 0.2 * each
            )
        if bulk_rows and self.clock() - self.protected_at <= self.QUIET_S:
            self.credit_s -= bulk_rows * self.row_s

    def fill(self, rows: int) -> int:
        """How many batch-job messages a pop for ``rows`` rows takes (at least one): those
        that fill them, and no more than run in about ``LINES_RUN_S``, so online requests
        that come while they run wait for little even when lines have every slot."""
        if not self.message_rows:  # none taken yet: a message a row, what is over goes back
            return rows
        if self.row_s > 0:
            rows = min(rows, int(self.LINES_RUN_S / self.row_s))
        return max(1, int(rows / self.message_rows))


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int  # rows; 1 when the model does not batch dynamically
    max_queue_delay: float  # seconds, measured from the oldest request's enqueue time
    preferred: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, config: ModelConfig) -> BatchPolicy:
        if config.max_batch_size > 0 and config.HasField("dynamic_batching"):
            db = config.dynamic_batching
            preferred = tuple(
                sorted(p for p in db.preferred_batch_size if 0 < p <= config.max_batch_size)
            )
            return cls(config.max_batch_size, db.max_queue_delay_microseconds / 1e6, preferred)
        return cls(1, 0.0)

    def ready(self, rows: int) -> bool:
        """A batch this size need not wait for more."""
        return rows >= self.max_batch_size or rows in self.preferred

    def why_cut(self, batch: list[Item], carry: list[Item], oldest: float, now: float) -> str:
        """Why a batch went when it did (``conch_batch_cut_total``'s reason): it reached a
        preferred size, it was full (or the next request did not fit), its oldest request
        waited out ``max_queue_delay``, or the queue ran dry with no delay left to wait
        for (no delay configured, or the worker stopping)."""
        rows = sum(i.rows for i in batch)
        if rows in self.preferred and rows < self.max_batch_size:
            return statistics.CUT_PREFERRED
        if rows >= self.max_batch_size or carry:
            return statistics.CUT_FULL
        if self.max_queue_delay > 0 and now >= oldest + self.max_queue_delay:
            return statistics.CUT_DELAY
        return statistics.CUT_DRAINED

    def cut(self, rows: list[int]) -> int:
        """How many of the queued requests (with these row counts) form the batch."""
        total, n = 0, 0
        for r in rows:
            if total + r > self.max_batch_size and n:
                break
            total, n = total + r, n + 1
        if total > self.max_batch_size or not self.preferred or total in self.preferred:
            return n
        # Prefer the largest preferred size that a prefix of the queue makes exactly.
        best, acc = 0, 0
        for k, r in enumerate(rows[:n], 1):
            acc += r
            if acc in self.preferred:
                best = k
        return best or n


@dataclass
class Item:
    tag: str
    msg: InferMessage
    rows: int
    attempts: int
    ticket: int = -1  # pop order, when the model preserves ordering


def _tag(msg: InferMessage) -> RequestTag:
    """The ids a log line about ``msg``'s request names."""
    return RequestTag(msg.client_id, msg.id, tracing.trace_id(msg.traceparent))


class Sequencer:
    """Releases replies in the order their requests were popped (``preserve_ordering``).

    Shared by one model's batchers in a worker: each pop takes consecutive tickets under
    ``lock``, and a batch sends each reply only once every earlier ticket is finished.
    Ordering holds within a worker, as Triton's holds within a server.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._cond = threading.Condition()
        self._issued = 0
        self._next = 0
        self._finished: set[int] = set()

    def issue(self, n: int) -> int:
        """First of ``n`` new tickets; call with ``lock`` held, around the pop."""
        first, self._issued = self._issued, self._issued + n
        return first

    def wait_turn(self, ticket: int) -> None:
        with self._cond:
            while self._next != ticket:
                self._cond.wait(0.5)

    def finish(self, ticket: int) -> None:
        with self._cond:
            self._finished.add(ticket)
            while self._next in self._finished:
                self._finished.remove(self._next)
                self._next += 1
            self._cond.notify_all()


@dataclass
class InFlight:
    """Tags this worker holds, so a heartbeat can keep them from being restored."""

    tags: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, tags: list[str]) -> None:
        with self.lock:
            self.tags.update(tags)

    def discard(self, tags: list[str]) -> None:
        with self.lock:
            self.tags.difference_update(tags)

    def snapshot(self) -> list[str]:
        with self.lock:
            return list(self.tags)


class Batcher(threading.Thread):
    """Drains one model's queue into one instance slot: ``backends`` maps each loaded
    version to its instance in that slot, so a batch splits by the version its requests
    ask for. Requests come from ``drain`` and replies go to ``sink`` (the seams a test
    fakes); a model with N instances has N batchers on the same queue.

    Each execution's Triton statistics go to Redis (``conch.wire.statistics``) with its
    replies. ``on_batch(model, counts)``, if given, also gets each batch's counts for the
    worker's own telemetry (``host.WorkerTelemetry``); ``on_send(commands)``, if given, may
    add commands to the round trip that sends a batch's replies (the worker's custom
    metrics, ``metrics_publisher``).
    """

    def __init__(
        self,
        *,
        client: redis.Redis,
        model: str,
        backends: dict[int, Backend],
        policy: BatchPolicy,
        inflight: InFlight,
        drain: Drain | None = None,
        sink: ReplySink | None = None,
        link: RedisLink | None = None,
        max_attempts: int = 3,
        idle_poll: float = 1.0,
        on_batch: Callable[[str, dict[str, int]], None] | None = None,
        on_send: Callable[[CommandQueue], None] | None = None,
        sequencer: Sequencer | None = None,
        samples: bool = False,
        name: str = "",
    ) -> None:
        super().__init__(name=name or f"batcher-{model}", daemon=True)
        self.client = client
        self.model = model
        self.backends = backends
        self.policy = policy
        self.inflight = inflight
        self.max_attempts = max_attempts
        self.idle_poll = idle_poll
        self.on_batch = on_batch
        self.on_send = on_send
        self.sequencer = sequencer
        self.samples = samples  # keep each request's latencies for the summaries
        self.drain = drain or Drain(client, model)  # where requests come from
        self.sink = sink or ReplySink(client, model)  # where their replies go
        self.link = link or RedisLink(client)  # this thread's own round trips
        # Outputs go out as the config declares them, whatever width the backend used.
        self.output_types = (
            output_types(next(iter(backends.values())).spec.config) if backends else {}
        )
        self.stopping = threading.Event()
        self._carry: list[Item] = []
        # Messages popped in the same round trip as the last batch's replies (``_send``),
        # not yet admitted; None when no pop rode along.
        self._prefetched: list[tuple[str, bytes, int]] | None = None
        self._per_request_s = 0.0  # recent run time per request, without dynamic batching
        self.bulk_share = BulkShare()  # how many batch-job lines a pop may take
        self._redis_away = False  # the last round trip found Redis unreachable

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        while not self.stopping.is_set():
            try:
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
            self._carry += self._admit_all([(*m, -1) for m in self._prefetched])
        self._prefetched = None
        self._hand_back(self._carry)
        self._carry = []

    def stop(self) -> None:
        self.stopping.set()

    def _once(self) -> None:
        items, self._carry = self._carry, []
        if not items:
            if self._prefetched is not None:
                popped, self._prefetched = self._prefetched, None
                items = self._admit_all([(*m, -1) for m in popped])
                if not items and popped:
                    return  # all dealt with on admission: pop again at once
            else:
                items = self._take(self._count())
            if not items:
                # Lines held back (BulkShare) wake nobody: look again once they may run.
                held = self.bulk_share.held_for()
                self.drain.wait(self.idle_poll if held is None else min(self.idle_poll, held))
                return
        if self.policy.max_batch_size == 1:  # no dynamic batching: each request alone
            self.execute(items, alone=True)
            return
        rows = sum(i.rows for i in items)
        while rows < self.policy.max_batch_size and not self.policy.ready(rows):
            left = min(i.msg.enqueued for i in items) + self.policy.max_queue_delay - time.time()
            try:
                if self.drain.waiting == 0:  # nothing queued: wait for more, or for the delay
                    if left <= 0 or self.stopping.is_set():
                        break
                    self.drain.wait(left)
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
        cut = self.policy.why_cut(batch, carry, oldest, time.time())
        # Lines past the batch go back to the queue rather than wait here, where they would
        # run before online requests that come meanwhile.
        lines = [i for i in carry if i.msg.priority >= broker.PRIORITY_BULK]
        if lines:
            self._hand_back(lines, quiet=True)
            self.bulk_share.took(-sum(i.rows for i in lines), 0)
        self._carry = [i for i in carry if i.msg.priority < broker.PRIORITY_BULK]
        self.execute(batch, cut=cut)

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

    def _bulk_limit(self, count: int) -> tuple[int | None, bool]:
        """The most batch-job messages a pop of ``count`` may take, and whether the lines
        left are held back (BulkShare) or only not taken now: a batching model takes the
        messages that fill its batch's rows (each carries many: line_packing) and run
        briefly (``BulkShare.fill``), not ``count`` of them, which would run ahead of
        online requests that come next."""
        share = self.bulk_share.allowance()
        if self.policy.max_batch_size <= 1:
            return share, share is not None
        fill = self.bulk_share.fill(count)
        return (fill, False) if share is None else (min(share, fill), True)

    def _pop(self, count: int) -> list[tuple[str, bytes, int, int]]:
        bulk, held = self._bulk_limit(count)
        if self.sequencer is None:
            popped = self.drain.pop(count, bulk, held)
            return [(tag, raw, attempts, -1) for tag, raw, attempts in popped]
        with self.sequencer.lock:
            popped = self.drain.pop(count, bulk, held)
            first = self.sequencer.issue(len(popped))
        return [(tag, raw, attempts, first + k) for k, (tag, raw, attempts) in enumerate(popped)]

    def _take(self, count: int) -> list[Item]:
        return self._admit_all(self._pop(count))

    def _admit_all(self, popped: list[tuple[str, bytes, int, int]]) -> list[Item]:
        """Popped messages as batch items; the ones dealt with on admission are acked."""
        if not popped:
            return []
        self.inflight.add([tag for tag, _, _, _ in popped])
        try:
            items = self._admit_popped(popped)
            lines = [i.rows for i in items if i.msg.priority >= broker.PRIORITY_BULK]
            self.bulk_share.took(sum(lines), len(lines))
            return items
        except BaseException:
            # Redis went away mid-admission: let go of all of them. They stay in flight in
            # Redis, where the visibility timeout brings them back to run (none has run).
            self.inflight.discard([tag for tag, _, _, _ in popped])
            if self.sequencer is not None:
                for _, _, _, ticket in popped:
                    self.sequencer.finish(ticket)
            raise

    def _admit_popped(self, popped: list[tuple[str, bytes, int, int]]) -> list[Item]:
        items: list[Item] = []
        now = time.time()
        pipe = self.client.pipeline(transaction=True)  # requeue and ack go together
        done: list[tuple[str, int]] = []
        failed: list[tuple[str, InferMessage]] = []  # (Triton's reason, request)
        for tag, raw, attempts, ticket in popped:
            item = self._admit(pipe, now, tag, raw, attempts, failed)
            if item is None:
                done.append((tag, ticket))
            else:
                item.ticket = ticket
                items.append(item)
        redelivered = sum(1 for _, _, attempts, _ in popped if attempts > 1)
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
        tag: str,
        raw: bytes,
        attempts: int,
        failed: list[tuple[str, InferMessage]],
    ) -> Item | None:
        """The popped message as a batch item, or None once it is dealt with here (a
        request that failed here is added to ``failed``, with Triton's reason)."""
        try:
            _, payload, _ = broker.decode(raw)
            msg = InferMessage.from_dict(payload)
        except BadMessage as exc:
            log.error("%s: dead-lettering message %s: %s", self.name, tag, exc)
            dead_letter(pipe, self.model, tag, raw, str(exc))
            return None
        if msg.deadline and now > msg.deadline:
            with about(_tag(msg)):
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
            with about(_tag(msg)):
                log.error("%s: %s", self.name, reason)
            dead_letter(pipe, self.model, tag, raw, reason)
            self.sink.deliver(pipe, msg, Reply(msg.id, error=Internal(reason)))
            failed.append((statistics.OTHER, msg))
            return None
        batched = self.policy.max_batch_size > 1 and msg.inputs and msg.inputs[0][2]
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

    def _hand_back(self, items: list[Item], *, quiet: bool = False) -> None:
        """Return held, unexecuted requests to the head of their queue (warm shutdown, or
        ``quiet``: batch-job lines a batch had no room for)."""
        if not items:
            return
        pipe = self.client.pipeline(transaction=True)
        for item in reversed(items):
            requeue(
                pipe,
                self.drain.queue,
                item.msg.to_dict(),
                tag=item.tag,
                priority=item.msg.priority,
                reply_to=item.msg.reply_to,
                head=True,
            )
        ack(pipe, self.drain.queue, [i.tag for i in items])
        pipe.execute()
        self.inflight.discard([i.tag for i in items])
        if self.sequencer is not None:
            for item in items:
                self.sequencer.finish(item.ticket)
        if not quiet:
            log.info("%s: handed back %d request(s) it held", self.name, len(items))

    # -- running a batch --------------------------------------------------------------
    def execute(self, batch: list[Item], *, alone: bool = False, cut: str = "") -> None:
        """Run ``batch`` as one execution, or with ``alone`` each request as one of its
        own (as Triton's default scheduler does); either way the replies go together.
        ``cut``: why the dynamic batcher cut it (counted once, with its first execution).
        Every line logged meanwhile (a Python model's too) names the batch's requests."""
        with about(*(_tag(i.msg) for i in batch)):
            log.debug(
                "%s: executing %d request(s), %d row(s)",
                self.name,
                len(batch),
                sum(i.rows for i in batch),
            )
            self._execute(batch, alone, cut)

    def _execute(self, batch: list[Item], alone: bool, cut: str) -> None:
        started = time.time()
        replies: dict[str, Reply] = {}
        backends = self.backends  # one consistent view, should a reload swap it
        runs: list[statistics.Execution] = []
        for group in ([item] for item in batch) if alone else (batch,):
            self._execute_one(group, backends, replies, runs, started)
        if cut and runs:
            runs[0].cut = cut
        lines = sum(i.rows for i in batch if i.msg.priority >= broker.PRIORITY_BULK)
        rows = sum(i.rows for i in batch)
        self.bulk_share.ran(time.time() - started, rows - lines, lines)
        if alone:
            took = (time.time() - started) / max(1, len(batch))
            self._per_request_s = (
                took if not self._per_request_s else (0.8 * self._per_request_s + 0.2 * took)
            )
        if self.sequencer is None:
            # The next pop rides with these replies: one round trip per batch, not two.
            # Not with requests carried over (they lead the next batch), nor while
            # stopping; with preserve_ordering pops take tickets, so they go alone.
            prefetch = not self._carry and not self.stopping.is_set()
            self._send(batch, replies, runs, prefetch=self._count() if prefetch else 0)
        else:
            ordered = sorted(batch, key=lambda i: i.ticket)
            for k, item in enumerate(ordered):
                self.sequencer.wait_turn(item.ticket)
                self._send([item], replies, runs if k == len(ordered) - 1 else [])
                self.sequencer.finish(item.ticket)
        if self.on_batch is not None:
            self.on_batch(self.model, _telemetry(batch, replies, len(batch) if alone else 1))

    def _execute_one(
        self,
        batch: list[Item],
        backends: dict[int, Backend],
        replies: dict[str, Reply],
        runs: list[statistics.Execution],
        started: float,
    ) -> None:
        """One execution of ``batch`` (one per version it names): replies and statistics."""
        latest = max(backends) if backends else -1
        by_version: dict[int, list[Item]] = {}
        for item in batch:
            # -1: the client named no version; the latest this worker serves answers, so
            # a version switch never sends a request to a version that is not loaded yet.
            version = latest if item.msg.version == -1 else item.msg.version
            by_version.setdefault(version, []).append(item)
        for used, items in by_version.items():
            backend = backends.get(used)
            if backend is None:
                err = NotFound(
                    f"Request for unknown model version: '{self.model}' version {used} is not loaded here"
                )
                for item in items:
                    replies[item.tag] = Reply(item.msg.id, error=err)
                continue
            refused: set[str] = set()
            traced = [(i.msg.traceparent, i.msg.enqueued) for i in items]
            with tracing.batch_span(self.model, traced):
                phases = self._run(backend, items, replies, started, refused)
            for item in items:
                replies[item.tag].version = used
            if phases is not None:
                runs.append(self._execution(used, items, replies, phases, refused))

    def _execution(
        self,
        version: int,
        items: list[Item],
        replies: dict[str, Reply],
        phases: tuple[int, int, int],
        refused: set[str],
    ) -> statistics.Execution:
        """The statistics of one execution: its phases, and how its requests ended (a
        request ``refused`` before the model ran fails as OTHER, the others as BACKEND)."""
        now = time.time()
        run = statistics.Execution(version, batch_size=sum(i.rows for i in items))
        run.input_ns, run.infer_ns, run.output_ns = phases
        for item in items:
            reply = replies[item.tag]
            took = max(0, int((now - item.msg.enqueued) * 1e9))
            if reply.error is None:
                run.success += 1
                run.rows += item.rows
                run.success_ns += took
                run.queue_ns += reply.timing.get("queue", 0)
                run.responses_ns.append(took)
                run.queues_ns.append(reply.timing.get("queue", 0))
            else:
                reason = statistics.OTHER if item.tag in refused else statistics.BACKEND
                run.failed(reason, took)
        return run

    def _send(
        self,
        items: list[Item],
        replies: dict[str, Reply],
        runs: list[statistics.Execution],
        *,
        prefetch: int = 0,
    ) -> None:
        """Reply, then ack: a crash in between re-runs the request, never loses it.

        With ``prefetch``, up to that many messages are popped in the same round trip,
        after the acks, for the next batch (``_once`` takes them).
        """
        pipe = Commands()
        now_ms = int(time.time() * 1000)
        for run in runs:
            statistics.record(pipe, self.model, run, now_ms, samples=self.samples)
        if self.on_send is not None:
            self.on_send(pipe)
        self.sink.deliver_all(pipe, [(item.msg, replies[item.tag]) for item in items])
        tags = [i.tag for i in items]
        ack(pipe, self.drain.queue, tags)
        bulk, held = self._bulk_limit(prefetch)
        if prefetch:
            self.drain.queue_pop(pipe, prefetch, bulk, held)
        try:
            results = self._deliver(pipe)
        finally:  # sent, or given up (left for the visibility timeout to bring back)
            self.inflight.discard(tags)
        errors = [r for r in results[: -1 if prefetch else None] if isinstance(r, Exception)]
        if prefetch:
            popped = self.drain.popped(results[-1], prefetch, bulk, held)
            self.inflight.add([tag for tag, _, _ in popped])
            self._prefetched = popped
        if errors:
            raise errors[0]

    def _deliver(self, pipe: Commands) -> list[Any]:
        """Send ``pipe`` (replies, acks), through a Redis outage if need be.

        What ran is answered once Redis is back, and not run again: replies given up
        would leave their messages in flight in Redis, to come back and run a second
        time after the visibility timeout. So this retries until Redis answers, or the
        worker stops. Sending twice is harmless: a caller takes the first reply for a
        request, a job's result is written whole, and acks are deletes.
        """
        away_since = 0.0
        while True:
            try:
                results = self.link.run(pipe)
            except redis.RedisError as exc:
                if not outage.is_outage(exc) or self.stopping.is_set():
                    raise
                if not away_since:
                    away_since = time.monotonic()
                    log.warning(
                        "%s: Redis is away (%s); holding the replies of a batch until it is back",
                        self.name,
                        exc,
                    )
                time.sleep(outage.RECONNECT_S)
                continue
            if away_since:
                log.info(
                    "%s: replies sent %.1f s late, once Redis was back",
                    self.name,
                    time.monotonic() - away_since,
                )
            return results

    def _run(
        self,
        backend: Backend,
        items: list[Item],
        replies: dict[str, Reply],
        started: float,
        refused: set[str],
    ) -> tuple[int, int, int] | None:
        """Run ``items`` on ``backend``; the ns spent reading inputs, computing and
        writing outputs, or None when nothing ran. Requests whose inputs cannot be read
        are answered at once and added to ``refused``."""
        t_in = time.perf_counter_ns()
        requests: list[BackendRequest] = []
        runnable: list[Item] = []
        for item in items:
            try:
                inputs = {
                    name: tensors.to_numpy(dt, shape, raw)
                    for name, dt, shape, raw in item.msg.inputs
                }
            except ConchError as exc:
                replies[item.tag] = Reply(item.msg.id, error=exc)
                refused.add(item.tag)
                continue
            except Exception as exc:
                replies[item.tag] = Reply(
                    item.msg.id, error=InvalidArgument(f"bad input tensor: {exc}")
                )
                refused.add(item.tag)
                continue
            requests.append(
                BackendRequest(
                    inputs,
                    item.msg.outputs,
                    item.msg.client_id,
                    item.msg.params,
                    item.msg.timeout_us,
                    item.msg.deadline,
                    tuple(item.msg.chain),
                    item.msg.priority,
                )
            )
            runnable.append(item)
        if not runnable:
            return None
        t0 = time.perf_counter_ns()
        try:
            results = backend.execute(requests)
        except ConchError as exc:
            results = [exc] * len(requests)
        except Exception as exc:
            log.exception("%s: backend failed", self.name)
            results = [Internal(f"model '{self.model}' failed to execute: {exc}")] * len(requests)
        t_out = time.perf_counter_ns()
        compute_ns = t_out - t0
        rows = sum(i.rows for i in runnable)
        for item, result in zip(runnable, results, strict=True):
            timing = {"queue": int((started - item.msg.enqueued) * 1e9), "compute": compute_ns}
            if isinstance(result, ConchError):
                replies[item.tag] = Reply(item.msg.id, error=result, timing=timing)
                continue
            try:
                outputs = []
                for name in item.msg.outputs:
                    datatype, raw = tensors.from_numpy(result[name], self.output_types.get(name))
                    outputs.append((name, datatype, tuple(result[name].shape), raw))
            except Exception as exc:
                replies[item.tag] = Reply(
                    item.msg.id,
                    error=Internal(f"model '{self.model}' returned a bad output: {exc}"),
                )
                continue
            replies[item.tag] = Reply(item.msg.id, outputs=outputs, timing=timing, batch_size=rows)
        return t0 - t_in, compute_ns, time.perf_counter_ns() - t_out


def _telemetry(batch: list[Item], replies: dict[str, Reply], executions: int) -> dict[str, int]:
    """One batch's counts for this worker's telemetry (``host.WorkerTelemetry``)."""
    failed = sum(1 for i in batch if replies[i.tag].error is not None)
    return {
        "executions": executions,
        "requests": len(batch),
        "rows": sum(i.rows for i in batch),
        "success": len(batch) - failed,
        "failure": failed,
        "queue_us": sum(replies[i.tag].timing.get("queue", 0) for i in batch) // 1000,
        # As Triton counts it: each request is charged its batch's compute time.
        "compute_us": sum(replies[i.tag].timing.get("compute", 0) for i in batch) // 1000,
    }
