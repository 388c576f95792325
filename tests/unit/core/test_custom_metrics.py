"""Custom metrics (``pb_utils.MetricFamily``): the registry, pb_utils' API over it, how a
worker publishes it and how the gateway adds workers up and writes the text."""

from __future__ import annotations

import gc
import json
from types import SimpleNamespace
from typing import Any

import pytest

from conch.backends.python import pb_utils as pb
from conch.core import custom_metrics as cm
from conch.core.errors import InvalidArgument, Unsupported
from conch.frontend.http import metrics
from conch.settings import Settings
from conch.wire import model_metrics
from conch.wire.redis_link import Commands
from conch.wire.work_owed import JobsWork
from conch.worker.metrics_publisher import MetricsPublisher

LABELS = cm.labels_key({"version": "1", "model": "m"})


def families(registry: cm.Registry) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in registry.snapshot()}


# -- the registry -------------------------------------------------------------------------


def test_same_name_and_labels_are_one_metric_until_the_last_holder_lets_go() -> None:
    reg = cm.Registry()
    for _ in range(3):  # three instances of one model, as in Triton's custom_metrics example
        reg.hold_family("latency_ns", "Cumulative latency", cm.COUNTER)
        reg.hold_metric("latency_ns", LABELS, None)
        reg.increment("latency_ns", LABELS, 5)
    assert reg.value("latency_ns", LABELS) == 15
    (only,) = families(reg)["latency_ns"]["metrics"]
    assert only == {"labels": {"model": "m", "version": "1"}, "value": 15}
    for _ in range(2):
        reg.drop_metric("latency_ns", LABELS)
    assert reg.value("latency_ns", LABELS) == 15
    reg.drop_metric("latency_ns", LABELS)
    assert families(reg)["latency_ns"]["metrics"] == []
    for _ in range(3):
        reg.drop_family("latency_ns")
    assert reg.snapshot() == []


def test_dropping_the_family_takes_its_metrics() -> None:
    reg = cm.Registry()
    reg.hold_family("g", "a gauge", cm.GAUGE)
    reg.hold_metric("g", LABELS, None)
    reg.drop_family("g")
    with pytest.raises(InvalidArgument, match="no longer exists"):
        reg.set("g", LABELS, 1)


def test_a_name_taken_by_another_kind_or_description_is_refused() -> None:
    reg = cm.Registry()
    reg.hold_family("x", "one thing", cm.COUNTER)
    with pytest.raises(InvalidArgument, match="already exists as a counter"):
        reg.hold_family("x", "one thing", cm.GAUGE)
    with pytest.raises(InvalidArgument, match="already exists"):
        reg.hold_family("x", "another thing", cm.COUNTER)


@pytest.mark.parametrize("name", ["", "1abc", "has space", "dash-ed"])
def test_invalid_family_names(name: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid metric family name"):
        cm.Registry().hold_family(name, "d", cm.COUNTER)


@pytest.mark.parametrize(
    ("labels", "match"),
    [({"__reserved": "v"}, "label name"), ({"bad-name": "v"}, "label name"), ({"n": 1}, "string")],
)
def test_invalid_labels(labels: dict, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        cm.labels_key(labels)


def test_what_each_kind_allows() -> None:
    reg = cm.Registry()
    reg.hold_family("c", "counter", cm.COUNTER)
    reg.hold_metric("c", (), None)
    with pytest.raises(InvalidArgument, match=">= 0"):
        reg.increment("c", (), -1)
    with pytest.raises(Unsupported, match="only gauges"):
        reg.set("c", (), 3)
    with pytest.raises(Unsupported, match="no observations"):
        reg.observe("c", (), 3)
    reg.hold_family("g", "gauge", cm.GAUGE)
    reg.hold_metric("g", (), None)
    reg.set("g", (), 10)
    reg.increment("g", (), -4)
    assert reg.value("g", ()) == 6
    with pytest.raises(InvalidArgument, match="only histograms take buckets"):
        reg.hold_metric("g", LABELS, [1.0])


def test_histogram_counts_observations_per_bucket() -> None:
    reg = cm.Registry()
    reg.hold_family("h", "sizes", cm.HISTOGRAM)
    with pytest.raises(InvalidArgument, match="needs its buckets"):
        reg.hold_metric("h", (), None)
    with pytest.raises(InvalidArgument, match="increasing"):
        reg.hold_metric("h", (), [2.0, 1.0])
    reg.hold_metric("h", (), [1, 5])
    for v in (0.5, 1, 3, 7, 100):
        reg.observe("h", (), v)
    (m,) = families(reg)["h"]["metrics"]
    assert m == {"labels": {}, "buckets": [1.0, 5.0], "counts": [2, 1, 2], "sum": 111.5}
    with pytest.raises(Unsupported, match="no single value"):
        reg.value("h", ())
    with pytest.raises(Unsupported, match="observe"):
        reg.increment("h", (), 1)
    with pytest.raises(InvalidArgument, match="already exists with buckets"):
        reg.hold_metric("h", (), [1, 2])


def test_version_grows_with_every_change() -> None:
    reg = cm.Registry()
    seen = [reg.version]
    reg.hold_family("c", "d", cm.COUNTER)
    seen.append(reg.version)
    reg.hold_metric("c", (), None)
    seen.append(reg.version)
    reg.increment("c", (), 1)
    seen.append(reg.version)
    reg.value("c", ())  # reading changes nothing
    seen.append(reg.version)
    assert seen == sorted(seen) and len(set(seen)) == 4


def test_merge_sums_each_metric_over_workers() -> None:
    one, two = cm.Registry(), cm.Registry()
    for reg, amount in ((one, 3), (two, 4)):
        reg.hold_family("c", "d", cm.COUNTER)
        reg.hold_metric("c", LABELS, None)
        reg.increment("c", LABELS, amount)
        reg.hold_family("h", "hist", cm.HISTOGRAM)
        reg.hold_metric("h", (), [1.0])
        reg.observe("h", (), amount / 4)
    two.hold_metric("c", (("model", "other"),), None)
    odd = [{"name": "c", "description": "something else", "kind": cm.GAUGE, "metrics": []}]
    merged = {f["name"]: f for f in cm.merge([one.snapshot(), two.snapshot(), odd])}
    assert merged["c"]["kind"] == cm.COUNTER
    assert [(m["labels"], m["value"]) for m in merged["c"]["metrics"]] == [
        ({"model": "m", "version": "1"}, 7),
        ({"model": "other"}, 0),
    ]
    (h,) = merged["h"]["metrics"]
    assert h["counts"] == [2, 0] and h["sum"] == 1.75


@pytest.mark.parametrize(
    ("value", "text"),
    [(3.0, "3"), (0.25, "0.25"), (-2, "-2"), (float("inf"), "+Inf"), (float("nan"), "NaN")],
)
def test_format_value(value: float, text: str) -> None:
    assert cm.format_value(value) == text


# -- pb_utils' API ------------------------------------------------------------------------


def test_metric_family_as_tritons_example_uses_it() -> None:
    family = pb.MetricFamily(
        name="unit_requests_ns", description="Time spent", kind=pb.MetricFamily.COUNTER
    )
    metric = family.Metric(labels={"model": "custom_metrics", "version": "1"})
    metric.increment(120)
    metric.increment(30)
    assert metric.value() == 150
    same = pb.MetricFamily(b"unit_requests_ns", b"Time spent", pb.MetricFamily.COUNTER)
    assert same.Metric(labels={b"version": b"1", "model": "custom_metrics"}).value() == 150
    with pytest.raises(pb.TritonModelException, match="only gauges"):
        metric.set(1)
    with pytest.raises(pb.TritonModelException, match=">= 0"):
        metric.increment(-1)


def test_metric_family_refusals_are_triton_model_exceptions() -> None:
    with pytest.raises(pb.TritonModelException, match="unknown kind"):
        pb.MetricFamily("unit_bad_kind", "d", 7)  # type: ignore[arg-type]
    with pytest.raises(pb.TritonModelException, match="invalid metric family name"):
        pb.MetricFamily("bad name", "d", pb.MetricFamily.GAUGE)
    gauge = pb.MetricFamily("unit_gauge", "d", pb.MetricFamily.GAUGE)
    with pytest.raises(pb.TritonModelException, match="Labels must be a dictionary"):
        gauge.Metric(labels=[("a", "b")])  # type: ignore[arg-type]
    with pytest.raises(pb.TritonModelException, match="Buckets must be a list"):
        gauge.Metric(buckets=(1.0,))  # type: ignore[arg-type]
    with pytest.raises(pb.TritonModelException, match="string"):
        gauge.Metric(labels={"n": 1})  # type: ignore[dict-item]
    hist = pb.MetricFamily("unit_hist", "d", pb.MetricFamily.HISTOGRAM)
    sizes = hist.Metric(labels={"m": "x"}, buckets=[1.0, 2.0])
    sizes.observe(1.5)
    with pytest.raises(pb.TritonModelException, match="no single value"):
        sizes.value()


def test_metrics_go_away_with_their_objects() -> None:
    family = pb.MetricFamily("unit_short_lived", "d", pb.MetricFamily.GAUGE)
    metric = family.Metric(labels={"k": "v"})
    metric.set(2)
    assert families(cm.REGISTRY)["unit_short_lived"]["metrics"]
    del metric
    gc.collect()
    assert families(cm.REGISTRY)["unit_short_lived"]["metrics"] == []
    del family
    gc.collect()
    assert "unit_short_lived" not in families(cm.REGISTRY)


# -- publishing and rendering -------------------------------------------------------------


def test_publisher_writes_on_change_and_refreshes_only_what_it_holds() -> None:
    reg = cm.Registry()
    publisher = MetricsPublisher("w1", ttl_s=6, registry=reg)

    def queued(refresh: bool = False) -> list[tuple[Any, ...]]:
        pipe = Commands()
        publisher.queue(pipe, refresh=refresh)
        return pipe.queued

    assert queued() == [] and queued(refresh=True) == []  # no model defined any
    reg.hold_family("c", "d", cm.COUNTER)
    reg.hold_metric("c", (), None)
    (cmd,) = queued()
    assert cmd[:2] == ("SET", model_metrics.key("w1")) and "PX" in cmd and 6000 in cmd
    assert json.loads(cmd[2])[0]["name"] == "c"
    assert queued() == []  # nothing changed since
    assert len(queued(refresh=True)) == 1  # the heartbeat keeps the key alive
    reg.increment("c", (), 1)
    assert json.loads(queued()[0][2])[0]["metrics"][0]["value"] == 1


def test_render_writes_custom_families_after_tritons() -> None:
    reg = cm.Registry()
    reg.hold_family("requests_process_latency_ns", "Cumulative time", cm.COUNTER)
    reg.hold_metric("requests_process_latency_ns", LABELS, None)
    reg.increment("requests_process_latency_ns", LABELS, 1234)
    reg.hold_family("sizes", "Request sizes", cm.HISTOGRAM)
    reg.hold_metric("sizes", (), [1, 2.5])
    reg.observe("sizes", (), 2)
    reg.observe("sizes", (), 9)
    reg.hold_family("nv_inference_count", "an impostor", cm.GAUGE)  # Triton's own name
    plane = SimpleNamespace(
        settings=Settings(),
        metrics=list,
        hosts=lambda: ({}, {}),
        process_instances=list,
        jobs_depth=lambda: JobsWork(waiting=0, in_flight=0),
        custom_metrics=lambda: cm.merge([reg.snapshot()]),
    )
    text = metrics.render(plane).decode()  # type: ignore[arg-type]
    assert (
        "# HELP requests_process_latency_ns Cumulative time\n"
        "# TYPE requests_process_latency_ns counter\n"
        'requests_process_latency_ns{model="m",version="1"} 1234\n'
    ) in text
    assert (
        "# TYPE sizes histogram\n"
        'sizes_bucket{le="1"} 0\n'
        'sizes_bucket{le="2.5"} 1\n'
        'sizes_bucket{le="+Inf"} 2\n'
        "sizes_sum 11\n"
        "sizes_count 2\n"
    ) in text
    assert "an impostor" not in text and text.count("# TYPE nv_inference_count ") == 1
