"""conch's Grafana dashboard (charts/conch/dashboards/conch.json), checked three ways.

- It is a dashboard Grafana can load: panels with unique ids on a 24-column grid that
  do not overlap, each query panel on the ``$datasource`` Prometheus with targets of
  unique refIds, and the variables its queries use.
- Every query parses as PromQL (``promql-parser``, Prometheus' grammar) once Grafana's
  variables are put in, and names only metric families and labels conch exports: those
  a real gateway serves on ``GET /metrics`` (a worker and a gateway started here, one
  model with the response cache, so the cache families are there too), plus the
  GPU families below; legends name only labels their query keeps.
- The chart ships it: ``dashboard.enabled`` renders a ConfigMap with Grafana's sidecar
  label and this very JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import promql_parser
import pytest
import requests
import tritonclient.http as httpclient

from harness import fresh_db, start_gateway, start_worker, wait_model_ready
from integration.deploy.test_chart import CHART, render
from models import add_inputs, add_model

DASHBOARD = CHART / "dashboards" / "conch.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# ---------------------------------------------------------------------------------------
# Exported only by a worker host with a GPU (NVML), so never on a machine without one:
# checked against /metrics where they are there, else against this list.
GPU_ONLY: dict[str, set[str]] = {
    name: {"host", "gpu_uuid"}
    for name in (
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
    )
}
# ---------------------------------------------------------------------------------------

# Grafana's variables, as a value PromQL can parse.
_VARIABLES = {"$__rate_interval": "5m", "$model": ".*"}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _query_panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _queries() -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in _query_panels() for t in p["targets"]]


def _promql(expr: str) -> Any:
    for variable, value in _VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return promql_parser.parse(expr)


class Names:
    """What a query names: each selector's metric and label names, the labels its
    aggregations and vector matchings group by, and the labels its result keeps (None:
    whatever its series have)."""

    def __init__(self, expr: Any) -> None:
        self.selectors: list[tuple[str, set[str]]] = []
        self.grouped: list[tuple[set[str], list[str]]] = []  # (labels, metrics beneath)
        self.keeps = self._walk(expr)

    def _walk(self, node: Any) -> set[str] | None:
        kind = type(node).__name__
        if kind == "VectorSelector":
            labels = {m.name for m in node.matchers.matchers}
            self.selectors.append((node.name, labels))
            return None
        if kind == "MatrixSelector":
            return self._walk(node.vector_selector)
        if kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
            return self._walk(node.expr)
        if kind == "AggregateExpr":
            start = len(self.selectors)
            self._walk(node.expr)
            labels = set(node.modifier.labels) if node.modifier else set()
            self.grouped.append((labels, [name for name, _ in self.selectors[start:]]))
            return labels
        if kind == "Call":
            kept = [self._walk(arg) for arg in node.args]
            vectors = [k for k in kept if k is not None]
            result = vectors[-1] if vectors else None
            if node.func.name == "histogram_quantile" and result is not None:
                return result - {"le"}
            return result
        if kind == "BinaryExpr":
            start = len(self.selectors)
            left, right = self._walk(node.lhs), self._walk(node.rhs)
            matching = node.modifier.matching if node.modifier else None
            if matching is not None:
                self.grouped.append(
                    (set(matching.labels), [name for name, _ in self.selectors[start:]])
                )
            return left if left is not None else right
        assert kind in ("NumberLiteral", "StringLiteral"), kind
        return None


# -- the dashboard as Grafana loads it ----------------------------------------------------


def test_it_is_a_dashboard_grafana_loads() -> None:
    dash = _dashboard()
    assert dash["title"] and re.fullmatch(r"[\w-]{1,40}", dash["uid"])
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["model"]["datasource"] == DATASOURCE
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: dict[tuple[int, int], int] = {}
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = cells.setdefault((x, y), panel["id"])
                assert other == panel["id"], f"panels {other} and {panel['id']} overlap"
    for panel in _query_panels():
        assert panel["type"] == "timeseries" and panel["title"], panel
        assert panel["datasource"] == DATASOURCE, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["datasource"] == DATASOURCE and t["expr"] for t in panel["targets"])


def test_it_has_the_panels_operators_asked_for() -> None:
    """Issue 18: request rate and latency percentiles per model, queue depth and work in
    flight, batch sizes and cut reasons, failures by reason, jobs, GPU and CPU use."""
    named = {name for _, t in _queries() for name, _ in Names(_promql(t["expr"])).selectors}
    for family in (
        "nv_inference_request_success",
        "nv_inference_request_summary_us",
        "conch_queue_waiting",
        "conch_queue_in_flight",
        "conch_batch_size_bucket",
        "conch_batch_cut_total",
        "nv_inference_request_failure",
        "conch_jobs_waiting",
        "nv_gpu_utilization",
        "nv_cpu_utilization",
    ):
        assert family in named, family


def test_legends_name_only_labels_their_query_keeps() -> None:
    for title, target in _queries():
        keeps = Names(_promql(target["expr"])).keeps
        shown = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        assert keeps is not None, f"{title}: say which labels the query keeps (by ...)"
        assert shown <= keeps, (title, target["expr"], shown - keeps)


# -- against what a real gateway exports ----------------------------------------------------


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path
) -> Iterator[dict[str, set[str]]]:
    """Each sample name a real gateway's /metrics serves, with its label names, after a
    request to a model that uses the response cache."""
    repo = tmp_path_factory.mktemp("dashboard") / "models"
    add_model(repo / "add", extra="response_cache { enable: true }")
    db = fresh_db(redis_url, 8)
    # Every family the dashboard reads: latency summaries and the first-response histogram
    # are off unless --metrics-config turns them on (workers sample, gateways print).
    observe = (
        "--metrics-config",
        "summary_latencies=true",
        "--metrics-config",
        "histogram_latencies=true",
    )
    worker = start_worker(repo, db, log_dir, *observe)
    gateway, url = start_gateway(
        repo, db, log_dir, "--cache-config", "local,size=1048576", *observe
    )
    try:
        wait_model_ready(url, "add", 90, worker, gateway)
        client = httpclient.InferenceServerClient(url)
        client.infer("add", add_inputs(np.ones((1, 4), np.float32)))
        client.close()
        text = requests.get(f"http://{gateway.metrics_url}/metrics", timeout=10).text
    finally:
        gateway.stop()
        worker.stop()
    yield _samples(text)


# A sample line of Prometheus' text format, and one label pair inside its braces. (Read
# here rather than with prometheus_client's parser, which renames counters' samples
# to the OpenMetrics *_total that Prometheus, reading Triton's text format, never sees.)
_SAMPLE = re.compile(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+\S+$")
_LABEL = re.compile(r'([a-zA-Z_]\w*)="(?:[^"\\]|\\.)*"')


def _samples(text: str) -> dict[str, set[str]]:
    """Each sample name in a /metrics page, with the label names its samples have."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = _SAMPLE.fullmatch(line)
            assert m, f"not a sample line: {line!r}"
            out.setdefault(m[1], set()).update(_LABEL.findall(m[2] or ""))
    return out


def test_every_query_names_families_and_labels_conch_exports(
    exported: dict[str, set[str]],
) -> None:
    known = {**GPU_ONLY, **exported}
    for title, target in _queries():
        names = Names(_promql(target["expr"]))
        for metric, labels in names.selectors:
            assert metric in known, f"{title}: conch exports no {metric}"
            assert labels <= known[metric], (title, metric, labels - known[metric])
        for labels, metrics in names.grouped:
            have = set().union(*(known[m] for m in metrics))
            assert labels <= have, (title, target["expr"], labels - have)


# -- shipped with the chart ----------------------------------------------------------------


def test_the_chart_ships_it_for_grafanas_sidecar() -> None:
    assert not [o for o in render({}) if o["kind"] == "ConfigMap"]  # off by default
    values = {"dashboard": {"enabled": True, "annotations": {"grafana_folder": "conch"}}}
    maps = [o for o in render(values) if o["kind"] == "ConfigMap"]
    assert len(maps) == 1
    meta = maps[0]["metadata"]
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert meta["annotations"] == {"grafana_folder": "conch"}
    assert json.loads(maps[0]["data"]["conch.json"]) == _dashboard()
