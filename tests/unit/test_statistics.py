"""The statistics extension's JSON: every key perf_analyzer reads, from recorded counters."""

from __future__ import annotations

from conch.wire.statistics import DURATIONS, model_stats


def test_a_version_with_nothing_recorded_has_every_key_at_zero() -> None:
    s = model_stats("m", 3, {})
    assert s["name"] == "m" and s["version"] == "3"  # a string holding an integer
    assert s["inference_count"] == s["execution_count"] == s["last_inference"] == 0
    assert set(s["inference_stats"]) == set(DURATIONS)
    assert all(d == {"count": 0, "ns": 0} for d in s["inference_stats"].values())
    assert s["batch_stats"] == [] and s["response_stats"] == {} and s["memory_usage"] == []


def test_counters_become_tritons_durations_and_batch_stats() -> None:
    counters = {
        "inference_count": 7,
        "execution_count": 3,
        "success.count": 4,
        "success.ns": 900,
        "queue.count": 4,
        "queue.ns": 400,
        "compute_infer.count": 4,
        "compute_infer.ns": 300,
        "batch.4.count": 1,
        "batch.4.compute_infer": 120,
        "batch.1.count": 2,
        "batch.1.compute_infer": 50,
        "last_inference": 1234,
    }
    s = model_stats("m", 1, counters)
    assert s["inference_stats"]["success"] == {"count": 4, "ns": 900}
    assert s["inference_stats"]["queue"] == {"count": 4, "ns": 400}
    assert s["inference_stats"]["fail"] == {"count": 0, "ns": 0}
    assert [b["batch_size"] for b in s["batch_stats"]] == [1, 4]
    assert s["batch_stats"][1]["compute_infer"] == {"count": 1, "ns": 120}
    assert s["batch_stats"][0]["compute_output"] == {"count": 2, "ns": 0}
    assert s["last_inference"] == 1234
