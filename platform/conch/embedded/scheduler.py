"""One loaded model inside an embedded server: its queue, and a thread per instance that
drains it in batches (or the caller's own thread, for a request that would not wait).

The queue is a deque in memory where a fleet has a Redis list. Each instance's thread cuts
batches by Triton's ``dynamic_batching`` exactly as a worker's batcher does
(``core.batch_policy``: a full or preferred-size batch goes at once, else the oldest
request waits at most ``max_queue_delay_microseconds``); a model without dynamic batching
runs each request alone. A batch runs as one ``execute`` per version it names, and every
request's answer goes to its ``Responses``. Requests cancelled or past their deadline
while queued are answered and never run; ``default_queue_policy.max_queue_size`` bounds
the queue with Triton's error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from conch.backends import Backend, BackendRequest
from conch.backends.base import execute_answered
from conch.core.batch_policy import BatchPolicy
from conch.core.errors import Cancelled, ConchError, Internal, Unavailable
from conch.core.repository import ModelEntry
from conch.embedded.counters import Counters
from conch.embedded.responses import Responses
from conch.wire import statistics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caller:
    """What a request inherits from whoever makes it: a deadline (epoch seconds, 0: none),
    the models waiting on it (a BLS call's chain) and its priority step."""

    deadline: float = 0.0
    chain: tuple[str, ...] = ()
    priority: int = 0


CLIENT = Caller()


@dataclass(eq=False)
class Job:
    """A request in an embedded model's queue: what its backend gets, the version it runs,
    its rows (its batch dimension; 1 for a model that does not batch) and its answers."""

    request: BackendRequest
    version: int
    rows: int
    enqueued: float
    responses: Responses


class ModelScheduler:
    """``entry``'s queue, drained into ``slots`` (one dict of backends by version for
    each instance) by a thread each."""

    def __init__(self, entry: ModelEntry, slots: list[dict[int, Backend]], counters: Counters):
        cfg = entry.config
        self.name = entry.name
        self.slots = slots
        self.counters = counters
        self.policy = BatchPolicy.from_config(cfg)
        self.dynamic = cfg.max_batch_size > 0 and cfg.HasField("dynamic_batching")
        self.max_queue_size = (
            cfg.dynamic_batching.default_queue_policy.max_queue_size if self.dynamic else 0
        )
        self.decoupled = cfg.model_transaction_policy.decoupled
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._running = 0  # batches running now
        # Whoever runs a batch on an instance holds its lock: its thread, or a caller that
        # found the instance idle (``submit``).
        self._held = [threading.Lock() for _ in slots]
        self._threads = [
            threading.Thread(
                target=self._loop, args=(i,), name=f"conch-{entry.name}-{i}", daemon=True
            )
            for i in range(len(slots))
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``, or run it at once in the caller's thread; a stopped model or a
        full queue refuses it.

        A request that its batch would not wait for anyway (the queue is empty and it
        alone is a batch the policy sends at once) runs in the caller's thread on an idle
        instance, as its instance's thread would have run it, saving the two handoffs
        between threads that are most of an embedded call's overhead (bench/README.md,
        "conch.Server in process"). A decoupled model's requests always queue, so that
        ``infer`` returns before its responses end."""
        with self._cond:
            if self._stopping:
                raise Unavailable(f"model '{self.name}' is being unloaded")
            if self.max_queue_size and len(self._queue) >= self.max_queue_size:
                self.counters.failed(job.version, statistics.REJECTED, 0)
                raise Unavailable(
                    f"Exceeds maximum queue size: model '{self.name}' already has "
                    f"{self.max_queue_size} requests waiting"
                )
            idle = self._idle_instance(job)
            if idle is None:
                self._queue.append(job)
                self._cond.notify()
                return
            self._running += 1
        now = time.time()
        cut = self.policy.why_cut(job.rows, False, now, now) if self.dynamic else ""
        try:
            self._guarded_run(self.slots[idle], [job], cut)
        finally:
            self._held[idle].release()

    def _idle_instance(self, job: Job) -> int | None:
        """An instance ``job`` may run on now, its lock taken (under the queue's lock)."""
        if self.decoupled or self._queue:
            return None
        if not (self.policy.ready(job.rows) or self.policy.max_queue_delay <= 0):
            return None
        for i, held in enumerate(self._held):
            if held.acquire(blocking=False):
                return i
        return None

    @property
    def idle(self) -> bool:
        """Nothing queued and no batch running."""
        with self._cond:
            return not self._queue and not self._running

    def stop(self, timeout: float = 30.0) -> None:
        """Take no more requests, run those already queued, and let the threads end."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    # -- the instances' threads -----------------------------------------------------------
    def _loop(self, i: int) -> None:
        while True:
            batch, cut = self._next_batch()
            if not batch:
                return
            with self._held[i]:
                self._guarded_run(self.slots[i], batch, cut)

    def _guarded_run(self, slot: dict[int, Backend], batch: list[Job], cut: str) -> None:
        """``_run``, counted in ``_running``; a failure of conch's own answers the batch."""
        try:
            self._run(slot, batch, cut)
        except Exception as exc:  # never lose a request to a bug here
            log.exception("model '%s': a batch failed to run", self.name)
            for job in batch:
                if not job.responses.over:
                    job.responses.fail(Internal(f"model '{self.name}' failed: {exc}"))
        finally:
            with self._cond:
                self._running -= 1

    def _next_batch(self) -> tuple[list[Job], str]:
        """The next batch to run, cut by the policy, and why it was cut; empty once the
        model is stopping and its queue is empty."""
        with self._cond:
            while True:
                self._drop_dead()
                queue = self._queue
                if not queue:
                    if self._stopping:
                        return [], ""
                    self._cond.wait()
                    continue
                rows = [job.rows for job in queue]
                n = self.policy.cut(rows)
                total = sum(rows[:n])
                now = time.time()
                oldest = queue[0].enqueued
                due = oldest + self.policy.max_queue_delay
                if self.policy.ready(total) or n < len(queue) or now >= due or self._stopping:
                    break
                self._cond.wait(min(due - now, _first_deadline(queue) - now))
            batch = [queue.popleft() for _ in range(n)]
            self._running += 1
            cut = self.policy.why_cut(total, bool(queue), oldest, now) if self.dynamic else ""
            return batch, cut

    def _drop_dead(self) -> None:
        """Answer the queued requests whose caller cancelled or whose deadline passed."""
        now = time.time()
        dead = [
            job
            for job in self._queue
            if job.responses.is_cancelled()
            or (job.request.deadline and job.request.deadline <= now)
        ]
        for job in dead:
            self._queue.remove(job)
            took = int((now - job.enqueued) * 1e9)
            if job.responses.is_cancelled():
                self.counters.failed(job.version, statistics.CANCELED, took)
                job.responses.fail(Cancelled(f"request to model '{self.name}' was cancelled"))
            else:
                self.counters.failed(job.version, statistics.REJECTED, took)
                job.responses.fail(
                    Unavailable(
                        f"Request timeout expired for model '{self.name}': it waited in the "
                        "queue past its deadline"
                    )
                )

    def _run(self, slot: dict[int, Backend], batch: list[Job], cut: str) -> None:
        started = time.time()
        by_version: dict[int, list[Job]] = {}
        for job in batch:
            by_version.setdefault(job.version, []).append(job)
        for version, jobs in by_version.items():
            run = statistics.Execution(version, batch_size=sum(j.rows for j in jobs), cut=cut)
            cut = ""  # counted once, with the batch's first execution
            requests = [job.request for job in jobs]
            if self.decoupled:
                for job in jobs:
                    job.request.responder = job.responses
            t0 = time.perf_counter_ns()
            results = execute_answered(slot[version], requests, f"model '{self.name}'")
            t1 = time.perf_counter_ns()
            for job, result in zip(jobs, results, strict=True):
                if result is not None:  # a decoupled model may answer through its responder
                    job.responses.send(result, True)
            t2 = time.perf_counter_ns()
            run.infer_ns, run.output_ns = t1 - t0, t2 - t1
            now = time.time()
            for job, result in zip(jobs, results, strict=True):
                took = max(0, int((now - job.enqueued) * 1e9))
                if isinstance(result, ConchError):
                    run.failed(statistics.BACKEND, took)
                    continue
                queued = max(0, int((started - job.enqueued) * 1e9))
                run.success += 1
                run.rows += job.rows
                run.success_ns += took
                run.queue_ns += queued
                run.responses_ns.append(took)
                run.queues_ns.append(queued)
            self.counters.add(run)


def _first_deadline(queue: deque[Job]) -> float:
    """When the first queued request runs out of time (infinity when none can)."""
    return min((j.request.deadline for j in queue if j.request.deadline), default=float("inf"))


__all__ = ["CLIENT", "Caller", "Job", "ModelScheduler"]
