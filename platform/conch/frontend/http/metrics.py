"""Prometheus metrics with Triton's names, served on the metrics port (8002).

The counters are the statistics extension's (``conch.wire.statistics``): per model version,
summed over every worker that ever ran it and kept in Redis, so any gateway answers
the same totals and a worker that goes away takes nothing with it (no false counter
resets). The pending gauge is what waits in the model's queue, and conch's two queue
gauges the work its workers owe (``conch.wire.work_owed``): waiting by kind, and in
flight; two more, the batch jobs queue's. The same count, in JSON, is ``GET /queue-depth``, which KEDA scales on. After
them come the families models define (``pb_utils.MetricFamily``), as the live
workers publish them (``DataPlane.custom_metrics``). All of it comes from the
``DataPlane``; this module only writes the text.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import orjson

from conch.core import custom_metrics
from conch.core.errors import ConchError, InvalidArgument
from conch.frontend.dataplane import DataPlane, ModelMetrics
from conch.frontend.http.fast_path import error_answer, status_line
from conch.wire import job_store, statistics, work_owed
from conch.wire.statistics import CACHE_ERRORS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (Triton's metric, statistics counter, divisor, help text)
COUNTERS = (
    (
        "nv_inference_request_success",
        "success.count",
        1,
        "Number of successful inference requests, all batch sizes",
    ),
    ("nv_inference_count", "inference_count", 1, "Number of inferences performed (batch elements)"),
    ("nv_inference_exec_count", "execution_count", 1, "Number of model executions performed"),
    (
        "nv_inference_request_duration_us",
        ("success.ns", "fail.ns"),
        1000,
        "Cumulative inference request duration in microseconds",
    ),
    (
        "nv_inference_queue_duration_us",
        "queue.ns",
        1000,
        "Cumulative inference queuing duration in microseconds",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "compute_input.ns",
        1000,
        "Cumulative compute input duration in microseconds",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "compute_infer.ns",
        1000,
        "Cumulative compute inference duration in microseconds",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "compute_output.ns",
        1000,
        "Cumulative compute output duration in microseconds",
    ),
)

LATENCY_COUNTERS = {name for name, *_ in COUNTERS if name.endswith("_duration_us")}

# Triton's latency summaries: (metric, statistics phase, sample phase, help text); count
# and sum are the counters', so they agree with the *_duration_us ones.
SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "success",
        "request",
        "Summary of inference request duration in microseconds",
    ),
    (
        "nv_inference_queue_summary_us",
        "queue",
        "queue",
        "Summary of inference queuing duration in microseconds",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "compute_input",
        "compute_input",
        "Summary of compute input duration in microseconds",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "compute_infer",
        "compute_infer",
        "Summary of compute inference duration in microseconds",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "compute_output",
        "compute_output",
        "Summary of compute output duration in microseconds",
    ),
)
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"

# Triton's response cache families, for the models that use the cache (``cached``).
CACHE_COUNTERS = (
    ("nv_cache_num_hits_per_model", "cache_hit.count", 1, "Number of cache hits per model"),
    ("nv_cache_num_misses_per_model", "cache_miss.count", 1, "Number of cache misses per model"),
    (
        "nv_cache_hit_duration_per_model",
        "cache_hit.ns",
        1000,
        "Total cache hit duration per model, in microseconds",
    ),
    (
        "nv_cache_miss_duration_per_model",
        "cache_miss.ns",
        1000,
        "Total cache miss (insert + lookup) duration per model, in microseconds",
    ),
    (
        "conch_cache_errors_per_model",
        CACHE_ERRORS,
        1,
        "Response cache calls that failed (each request taken as a miss), per model",
    ),
)


def _labels(labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())


def _pending(m: ModelMetrics) -> int:
    """Triton's pending request count: requests waiting to run, not yet running."""
    if m.sequence_model:
        return m.sequence_waiting
    return 0 if m.work is None else m.work.waiting


def render(plane: DataPlane) -> bytes:
    """Prometheus text format, written out by hand: Triton's counter names carry no
    ``_total`` (prometheus_client would add one), and values are plain integers."""
    models = plane.metrics()
    counters = {m.name: m.counters for m in models}

    lines: list[str] = []

    def family(name: str, doc: str, kind: str, rows: list[tuple[dict[str, str], int]]) -> None:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(
            f"{name}{{{_labels(labels)}}} {int(value)}" if labels else f"{name} {int(value)}"
            for labels, value in rows
        )

    def value(c: dict[str, int], fields: str | tuple[str, ...], divisor: int) -> int:
        names = (fields,) if isinstance(fields, str) else fields
        return sum(c.get(f, 0) for f in names) // divisor

    def counter_rows(
        names: list[str], fields: str | tuple[str, ...], divisor: int
    ) -> list[tuple[dict[str, str], int]]:
        return [
            ({"model": m, "version": str(v)}, value(c, fields, divisor))
            for m in names
            for v, c in counters[m].items()
        ]

    config = plane.settings.metrics_config
    for metric, fields, divisor, doc in COUNTERS:
        if metric in LATENCY_COUNTERS and not config.counter_latencies:
            continue
        family(metric, doc, "counter", counter_rows(list(counters), fields, divisor))
    cached = [m.name for m in models if m.cached]
    if cached:
        for metric, fields, divisor, doc in CACHE_COUNTERS:
            family(metric, doc, "counter", counter_rows(cached, fields, divisor))
    failures = [
        ({"model": m.name, "reason": reason, "version": str(v)}, count)
        for m in models
        for v, by_reason in m.failures.items()
        for reason, count in by_reason.items()
    ]
    family(
        "nv_inference_request_failure", "Number of failed inference requests", "counter", failures
    )
    if config.summary_latencies:
        lines += _summaries(models, config.quantiles)
    if config.histogram_latencies:
        lines += _first_response(models)
    _batching(models, family, lines)
    _model_events(models, family, lines)
    queued = [(m, m.work) for m in models if m.work is not None]  # ensembles have no queue
    pending = [
        # The newest version serving, else the newest counted (1 before any). An
        # ensemble's requests wait in its steps' queues, so its own is 0, as in Triton;
        # a sequence model's wait in its sequences' mailboxes.
        ({"model": m.name, "version": str(max(m.ready or m.counters or [1]))}, _pending(m))
        for m in models
    ]
    family(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
        pending,
    )
    # conch's own: the signal workers scale on (conch.wire.work_owed), in its two parts.
    family(
        "conch_queue_waiting",
        "Requests waiting in the model's queue, by kind: online, async (jobs), offline "
        "(batch job lines).",
        "gauge",
        [
            ({"model": m.name, "priority_class": kind}, n)
            for m, w in queued
            for kind, n in w.by_class().items()
        ],
    )
    family(
        "conch_queue_in_flight",
        "Requests a worker has taken from the model's queue (running or prefetched) and not "
        "yet answered, by kind: online, async (jobs), offline (batch job lines).",
        "gauge",
        [
            ({"model": m.name, "priority_class": kind}, n)
            for m, w in queued
            for kind, n in zip(work_owed.PRIORITY_CLASSES, w.held, strict=True)
        ],
    )
    family(
        "conch_sequences_live",
        "Sequences of a sequence model that have started and not ended or idled out: each "
        "holds, or waits for, a worker's slot (counted in the work owed).",
        "gauge",
        [({"model": m.name}, w.sequences) for m, w in queued if m.sequence_model],
    )
    jobs = plane.jobs_depth()  # the batch jobs queue, which every worker takes from
    family(
        "conch_jobs_waiting",
        "Batch jobs waiting for a worker to run them (the conch.jobs queue).",
        "gauge",
        [({}, jobs.waiting)],
    )
    family(
        "conch_jobs_in_flight",
        "Batch jobs a worker has taken and whose driver runs (or ran, on a worker that died "
        "and whose job has not yet gone back to the queue).",
        "gauge",
        [({}, jobs.in_flight)],
    )
    lines += _host_families(*plane.hosts())
    lines += _instance_memory(plane.process_instances())
    builtin = {line.split()[2] for line in lines if line.startswith("# TYPE ")}
    for custom in plane.custom_metrics():
        if custom["name"] not in builtin:  # a model cannot replace one of Triton's
            lines.extend(_custom_family(custom))
    return ("\n".join(lines) + "\n").encode()


def _summaries(models: list[ModelMetrics], quantiles: tuple[tuple[float, float], ...]) -> list[str]:
    """Triton's latency summaries: quantiles over the requests of the last
    ``SAMPLES_WINDOW_S`` that every worker pushed (exact, so each quantile's allowed error
    is met); count and sum from the counters, since the start."""
    out: list[str] = []
    for name, phase, sampled, doc in SUMMARIES:
        out += [f"# HELP {name} {doc}", f"# TYPE {name} summary"]
        for m in models:
            if m.samples is None:
                continue  # an ensemble: its steps have their own
            for version, c in m.counters.items():
                labels = {"model": m.name, "version": str(version)}
                values = m.samples.get(version, {}).get(sampled, [])
                for q, _error in quantiles:
                    value = statistics.quantile(values, q)
                    where = _labels({**labels, "quantile": custom_metrics.format_value(q)})
                    out.append(f"{name}{{{where}}} {custom_metrics.format_value(value)}")
                out.append(f"{name}_sum{{{_labels(labels)}}} {c.get(f'{phase}.ns', 0) // 1000}")
                out.append(f"{name}_count{{{_labels(labels)}}} {c.get(f'{phase}.count', 0)}")
    return out


def _first_response(models: list[ModelMetrics]) -> list[str]:
    """Triton's first-response histogram: every worker's bucket counters, summed."""
    out = [
        f"# HELP {FIRST_RESPONSE} Duration from request to first response in milliseconds",
        f"# TYPE {FIRST_RESPONSE} histogram",
    ]
    for m in models:
        for version, c in m.counters.items():
            labels = {"model": m.name, "version": str(version)}
            buckets, count, total_ms = statistics.first_responses(c)
            out += [
                f"{FIRST_RESPONSE}_bucket{{{_labels({**labels, 'le': le})}}} {n}"
                for le, n in buckets
            ]
            out.append(
                f"{FIRST_RESPONSE}_sum{{{_labels(labels)}}} {custom_metrics.format_value(total_ms)}"
            )
            out.append(f"{FIRST_RESPONSE}_count{{{_labels(labels)}}} {count}")
    return out


# Triton's CPU and GPU gauges: (metric, sample key, help text). Triton labels GPUs by
# gpu_uuid and has one CPU; conch has a CPU per worker host, labelled host.
CPU_GAUGES = (
    ("nv_cpu_utilization", "utilization", "CPU utilization rate [0.0 - 1.0]"),
    ("nv_cpu_memory_total_bytes", "memory_total_bytes", "CPU total memory (RAM), in bytes"),
    ("nv_cpu_memory_used_bytes", "memory_used_bytes", "CPU used memory (RAM), in bytes"),
)
GPU_GAUGES = (
    ("nv_gpu_utilization", "utilization", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "memory_total_bytes", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "memory_used_bytes", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "power_usage", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "power_limit", "GPU power management limit in watts"),
    (
        "nv_energy_consumption",
        "energy_consumption",
        "GPU energy consumption in joules since the driver last reloaded",
    ),
)


def _host_families(cpus: dict[str, dict[str, Any]], gpus: dict[str, dict[str, Any]]) -> list[str]:
    """The live workers' hosts, each host's CPU (and each GPU) once: the freshest report."""
    series = [
        *(
            (name, {"host": h}, c.get(key), doc)
            for name, key, doc in CPU_GAUGES
            for h, c in cpus.items()
        ),
        *(
            (name, {"gpu_uuid": u, "host": g["host"]}, g.get(key), doc)
            for name, key, doc in GPU_GAUGES
            for u, g in gpus.items()
        ),
    ]
    out: list[str] = []
    for name, labels, value, doc in series:
        if value is None:  # a board that does not report power, say
            continue
        if f"# TYPE {name} gauge" not in out:
            out += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
        out.append(f"{name}{{{_labels(labels)}}} {custom_metrics.format_value(value)}")
    return out


INSTANCE_MEMORY = "conch_instance_memory_bytes"


def _instance_memory(instances: list[dict[str, Any]]) -> list[str]:
    """Each process instance's resident memory (``memory="host"``) and, where GPU
    metrics are on, the GPU memory it holds (``memory="gpu"``)."""
    out: list[str] = []
    for inst in instances:
        labels = {k: str(inst.get(k, "")) for k in ("model", "instance", "worker")}
        for memory, key in (("host", "host_bytes"), ("gpu", "gpu_bytes")):
            value = inst.get(key)
            if isinstance(value, int):
                out.append(f"{INSTANCE_MEMORY}{{{_labels({**labels, 'memory': memory})}}} {value}")
    if not out:
        return []
    return [
        f"# HELP {INSTANCE_MEMORY} Memory a model instance running as a process of its own "
        "holds: resident host memory, and GPU memory",
        f"# TYPE {INSTANCE_MEMORY} gauge",
        *out,
    ]


# conch_batch_size's buckets (rows); sizes are counted exactly, so any bucket is exact.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _model_events(
    models: list[ModelMetrics], family: Callable[..., None], lines: list[str]
) -> None:
    """conch's per-model events that have no version: redeliveries, dead letters, loads."""
    queued = [m for m in models if m.work is not None]
    for metric, counter, doc in (
        (
            "conch_redeliveries_total",
            statistics.REDELIVERED,
            "Requests taken again after the worker that held them went away (the "
            "visibility timeout brought them back).",
        ),
        (
            "conch_dead_letters_total",
            statistics.DEAD_LETTERED,
            "Messages set aside for good (conch.deadletter): unreadable, or redelivered "
            "past CONCH_MAX_ATTEMPTS.",
        ),
        ("conch_model_loads_total", statistics.LOADS, "Loads of the model by a worker."),
    ):
        family(metric, doc, "counter", [({"model": m.name}, m.own.get(counter, 0)) for m in queued])
    family(
        "conch_jobs_total",
        "Async (kind infer) and batch jobs of the model, by what happened to them: "
        "submitted, succeeded, failed, cancelled (submitted less the other three are "
        "waiting or running).",
        "counter",
        [
            ({"model": m.name, "kind": kind, "state": state}, n)
            for m in models
            for kind in (job_store.INFER, job_store.BATCH)
            for state, n in statistics.jobs_by_state(m.own, kind).items()
        ],
    )
    loaded = [m for m in queued if statistics.LOADS in m.own]
    for metric, counter, doc in (
        (
            "conch_model_load_seconds_total",
            statistics.LOAD_MS,
            "Time workers spent loading the model (every version and instance, warmup "
            "included), summed over its loads.",
        ),
        (
            "conch_model_load_duration_seconds",
            statistics.LAST_LOAD_MS,
            "How long the model's latest load by a worker took.",
        ),
    ):
        lines += [
            f"# HELP {metric} {doc}",
            f"# TYPE {metric} {'counter' if 'total' in metric else 'gauge'}",
        ]
        lines += [
            f"{metric}{{{_labels({'model': m.name})}}} "
            f"{custom_metrics.format_value(m.own[counter] / 1000)}"
            for m in loaded
        ]


def _batching(models: list[ModelMetrics], family: Callable[..., None], lines: list[str]) -> None:
    """conch's batching families, from the same statistics hash (every version summed):
    the sizes of the executions run, and why the dynamic batcher cut each batch."""
    cuts: dict[str, dict[str, int]] = {}
    sizes: dict[str, dict[int, int]] = {}
    for m in models:
        if m.work is None:
            continue  # an ensemble runs no batches of its own
        cuts[m.name] = dict.fromkeys(statistics.CUT_REASONS, 0)
        sizes[m.name] = {}
        for c in m.counters.values():
            for reason, n in statistics.cuts_by_reason(c).items():
                cuts[m.name][reason] += n
            for size, n in statistics.batch_sizes(c).items():
                sizes[m.name][size] = sizes[m.name].get(size, 0) + n
    family(
        "conch_batch_cut_total",
        "Batches the dynamic batcher cut, by why: full (max_batch_size, or the next request "
        "did not fit), preferred (a preferred_batch_size), delay (max_queue_delay expired), "
        "drained (the queue had no more and no delay was left to wait).",
        "counter",
        [({"model": m, "reason": r}, n) for m, by in cuts.items() for r, n in by.items()],
    )
    name = "conch_batch_size"
    lines.append(f"# HELP {name} Rows per model execution (the batch sizes formed).")
    lines.append(f"# TYPE {name} histogram")
    for model, by_size in sizes.items():
        for bound in BATCH_SIZE_BUCKETS:
            below = sum(n for size, n in by_size.items() if size <= bound)
            lines.append(f"{name}_bucket{{{_labels({'model': model, 'le': str(bound)})}}} {below}")
        total = sum(by_size.values())
        lines.append(f"{name}_bucket{{{_labels({'model': model, 'le': '+Inf'})}}} {total}")
        lines.append(
            f"{name}_sum{{{_labels({'model': model})}}} "
            f"{sum(size * n for size, n in by_size.items())}"
        )
        lines.append(f"{name}_count{{{_labels({'model': model})}}} {total}")


def _custom_family(fam: dict[str, Any]) -> list[str]:
    """A family a model defined (``conch.core.custom_metrics``), in the text format."""
    name, kind = fam["name"], fam["kind"]
    doc = fam["description"].replace("\\", "\\\\").replace("\n", "\\n")
    out = [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]

    def sample(suffix: str, labels: dict[str, str], value: float) -> None:
        where = f"{{{_labels(labels)}}}" if labels else ""
        out.append(f"{name}{suffix}{where} {custom_metrics.format_value(value)}")

    for metric in fam["metrics"]:
        labels = metric["labels"]
        if kind != custom_metrics.HISTOGRAM:
            sample("", labels, metric["value"])
            continue
        total = 0
        for bound, count in zip([*metric["buckets"], math.inf], metric["counts"], strict=True):
            total += count
            sample("_bucket", {**labels, "le": custom_metrics.format_value(bound)}, total)
        sample("_sum", labels, metric["sum"])
        sample("_count", labels, total)
    return out


_SWITCH = {"1": True, "true": True, "0": False, "false": False}


def queue_depth(plane: DataPlane, query: str) -> bytes:
    """``GET /queue-depth?model=a&model=b[&jobs=1]``: the work owed, as KEDA's metrics-api
    trigger reads it (``valueLocation: owed``); no model named: every model with a queue.
    ``jobs=1`` adds the batch jobs queue (a "jobs" entry, and in the totals)."""
    params = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(params) - {"model", work_owed.JOBS_PARAM})
    if unknown:
        raise InvalidArgument(
            f"unknown query parameter {unknown[0]!r}: /queue-depth takes 'model' (repeated "
            f"for more than one) and '{work_owed.JOBS_PARAM}' (1 or 0)"
        )
    switch = params.get(work_owed.JOBS_PARAM, ["0"])
    if len(switch) != 1 or switch[0].lower() not in _SWITCH:
        raise InvalidArgument(f"'{work_owed.JOBS_PARAM}' must be given once, as 1 or 0")
    models = plane.queue_depth(params.get("model", []))
    jobs = plane.jobs_depth() if _SWITCH[switch[0].lower()] else None
    return orjson.dumps(work_owed.summary(models, jobs, plane.residency()))


class MetricsPort:
    """WSGI middleware: the metrics port answers GET /metrics (Prometheus) and
    GET /queue-depth (the work owed, in JSON), and nothing else."""

    def __init__(self, app: Any, plane: DataPlane, port: int) -> None:
        self.app = app
        self.plane = plane
        self.port = str(port)
        self.routes: dict[str, tuple[str, Callable[[str], bytes]]] = {
            "/metrics": (CONTENT_TYPE, lambda _query: render(plane)),
            work_owed.QUEUE_DEPTH_PATH: ("application/json", lambda q: queue_depth(plane, q)),
        }

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("SERVER_PORT") != self.port:
            return self.app(environ, start_response)
        route = self.routes.get(environ.get("PATH_INFO", "").rstrip("/"))
        if route is None:
            status, body, ctype = "404 Not Found", b'{"error":"Not Found"}', "application/json"
        elif environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            status, body, ctype = (
                "405 Method Not Allowed",
                b'{"error":"Method Not Allowed"}',
                "application/json",
            )
        else:
            ctype, answer = route
            try:
                status, body = "200 OK", answer(environ.get("QUERY_STRING", ""))
            except ConchError as exc:  # a bad query; Redis, which holds the counts, away: 503
                code, headers, body = error_answer(exc)
                start_response(status_line(code), headers)
                return [body]
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]
