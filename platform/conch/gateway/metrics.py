"""Prometheus metrics with Triton's names, served on the metrics port (8002).

Workers count per model; any gateway adds up the live workers' reports, so every
gateway answers the same totals. The queue gauge is read from Redis itself: it is the
number KEDA scales on. Counters of a worker that has gone drop out with it, which
Prometheus reads as a counter reset.
"""

from __future__ import annotations

from typing import Any

from .. import broker, registry
from .catalog import Catalog

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (Triton's metric, worker counter, help text)
COUNTERS = (
    (
        "nv_inference_request_success",
        "success",
        "Number of successful inference requests, all batch sizes",
    ),
    ("nv_inference_count", "rows", "Number of inferences performed (batch elements)"),
    ("nv_inference_exec_count", "executions", "Number of model executions performed"),
    (
        "nv_inference_queue_duration_us",
        "queue_us",
        "Cumulative inference queuing duration in microseconds",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "compute_us",
        "Cumulative compute inference duration in microseconds",
    ),
)


def _labels(labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())


def render(catalog: Catalog) -> bytes:
    """Prometheus text format, written out by hand: Triton's counter names carry no
    ``_total`` (prometheus_client would add one), and values are plain integers."""
    client = catalog.client
    totals: dict[str, dict[str, int]] = {}
    for report in registry.snapshot(client):
        for model, stats in report.get("stats", {}).items():
            mine = totals.setdefault(model, {})
            for key, value in stats.items():
                mine[key] = mine.get(key, 0) + int(value)
    states = catalog.states()
    served = sorted(
        set(totals) | {n for n, e in catalog.entries.items() if e.backend != "ensemble"}
    )

    def version(model: str) -> str:
        versions = states.get(model, {}).get("versions", {})
        ready = [int(v) for v, st in versions.items() if st == registry.READY]
        return str(max(ready)) if ready else "1"

    lines: list[str] = []

    def family(name: str, doc: str, kind: str, rows: list[tuple[dict[str, str], int]]) -> None:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{_labels(labels)}}} {int(value)}" for labels, value in rows)

    for name, key, doc in COUNTERS:
        rows = [
            ({"model": m, "version": version(m)}, totals.get(m, {}).get(key, 0)) for m in served
        ]
        family(name, doc, "counter", rows)
    failures = [
        (
            {"model": m, "reason": "BACKEND", "version": version(m)},
            totals.get(m, {}).get("failure", 0),
        )
        for m in served
    ]
    family(
        "nv_inference_request_failure", "Number of failed inference requests", "counter", failures
    )
    pending = [({"model": m, "version": version(m)}, broker.queue_depth(client, m)) for m in served]
    family(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
        pending,
    )
    return ("\n".join(lines) + "\n").encode()


class MetricsPort:
    """WSGI middleware: the metrics port answers GET /metrics and nothing else."""

    def __init__(self, app: Any, catalog: Catalog, port: int) -> None:
        self.app = app
        self.catalog = catalog
        self.port = str(port)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("SERVER_PORT") != self.port:
            return self.app(environ, start_response)
        if environ.get("PATH_INFO", "").rstrip("/") != "/metrics":
            status, body, ctype = "404 Not Found", b'{"error":"Not Found"}', "application/json"
        elif environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            status, body, ctype = (
                "405 Method Not Allowed",
                b'{"error":"Method Not Allowed"}',
                "application/json",
            )
        else:
            status, body, ctype = "200 OK", render(self.catalog), CONTENT_TYPE
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]
