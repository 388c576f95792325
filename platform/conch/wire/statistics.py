"""Triton's statistics extension: counts and times per model version.

Workers add each batch's numbers to one Redis hash per model, in the pipeline that
already sends the batch's replies (no extra round trip), so every gateway reads the
same current totals, summed over all workers, with no reporting interval in between.
Durations follow Triton's accounting: each request in a batch is charged the batch's
compute time; ``success`` runs from the gateway's enqueue to the worker's reply.

Every failure is also counted under its reason, Triton's ``nv_inference_request_failure``
labels: ``REJECTED`` (its queue was full, or its queue timeout expired before it ran;
Triton's core leaves full-queue refusals out, conch counts them: an operator wants to
see them), ``CANCELED`` (cancelled while queued), ``BACKEND`` (the model failed it) and ``OTHER`` (anything else: checks
before execution, an ensemble whose step failed). ``fail`` is their sum.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from conch.wire.keys import STATS_PREFIX
from conch.wire.redis_link import CommandQueue

log = logging.getLogger(__name__)

# Triton's inference_stats entries, each {"count", "ns"}.
DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
BATCH_PHASES = ("compute_input", "compute_infer", "compute_output")
# Triton's failure reasons (``nv_inference_request_failure``'s ``reason`` label).
REJECTED, CANCELED, BACKEND, OTHER = "REJECTED", "CANCELED", "BACKEND", "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)
CACHE_ERRORS = "cache_error.count"  # conch's: response cache calls that failed (a miss each)


# KEYS: the model's hash. ARGV: version, last-inference ms (0: leave it), then field/amount
# pairs. One command per batch instead of one per counter.
_RECORD_LUA = """
local v = ARGV[1] .. '|'
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], v .. ARGV[i], ARGV[i + 1])
end
if ARGV[2] ~= '0' then
  redis.call('HSET', KEYS[1], v .. 'last_inference', ARGV[2])
end
return 0
"""


def key(model: str) -> str:
    return STATS_PREFIX + model


@dataclass
class Execution:
    """One model execution of one version, and the requests it answered."""

    version: int
    batch_size: int  # rows run together
    rows: int = 0  # rows of the requests that succeeded
    success: int = 0
    success_ns: int = 0
    fail: int = 0
    fail_ns: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # reason -> requests
    queue_ns: int = 0  # summed over the requests that succeeded
    input_ns: int = 0  # the execution's phases, once
    infer_ns: int = 0
    output_ns: int = 0

    def failed(self, reason: str, took_ns: int) -> None:
        """One of its requests failed, for ``reason`` (one of ``FAILURE_REASONS``)."""
        self.fail += 1
        self.fail_ns += took_ns
        self.failures[reason] = self.failures.get(reason, 0) + 1


def record(pipe: CommandQueue, model: str, run: Execution, now_ms: int) -> None:
    """Queue ``run``'s increments on ``pipe`` (the caller executes it)."""
    ok = run.success
    increments = {
        "inference_count": run.rows,
        "execution_count": 1,
        "success.count": ok,
        "success.ns": run.success_ns,
        "fail.count": run.fail,
        "fail.ns": run.fail_ns,
        **{failure_field(r): n for r, n in run.failures.items()},
        "queue.count": ok,
        "queue.ns": run.queue_ns,
        # Triton charges every request in a batch with the whole batch's phases.
        "compute_input.count": ok,
        "compute_input.ns": run.input_ns * ok,
        "compute_infer.count": ok,
        "compute_infer.ns": run.infer_ns * ok,
        "compute_output.count": ok,
        "compute_output.ns": run.output_ns * ok,
        f"batch.{run.batch_size}.count": 1,
        f"batch.{run.batch_size}.compute_input": run.input_ns,
        f"batch.{run.batch_size}.compute_infer": run.infer_ns,
        f"batch.{run.batch_size}.compute_output": run.output_ns,
    }
    _add(pipe, model, run.version, now_ms if ok else 0, increments)


def record_failures(
    pipe: CommandQueue, model: str, version: int, reason: str, took_ns: list[int]
) -> None:
    """Queue the failures of requests that never reached an execution (rejected or
    cancelled in the queue, refused before they ran): ``took_ns`` holds each one's time
    since it was queued."""
    if took_ns:
        increments = {
            "fail.count": len(took_ns),
            "fail.ns": sum(took_ns),
            failure_field(reason): len(took_ns),
        }
        _add(pipe, model, version, 0, increments)


def record_failure(
    client: redis.Redis, model: str, version: int, reason: str, took_ns: int = 0
) -> None:
    """Count one request that failed before a worker took it, at the gateway: refused by
    its full queue (``max_queue_size``, ``REJECTED``) or withdrawn from it when its caller
    went away (``CANCELED``). A round trip of its own: these are the exception."""
    pipe = client.pipeline(transaction=False)
    record_failures(pipe, model, version, reason, [took_ns])
    pipe.execute()


def failure_field(reason: str) -> str:
    """The counter of failures for ``reason``."""
    return f"fail.{reason}.count"


def failures_by_reason(counters: dict[str, int]) -> dict[str, int]:
    """Failures per reason, every reason present. Failures recorded before reasons were
    kept count as ``BACKEND``, the one reason reported then, so the sum is ``fail``."""
    out = {r: counters.get(failure_field(r), 0) for r in FAILURE_REASONS}
    out[BACKEND] += max(0, counters.get("fail.count", 0) - sum(out.values()))
    return out


def _add(
    pipe: CommandQueue, model: str, version: int, last_ms: int, increments: dict[str, int]
) -> None:
    args: list[str | int] = [version, last_ms]
    for name, amount in increments.items():
        if amount:
            args += [name, amount]
    pipe.eval(_RECORD_LUA, 1, key(model), *args)


def cache_hit_counts(took_ns: int, hit_ns: int) -> dict[str, int]:
    """A request the gateway answered from the response cache, counted as Triton counts
    it: a success (``took_ns`` from arrival to answer) with its queue and compute counts
    but none of their time, no inference and no execution; ``cache_hit`` holds the lookup
    and extraction (``hit_ns``)."""
    return {
        "success.count": 1,
        "success.ns": took_ns,
        **{f"{phase}.count": 1 for phase in ("queue", *BATCH_PHASES)},
        "cache_hit.count": 1,
        "cache_hit.ns": hit_ns,
    }


def cache_miss_counts(miss_ns: int, *, errors: int = 0) -> dict[str, int]:
    """A request the cache did not answer (its worker counts the rest): the lookup and
    insertion (``miss_ns``), which Triton also adds to the request's duration; and
    ``errors`` (conch's ``cache_error``): cache calls that failed, each taken as a miss."""
    return {
        "success.ns": miss_ns,
        "cache_miss.count": 1,
        "cache_miss.ns": miss_ns,
        CACHE_ERRORS: errors,
    }


class Tally:
    """Counters added up in this process and written in one round trip at most every
    ``period_s`` (and on ``flush``): a cache hit costs the gateway no Redis call of its
    own. What a process has not flushed yet (at most ``period_s`` of it) is lost if it dies."""

    def __init__(self, client: redis.Redis, period_s: float = 0.05) -> None:
        self.client = client
        self.period_s = period_s
        self._lock = threading.Lock()
        self._due: dict[tuple[str, int], dict[str, int]] = {}
        self._writer: threading.Thread | None = None

    def add(self, model: str, version: int, increments: dict[str, int]) -> None:
        with self._lock:
            due = self._due.setdefault((model, version), {})
            for name, amount in increments.items():
                due[name] = due.get(name, 0) + amount
            if self._writer is None:
                self._writer = threading.Thread(target=self._run, name="stats-tally", daemon=True)
                self._writer.start()

    def flush(self) -> None:
        """Write what has been added up; kept for the next flush if Redis refuses it."""
        with self._lock:
            due, self._due = self._due, {}
        if not due:
            return
        pipe = self.client.pipeline(transaction=False)
        for (model, version), increments in due.items():
            _add(pipe, model, version, 0, increments)
        try:
            pipe.execute()
        except redis.RedisError:
            with self._lock:
                for where, increments in due.items():
                    kept = self._due.setdefault(where, {})
                    for name, amount in increments.items():
                        kept[name] = kept.get(name, 0) + amount
            raise

    def _run(self) -> None:
        while True:
            time.sleep(self.period_s)
            try:
                self.flush()
            except redis.RedisError as exc:
                log.warning("statistics not written yet (kept for the next try): %s", exc)


def record_now(client: redis.Redis, model: str, run: Execution) -> None:
    """Record ``run`` in a round trip of its own (what the gateway runs: ensembles)."""
    pipe = client.pipeline(transaction=False)
    record(pipe, model, run, int(time.time() * 1000))
    pipe.execute()


def read(client: redis.Redis, model: str) -> dict[int, dict[str, int]]:
    """version -> its counters, as recorded so far."""
    out: dict[int, dict[str, int]] = {}
    for raw_field, raw_value in client.hgetall(key(model)).items():
        text = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
        version, _, name = text.partition("|")
        if not version.isdigit():
            continue
        out.setdefault(int(version), {})[name] = int(raw_value)
    return out


def model_stats(name: str, version: int, counters: dict[str, int]) -> dict[str, Any]:
    """One entry of Triton's ``model_stats`` list; every key perf_analyzer reads is present."""

    def duration(phase: str) -> dict[str, int]:
        return {"count": counters.get(f"{phase}.count", 0), "ns": counters.get(f"{phase}.ns", 0)}

    sizes = sorted(
        {int(f.split(".")[1]) for f in counters if f.startswith("batch.") and f.endswith(".count")}
    )
    batch_stats = []
    for size in sizes:
        n = counters.get(f"batch.{size}.count", 0)
        batch_stats.append(
            {
                "batch_size": size,
                **{
                    phase: {"count": n, "ns": counters.get(f"batch.{size}.{phase}", 0)}
                    for phase in BATCH_PHASES
                },
            }
        )
    return {
        "name": name,
        "version": str(version),
        "last_inference": counters.get("last_inference", 0),
        "inference_count": counters.get("inference_count", 0),
        "execution_count": counters.get("execution_count", 0),
        "inference_stats": {phase: duration(phase) for phase in DURATIONS},
        "response_stats": {},
        "batch_stats": batch_stats,
        "memory_usage": [],
    }


__all__ = [
    "BACKEND",
    "CACHE_ERRORS",
    "CANCELED",
    "FAILURE_REASONS",
    "OTHER",
    "REJECTED",
    "Execution",
    "Tally",
    "cache_hit_counts",
    "cache_miss_counts",
    "failure_field",
    "failures_by_reason",
    "key",
    "model_stats",
    "read",
    "record",
    "record_failure",
    "record_failures",
    "record_now",
]
