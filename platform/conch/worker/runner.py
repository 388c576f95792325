"""A formed batch run on its backend, and its replies sent.

``Runner.run`` executes a batch (one execution per version its requests name, or one per
request for a model without dynamic batching) and gives each request its reply and each
execution its statistics. ``Runner.reply`` sends them in one round trip: the statistics,
the replies, the acks and, when the drain loop asks, the pop of its next batch. With
``preserve_ordering`` each reply waits for its turn (``Sequencer``).

A decoupled model's requests are the exception: each gets a ``streams.Stream`` that its
backend sends every response through as it comes, and is acked with its final response,
not with the batch (``conch.worker.streams``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from conch.backends import Backend, BackendRequest, TensorBackend
from conch.backends.base import execute_answered
from conch.core import tensors, timeline, tracing
from conch.core.errors import ConchError, Internal, NotFound, Unsupported
from conch.core.model_config import output_types
from conch.wire import cancellation, outage, statistics
from conch.wire.messages import Reply
from conch.wire.redis_link import Commands
from conch.worker import stacking
from conch.worker.admission import Item
from conch.worker.drain import Popped, ack
from conch.worker.loop_parts import QueueParts
from conch.worker.streams import StreamGroup, Streams

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BatchResult:
    """What running a batch gave: each request's reply (by ``Item.key``), and the
    statistics of each execution that ran. ``streamed``: the keys of a decoupled model's
    requests, answered through their streams (their replies here are placeholders)."""

    replies: dict[str, Reply]
    runs: list[statistics.Execution]
    streamed: set[str] = field(default_factory=set)


class Runner:
    """Runs one drain loop's batches on its backends (each loaded version's instance in
    its slot) and sends their replies to its sink through its link, with the loop's
    ``parts``.

    Each execution's Triton statistics go to Redis (``conch.wire.statistics``) with its
    replies; the loop's ``on_send(commands)``, if given, may add commands to that round
    trip (the worker's custom metrics, ``metrics_publisher``). ``prefetched(popped)`` gets
    what a pop that rode with the replies took. The loop's ``stopping`` ends the wait for
    a Redis that went away.
    """

    def __init__(self, parts: QueueParts, *, prefetched: Callable[[list[Popped]], None]) -> None:
        self.parts = parts
        self.prefetched = prefetched
        first = next(iter(parts.backends.values()), None)
        # Outputs go out as the config declares them, whatever width the backend used.
        self.output_types = output_types(first.spec.config) if first is not None else {}
        # A decoupled model's requests still streaming (conch.worker.streams).
        self.streams = Streams(parts, output_types=self.output_types)

    # -- running a batch --------------------------------------------------------------
    def run(self, batch: list[Item], *, alone: bool = False, cut: str = "") -> BatchResult:
        """Run ``batch`` as one execution, or with ``alone`` each request as one of its
        own (as Triton's default scheduler does). ``cut``: why the dynamic batcher cut it
        (counted once, with its first execution)."""
        started = time.time()
        result = BatchResult({}, [])
        backends = self.parts.backends  # one consistent view, should a reload swap it
        for group in ([item] for item in batch) if alone else (batch,):
            self._execute_one(group, backends, result, started)
        if cut and result.runs:
            result.runs[0].cut = cut
        return result

    def _execute_one(
        self, batch: list[Item], backends: dict[int, Backend], result: BatchResult, started: float
    ) -> None:
        """One execution of ``batch`` (one per version it names): replies and statistics."""
        replies = result.replies
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
                    f"Request for unknown model version: '{self.parts.model}' version {used} is not loaded here"
                )
                for item in items:
                    replies[item.key] = Reply(item.msg.id, error=err)
                continue
            refused: set[str] = set()
            traced = [(i.msg.traceparent, i.msg.enqueued) for i in items]
            if backend.spec.config.model_transaction_policy.decoupled:  # Backend.decoupled
                with tracing.batch_span(self.parts.model, traced):
                    self._run_streamed(backend, used, items, result, started)
                for item in items:
                    replies[item.key].version = used
                continue
            with tracing.batch_span(self.parts.model, traced):
                phases = self._run(backend, items, replies, started, refused)
            for item in items:
                replies[item.key].version = used
            if phases is not None:
                result.runs.append(self._execution(used, items, replies, phases, refused))

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
            reply = replies[item.key]
            took = max(0, int((now - item.msg.enqueued) * 1e9))
            if reply.error is None:
                run.success += 1
                run.rows += item.rows
                run.success_ns += took
                run.queue_ns += reply.timing.get("queue", 0)
                run.responses_ns.append(took)
                run.queues_ns.append(reply.timing.get("queue", 0))
            else:
                reason = statistics.OTHER if item.key in refused else statistics.BACKEND
                run.failed(reason, took)
        return run

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
        are answered at once and added to ``refused``.

        A ``TensorBackend`` whose model batches gets the batch stacked from the raw bytes
        (``conch.worker.stacking``); other backends, and batches that cannot be stacked so,
        get one ``BackendRequest`` per request, each output encoded per request.
        """
        t_in = time.perf_counter_ns()
        if isinstance(backend, TensorBackend) and backend.batches:
            stacked = stacking.stack(items)
            if stacked is not None:
                return self._run_stacked(backend, stacked, replies, started, refused, t_in)

        requests: list[BackendRequest] = []
        runnable: list[Item] = []
        for item, inputs in zip(items, stacking.request_inputs(items), strict=True):
            if isinstance(inputs, ConchError):
                replies[item.key] = Reply(item.msg.id, error=inputs)
                refused.add(item.key)
                continue
            requests.append(_request(item, inputs, self.parts.client))
            runnable.append(item)
        if not runnable:
            return None
        timeline.stamp("worker.executing")
        t0 = time.perf_counter_ns()
        results = execute_answered(backend, requests, self.parts.name)
        t_out = time.perf_counter_ns()
        timeline.stamp("worker.executed")
        compute_ns = t_out - t0
        rows = sum(i.rows for i in runnable)
        for item, result in zip(runnable, results, strict=True):
            timing = {"queue": int((started - item.msg.enqueued) * 1e9), "compute": compute_ns}
            if isinstance(result, ConchError):
                replies[item.key] = Reply(item.msg.id, error=result, timing=timing)
                continue
            try:
                outputs = tensors.named_outputs(result, item.msg.outputs, self.output_types)
            except Exception as exc:
                replies[item.key] = Reply(
                    item.msg.id,
                    error=Internal(f"model '{self.parts.model}' returned a bad output: {exc}"),
                )
                continue
            replies[item.key] = Reply(item.msg.id, outputs=outputs, timing=timing, batch_size=rows)
        timeline.stamp("worker.encoded")
        return t0 - t_in, compute_ns, time.perf_counter_ns() - t_out

    def _run_streamed(
        self, backend: Backend, version: int, items: list[Item], result: BatchResult, started: float
    ) -> None:
        """One execution of a decoupled model: each request runnable gets a stream (its
        responses go as the model sends them) and a placeholder reply (``streamed``);
        those refused before the model ran get their error reply with the batch. The
        execution's statistics go with its last request's final response, or with the
        batch's replies if every request ended before ``execute`` returned."""
        replies = result.replies
        t_in = time.perf_counter_ns()
        run = statistics.Execution(version, batch_size=sum(i.rows for i in items))
        requests: list[BackendRequest] = []
        runnable: list[Item] = []
        client = self.parts.client
        for item, inputs in zip(items, stacking.request_inputs(items), strict=True):
            request = inputs if isinstance(inputs, ConchError) else _request(item, inputs, client)
            if item.msg.job_ttl and not item.msg.collect:  # one result, not a stream of them
                request = Unsupported(
                    f"model '{self.parts.model}' is decoupled: an async job on it must collect its "
                    "responses (a gateway of this version sends it so)"
                )
            if isinstance(request, ConchError):
                replies[item.key] = Reply(item.msg.id, error=request)
                run.failed(statistics.OTHER, max(0, int((time.time() - item.msg.enqueued) * 1e9)))
                continue
            requests.append(request)
            runnable.append(item)
        if not runnable:
            return
        group = StreamGroup(run, open=len(runnable))
        streams = [self.streams.open(item, version, started, group) for item in runnable]
        for request, stream in zip(requests, streams, strict=True):
            request.responder = stream
        t0 = time.perf_counter_ns()
        results: list[Any] = execute_answered(backend, requests, self.parts.name)
        t_out = time.perf_counter_ns()
        for item, stream, answer in zip(runnable, streams, results, strict=True):
            replies[item.key] = Reply(item.msg.id)
            result.streamed.add(item.key)
            if isinstance(answer, ConchError):
                stream.fail(answer)
            elif answer is not None:  # a backend that answered at once: its one response
                stream.send(answer, True)
        if group.execute_returned((t0 - t_in, t_out - t0, time.perf_counter_ns() - t_out)):
            result.runs.append(run)

    # -- replying ---------------------------------------------------------------------
    def _run_stacked(
        self,
        backend: TensorBackend,
        stacked: stacking.Stack,
        replies: dict[str, Reply],
        started: float,
        refused: set[str],
        t_in: int,
    ) -> tuple[int, int, int] | None:
        """``_run`` for a stacked batch: one execution, each output encoded once."""
        for item, exc in stacked.refused:
            replies[item.key] = Reply(item.msg.id, error=exc)
            refused.add(item.key)
        runnable = stacked.items
        if not runnable:
            return None
        t0 = time.perf_counter_ns()
        failed: ConchError | None = None
        out: dict[str, Any] = {}
        try:
            out = backend.execute_stacked(stacked.inputs, stacked.wanted)
        except ConchError as exc:
            failed = exc
        except Exception as exc:  # as TensorBackend.execute answers a failed group
            failed = Internal(f"model '{self.parts.model}' failed to execute: {exc}")
        t_out = time.perf_counter_ns()
        compute_ns = t_out - t0
        parts = stacking.split(out, stacked, self.output_types) if failed is None else {}
        rows = sum(stacked.rows)
        for k, item in enumerate(runnable):
            timing = {"queue": int((started - item.msg.enqueued) * 1e9), "compute": compute_ns}
            if failed is not None:
                replies[item.key] = Reply(item.msg.id, error=failed, timing=timing)
                continue
            outputs = []
            for name in item.msg.outputs:
                tensor = parts[name]
                if isinstance(tensor, Exception):
                    bad = Internal(f"model '{self.parts.model}' returned a bad output: {tensor}")
                    replies[item.key] = Reply(item.msg.id, error=bad)
                    break
                outputs.append(tensor[k])
            else:
                replies[item.key] = Reply(
                    item.msg.id, outputs=outputs, timing=timing, batch_size=rows
                )
        return t0 - t_in, compute_ns, time.perf_counter_ns() - t_out

    def reply(
        self,
        batch: list[Item],
        result: BatchResult,
        *,
        prefetch: int = 0,
        offline: int | None = None,
        held: bool = True,
    ) -> None:
        """Send ``batch``'s replies, with the statistics of its executions.

        With ``prefetch`` (never with a ``sequencer``: its pops take tickets), up to that
        many messages are popped in the same round trip, at most ``offline`` of them
        offline (``held``: as ``Drain.pop``), and handed to ``prefetched``. With a
        ``sequencer``, each reply goes once every request popped before it has its own.
        """
        streamed = result.streamed  # a decoupled model's: answered through their streams
        if self.parts.sequencer is None:
            sent = [i for i in batch if i.key not in streamed] if streamed else batch
            self._send(sent, result.replies, result.runs, prefetch, offline, held)
            return
        ordered = sorted(batch, key=lambda i: i.ticket)
        for k, item in enumerate(ordered):
            self.parts.sequencer.wait_turn(item.ticket)
            sent = [] if item.key in streamed else [item]
            self._send(sent, result.replies, result.runs if k == len(ordered) - 1 else [])
            self.parts.sequencer.finish(item.ticket)

    def _send(
        self,
        items: list[Item],
        replies: dict[str, Reply],
        runs: list[statistics.Execution],
        prefetch: int = 0,
        offline: int | None = None,
        held: bool = True,
    ) -> None:
        """Reply, then ack (a bundle once all its requests are answered: ``BundleLedger``):
        a crash in between re-runs the request, never loses it."""
        pipe = Commands()
        now_ms = int(time.time() * 1000)
        for run in runs:
            statistics.record(pipe, self.parts.model, run, now_ms, samples=self.parts.samples)
        if self.parts.on_send is not None:
            self.parts.on_send(pipe)
        self.parts.sink.deliver_all(pipe, [(item.msg, replies[item.key]) for item in items])
        tags = self.parts.ledger.settle(items)
        ack(pipe, self.parts.drain.queue, tags)
        if prefetch:
            self.parts.drain.queue_pop(pipe, prefetch, offline, held)
        timeline.stamp("worker.replying")
        try:
            results = self._deliver(pipe)
            timeline.stamp("worker.replied")
        finally:  # sent, or given up (left for the visibility timeout to bring back)
            self.parts.inflight.discard(tags)
        errors = [r for r in results[: -1 if prefetch else None] if isinstance(r, Exception)]
        if prefetch:
            popped = self.parts.drain.popped(results[-1], prefetch, offline, held)
            self.parts.inflight.add([p.tag for p in popped])
            self.prefetched(popped)
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
                results = self.parts.link.run(pipe)
            except redis.RedisError as exc:
                if not outage.is_outage(exc) or self.parts.stopping.is_set():
                    raise
                if not away_since:
                    away_since = time.monotonic()
                    log.warning(
                        "%s: Redis is away (%s); holding the replies of a batch until it is back",
                        self.parts.name,
                        exc,
                    )
                time.sleep(outage.RECONNECT_S)
                continue
            if away_since:
                log.info(
                    "%s: replies sent %.1f s late, once Redis was back",
                    self.parts.name,
                    time.monotonic() - away_since,
                )
            return results


def _request(item: Item, inputs: dict[str, Any], client: redis.Redis) -> BackendRequest:
    """``item``'s request as backends take it, with its ``inputs`` as arrays
    (``stacking.request_inputs``); its ``cancelled`` reads the mark its frontend leaves if
    the caller goes away."""
    msg = item.msg
    return BackendRequest(
        inputs,
        msg.outputs,
        msg.client_id,
        msg.params,
        msg.timeout_us,
        msg.deadline,
        tuple(msg.chain),
        msg.priority,
        cancelled=cancellation.Check(client, msg.id),
    )


def telemetry(batch: list[Item], replies: dict[str, Reply], executions: int) -> dict[str, int]:
    """One batch's counts for this worker's telemetry (``telemetry.WorkerTelemetry``)."""
    failed = sum(1 for i in batch if replies[i.key].error is not None)
    return {
        "executions": executions,
        "requests": len(batch),
        "rows": sum(i.rows for i in batch),
        "success": len(batch) - failed,
        "failure": failed,
        "queue_us": sum(replies[i.key].timing.get("queue", 0) for i in batch) // 1000,
        # As Triton counts it: each request is charged its batch's compute time.
        "compute_us": sum(replies[i.key].timing.get("compute", 0) for i in batch) // 1000,
    }
