"""Custom metrics that models define (Triton's custom metrics API), and how they add up.

A Python model makes them with ``pb_utils.MetricFamily(name, description, kind)`` and
``family.Metric(labels)``; they then appear on the metrics port beside Triton's own. As in
Triton, where they live in the server, one ``Registry`` per process holds them: creating
a family whose name exists gives that family (its description and kind must agree), and
metrics with the same labels are one metric, shared by every instance that made them,
until the last holder lets go (a family let go takes its metrics with it).

A worker publishes its registry's ``snapshot()`` (``conch.wire.model_metrics``); the
gateway ``merge``s the live workers' snapshots, summing each metric over the workers, and
renders them. So a model's ``Metric.value()`` is its own worker's part of what
``/metrics`` shows when several workers serve it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from conch.core.errors import InvalidArgument, Unsupported

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: a metric's identity


def labels_key(labels: Mapping[str, str] | None) -> Labels:
    """``labels`` as a metric's identity, checked as Prometheus requires."""
    pairs = sorted((labels or {}).items())
    for name, value in pairs:
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise InvalidArgument(f"invalid metric label name {name!r}")
        if not isinstance(value, str):
            raise InvalidArgument(f"metric label '{name}' must have a string value, got {value!r}")
    return tuple(pairs)


@dataclass
class _Metric:
    refs: int = 0
    value: float = 0.0
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds, increasing
    counts: list[int] = field(default_factory=list)  # per bucket, then +Inf; not cumulative
    sum: float = 0.0


@dataclass
class _Family:
    description: str
    kind: str
    refs: int = 0
    metrics: dict[Labels, _Metric] = field(default_factory=dict)


class Registry:
    """One process's custom metrics. Thread-safe; ``version`` grows with every change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self.version = 0

    # -- families and metrics, held and let go --------------------------------------------

    def hold_family(self, name: str, description: str, kind: str) -> None:
        if kind not in KINDS:
            raise InvalidArgument(f"unknown metric kind {kind!r}; expected one of {KINDS}")
        if not _METRIC_NAME.fullmatch(name):
            raise InvalidArgument(f"invalid metric family name {name!r}")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = _Family(description, kind)
            elif (family.description, family.kind) != (description, kind):
                raise InvalidArgument(
                    f"metric family '{name}' already exists as a {family.kind} described as "
                    f"{family.description!r}; it cannot also be a {kind} described as "
                    f"{description!r}"
                )
            family.refs += 1
            self.version += 1

    def drop_family(self, name: str) -> None:
        """One holder let go; the last one removes the family and all its metrics."""
        with self._lock:
            family = self._families.get(name)
            if family is None:
                return
            family.refs -= 1
            if family.refs <= 0:
                del self._families[name]
            self.version += 1

    def hold_metric(self, name: str, labels: Labels, buckets: Iterable[float] | None) -> None:
        with self._lock:
            family = self._family(name)
            if family.kind == HISTOGRAM:
                if buckets is None:
                    raise InvalidArgument(f"histogram '{name}': a metric needs its buckets")
                bounds = tuple(float(b) for b in buckets)
                if any(nxt <= prev for prev, nxt in itertools.pairwise(bounds)):
                    raise InvalidArgument(
                        f"histogram '{name}': buckets must be increasing, got {list(bounds)}"
                    )
            elif buckets is not None:
                raise InvalidArgument(f"{family.kind} '{name}': only histograms take buckets")
            else:
                bounds = ()
            metric = family.metrics.get(labels)
            if metric is None:
                metric = family.metrics[labels] = _Metric(
                    buckets=bounds, counts=[0] * (len(bounds) + 1) if bounds else []
                )
            elif metric.buckets != bounds:
                raise InvalidArgument(
                    f"histogram '{name}' {dict(labels)} already exists with buckets "
                    f"{list(metric.buckets)}"
                )
            metric.refs += 1
            self.version += 1

    def drop_metric(self, name: str, labels: Labels) -> None:
        with self._lock:
            family = self._families.get(name)
            metric = family.metrics.get(labels) if family else None
            if family is None or metric is None:
                return
            metric.refs -= 1
            if metric.refs <= 0:
                del family.metrics[labels]
            self.version += 1

    # -- values ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _changing(
        self, name: str, labels: Labels, kinds: tuple[str, ...], refusal: str
    ) -> Iterator[tuple[_Family, _Metric]]:
        """The metric to change, if its family's kind allows the change; counts it."""
        with self._lock:
            family, metric = self._metric(name, labels)
            if family.kind not in kinds:
                raise Unsupported(f"{family.kind} '{name}' {refusal}")
            yield family, metric
            self.version += 1

    def increment(self, name: str, labels: Labels, amount: float) -> None:
        refusal = "takes observe(), not increment()"
        with self._changing(name, labels, (COUNTER, GAUGE), refusal) as (family, m):
            if family.kind == COUNTER and amount < 0:
                raise InvalidArgument(f"counter '{name}' can only be incremented by a value >= 0")
            m.value += amount

    def set(self, name: str, labels: Labels, value: float) -> None:
        with self._changing(name, labels, (GAUGE,), "cannot be set; only gauges can") as (_, m):
            m.value = value

    def observe(self, name: str, labels: Labels, value: float) -> None:
        with self._changing(name, labels, (HISTOGRAM,), "takes no observations") as (_, m):
            at = next((i for i, b in enumerate(m.buckets) if value <= b), len(m.buckets))
            m.counts[at] += 1
            m.sum += value

    def value(self, name: str, labels: Labels) -> float:
        with self._lock:
            family, metric = self._metric(name, labels)
            if family.kind == HISTOGRAM:
                raise Unsupported(f"histogram '{name}' has no single value")
            return metric.value

    def _family(self, name: str) -> _Family:
        family = self._families.get(name)
        if family is None:
            raise InvalidArgument(f"metric family '{name}' no longer exists")
        return family

    def _metric(self, name: str, labels: Labels) -> tuple[_Family, _Metric]:
        family = self._family(name)
        metric = family.metrics.get(labels)
        if metric is None:
            raise InvalidArgument(f"metric '{name}' {dict(labels)} no longer exists")
        return family, metric

    # -- what a worker publishes ----------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        """Every family and metric, as JSON-ready dicts (the form ``merge`` takes)."""
        with self._lock:
            return [
                {
                    "name": name,
                    "description": family.description,
                    "kind": family.kind,
                    "metrics": [_metric_dict(labels, m) for labels, m in family.metrics.items()],
                }
                for name, family in sorted(self._families.items())
            ]


def _metric_dict(labels: Labels, metric: _Metric) -> dict[str, Any]:
    out: dict[str, Any] = {"labels": dict(labels)}
    if metric.buckets:
        out.update(buckets=list(metric.buckets), counts=list(metric.counts), sum=metric.sum)
    else:
        out["value"] = metric.value
    return out


def merge(snapshots: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Several processes' snapshots as one: each metric summed over the processes that have
    it. A family or histogram that another process defines differently is left out of
    the sum (the first definition, by the order given, counts)."""
    families: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for fam in snapshot:
            merged = families.setdefault(
                fam["name"], {**{k: fam[k] for k in ("name", "description", "kind")}, "by": {}}
            )
            if (merged["description"], merged["kind"]) != (fam["description"], fam["kind"]):
                continue
            for metric in fam["metrics"]:
                key = labels_key(metric["labels"])
                have = merged["by"].get(key)
                if have is None:
                    merged["by"][key] = {**metric, "counts": list(metric.get("counts", []))}
                elif "value" in metric and "value" in have:
                    have["value"] += metric["value"]
                elif metric.get("buckets") == have.get("buckets"):
                    have["counts"] = [
                        a + b for a, b in zip(have["counts"], metric["counts"], strict=True)
                    ]
                    have["sum"] += metric["sum"]
    return [
        {
            "name": f["name"],
            "description": f["description"],
            "kind": f["kind"],
            "metrics": [f["by"][k] for k in sorted(f["by"])],
        }
        for _, f in sorted(families.items())
    ]


def format_value(value: float) -> str:
    """A sample value as Prometheus' text format writes it (integers without a point)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


# The process's registry: what pb_utils.MetricFamily adds to and a worker publishes.
REGISTRY = Registry()

__all__ = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "KINDS",
    "REGISTRY",
    "Labels",
    "Registry",
    "format_value",
    "labels_key",
    "merge",
]
