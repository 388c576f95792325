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

Two more kinds of count ride in the same hash: each batch the dynamic batcher cut, by
why (``cut.<reason>.count``), and each successful request's time to its (first and
only) response in the buckets of ``nv_inference_first_response_histogram_ms``
(``first_response.<bound>.count``). A histogram kept as cumulative bucket counters adds
up over workers exactly, as the counters do. Summaries cannot be added up: for those,
workers that keep samples (``--metrics-config summary_latencies=true``) push each
request's latencies onto a list per model (``samples``), trimmed to the newest
``SAMPLES_KEPT``; a gateway computes the quantiles over the ones of the last
``SAMPLES_WINDOW_S``.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from conch.core.batch_policy import CUT_DELAY, CUT_DRAINED, CUT_FULL, CUT_PREFERRED, CUT_REASONS
from conch.wire.keys import SAMPLES_PREFIX, STATS_PREFIX
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
# Triton's nv_inference_first_response_histogram_ms default buckets, in ms.
FIRST_RESPONSE_BUCKETS_MS = (100, 500, 2000, 5000)
FIRST_RESPONSE_NS = "first_response.ns"  # its sum
# The summaries' samples: the latencies of each request, in this order (us).
SAMPLE_PHASES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
SAMPLES_KEPT = 4096  # per model; the newest
SAMPLES_WINDOW_S = 60.0  # a summary's window, as prometheus' default max age
# The model's own counters (``count_model``), beside the versions' in its hash.
_MODEL = "model"
REDELIVERED, DEAD_LETTERED = "redelivered.count", "dead_letter.count"
LOADS, LOAD_MS, LAST_LOAD_MS = "load.count", "load.ms", "load.last_ms"
# Async (infer) and batch jobs, by what happened to them (``conch_jobs_total``).
JOB_SUBMITTED, JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED = (
    "submitted",
    "succeeded",
    "failed",
    "cancelled",
)
JOB_STATES = (JOB_SUBMITTED, JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED)
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
    cut: str = ""  # why the dynamic batcher cut the batch (one of CUT_REASONS); "": not one
    responses_ns: list[int] = field(default_factory=list)  # each success's time to answer
    queues_ns: list[int] = field(default_factory=list)  # and its time queued

    def failed(self, reason: str, took_ns: int) -> None:
        """One of its requests failed, for ``reason`` (one of ``FAILURE_REASONS``)."""
        self.fail += 1
        self.fail_ns += took_ns
        self.failures[reason] = self.failures.get(reason, 0) + 1


def execution_counts(run: Execution) -> dict[str, int]:
    """``run``'s increments to its version's counters, as Triton accounts them. Workers add
    them in Redis (``record``); an embedded server adds them in its own memory."""
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
    if run.cut:
        increments[cut_field(run.cut)] = 1
    for took in run.responses_ns:
        bucket = _FIRST_RESPONSE_FIELDS[bisect.bisect_left(_FIRST_RESPONSE_BOUNDS_NS, took)]
        increments[bucket] = increments.get(bucket, 0) + 1
    if run.responses_ns:
        increments[FIRST_RESPONSE_NS] = sum(run.responses_ns)
    return increments


def record(
    pipe: CommandQueue, model: str, run: Execution, now_ms: int, *, samples: bool = False
) -> None:
    """Queue ``run``'s increments on ``pipe`` (the caller executes it); with ``samples``,
    its requests' latencies for the summaries too."""
    _add(pipe, model, run.version, now_ms if run.success else 0, execution_counts(run))
    if samples and run.responses_ns:
        phases = (run.input_ns // 1000, run.infer_ns // 1000, run.output_ns // 1000)
        entries = [
            sample_entry(now_ms, run.version, (took // 1000, queued // 1000, *phases))
            for took, queued in zip(run.responses_ns, run.queues_ns, strict=True)
        ]
        pipe.lpush(samples_key(model), *entries)
        pipe.ltrim(samples_key(model), 0, SAMPLES_KEPT - 1)


def first_response_counts(took_ns: int) -> dict[str, int]:
    """One response, ``took_ns`` after its request arrived, in the histogram's buckets."""
    bucket = _FIRST_RESPONSE_FIELDS[bisect.bisect_left(_FIRST_RESPONSE_BOUNDS_NS, took_ns)]
    return {bucket: 1, FIRST_RESPONSE_NS: took_ns}


def first_response_field(bound: float | None) -> str:
    """The counter of responses in the bucket up to ``bound`` ms (None: above the last)."""
    return f"first_response.{'inf' if bound is None else bound}.count"


def first_responses(counters: dict[str, int]) -> tuple[list[tuple[str, int]], int, float]:
    """(cumulative (le, count) pairs, ``+Inf`` last; count; sum in ms) of the histogram."""
    pairs, total = [], 0
    for bound in (*FIRST_RESPONSE_BUCKETS_MS, None):
        total += counters.get(first_response_field(bound), 0)
        pairs.append(("+Inf" if bound is None else str(bound), total))
    return pairs, total, counters.get(FIRST_RESPONSE_NS, 0) / 1e6


def samples_key(model: str) -> str:
    return SAMPLES_PREFIX + model


def sample_entry(at_ms: int, version: int, us: tuple[int, ...]) -> str:
    """One request's latencies (``SAMPLE_PHASES``, us), when and in which version."""
    return " ".join(str(v) for v in (at_ms, version, *us))


def read_samples(client: redis.Redis, model: str, since_ms: int) -> dict[int, dict[str, list[int]]]:
    """version -> phase -> the latencies (us) of the requests recorded since ``since_ms``."""
    out: dict[int, dict[str, list[int]]] = {}
    for raw in client.lrange(samples_key(model), 0, -1):
        fields = [int(v) for v in raw.split()]
        if len(fields) != 2 + len(SAMPLE_PHASES) or fields[0] < since_ms:
            continue
        by_phase = out.setdefault(fields[1], {p: [] for p in SAMPLE_PHASES})
        for phase, value in zip(SAMPLE_PHASES, fields[2:], strict=True):
            by_phase[phase].append(value)
    return out


def quantile(values: list[int], q: float) -> float:
    """The ``q`` quantile of ``values``, exact (the nearest rank); NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])


_FIRST_RESPONSE_BOUNDS_NS = tuple(b * 1_000_000 for b in FIRST_RESPONSE_BUCKETS_MS)
_FIRST_RESPONSE_FIELDS = tuple(first_response_field(b) for b in (*FIRST_RESPONSE_BUCKETS_MS, None))


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


def cut_field(reason: str) -> str:
    """The counter of batches cut for ``reason``."""
    return f"cut.{reason}.count"


def cuts_by_reason(counters: dict[str, int]) -> dict[str, int]:
    """Batches the dynamic batcher cut, per reason, every reason present."""
    return {r: counters.get(cut_field(r), 0) for r in CUT_REASONS}


def batch_sizes(counters: dict[str, int]) -> dict[int, int]:
    """Executions per batch size (rows run together), as recorded (``batch.N.count``)."""
    out = {}
    for name, n in counters.items():
        size, _, rest = name.removeprefix("batch.").partition(".")
        if name.startswith("batch.") and rest == "count" and size.isdigit():
            out[int(size)] = n
    return out


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
        **first_response_counts(took_ns),
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
    return read_all(client, model)[0]


def read_all(client: redis.Redis, model: str) -> tuple[dict[int, dict[str, int]], dict[str, int]]:
    """(version -> its counters, the model's own counters: ``count_model``'s)."""
    versions: dict[int, dict[str, int]] = {}
    own: dict[str, int] = {}
    for raw_field, raw_value in client.hgetall(key(model)).items():
        text = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
        version, _, name = text.partition("|")
        if version.isdigit():
            versions.setdefault(int(version), {})[name] = int(raw_value)
        elif version == _MODEL:
            own[name] = int(raw_value)
    return versions, own


def count_model(pipe: CommandQueue, model: str, name: str, amount: int = 1) -> None:
    """Queue an increment of one of the model's own counters, of no version (a request
    redelivered or dead-lettered before its version was known, a load)."""
    pipe.hincrby(key(model), model_field(name), amount)


def job_field(kind: str, state: str) -> str:
    """The model's counter of ``kind`` jobs (infer, batch) that reached ``state``."""
    return f"job.{kind}.{state}.count"


def model_field(name: str) -> str:
    """The hash field of the model's own counter ``name`` (for scripts that add to it)."""
    return f"{_MODEL}|{name}"


def jobs_by_state(own: dict[str, int], kind: str) -> dict[str, int]:
    """The model's ``kind`` jobs per state, every state present."""
    return {state: own.get(job_field(kind, state), 0) for state in JOB_STATES}


def set_model(pipe: CommandQueue, model: str, name: str, value: int) -> None:
    """Queue setting one of the model's own values (the last load's time)."""
    pipe.hset(key(model), model_field(name), value)


def model_stats(name: str, version: int, counters: dict[str, int]) -> dict[str, Any]:
    """One entry of Triton's ``model_stats`` list; every key perf_analyzer reads is present."""

    def duration(phase: str) -> dict[str, int]:
        return {"count": counters.get(f"{phase}.count", 0), "ns": counters.get(f"{phase}.ns", 0)}

    batch_stats = []
    for size, n in sorted(batch_sizes(counters).items()):
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
    "CUT_DELAY",
    "CUT_DRAINED",
    "CUT_FULL",
    "CUT_PREFERRED",
    "CUT_REASONS",
    "DEAD_LETTERED",
    "FAILURE_REASONS",
    "FIRST_RESPONSE_BUCKETS_MS",
    "JOB_CANCELLED",
    "JOB_FAILED",
    "JOB_STATES",
    "JOB_SUBMITTED",
    "JOB_SUCCEEDED",
    "LAST_LOAD_MS",
    "LOADS",
    "LOAD_MS",
    "OTHER",
    "REDELIVERED",
    "REJECTED",
    "SAMPLES_KEPT",
    "SAMPLES_WINDOW_S",
    "SAMPLE_PHASES",
    "Execution",
    "Tally",
    "batch_sizes",
    "cache_hit_counts",
    "cache_miss_counts",
    "count_model",
    "cut_field",
    "cuts_by_reason",
    "execution_counts",
    "failure_field",
    "failures_by_reason",
    "first_response_counts",
    "first_responses",
    "job_field",
    "jobs_by_state",
    "key",
    "model_field",
    "model_stats",
    "quantile",
    "read",
    "read_all",
    "read_samples",
    "record",
    "record_failure",
    "record_failures",
    "record_now",
    "sample_entry",
    "samples_key",
    "set_model",
]
