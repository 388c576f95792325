"""The statistics extension's JSON: every key perf_analyzer reads, from recorded counters."""

from __future__ import annotations

from conch.wire.redis_link import Commands
from conch.wire.statistics import (
    BACKEND,
    CANCELED,
    DURATIONS,
    FAILURE_REASONS,
    OTHER,
    REJECTED,
    Execution,
    failures_by_reason,
    model_stats,
    record,
    record_failures,
)


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


def test_failures_by_reason_every_reason_summing_to_fail() -> None:
    counters = {"fail.count": 7, "fail.REJECTED.count": 2, "fail.OTHER.count": 1}
    # Four failures recorded before reasons were kept: BACKEND, as reported then.
    assert failures_by_reason(counters) == {"REJECTED": 2, "CANCELED": 0, "BACKEND": 4, "OTHER": 1}
    assert failures_by_reason({}) == dict.fromkeys(FAILURE_REASONS, 0)


def test_an_execution_and_queue_failures_record_their_reasons() -> None:
    run = Execution(1, batch_size=3)
    run.failed(BACKEND, 100)
    run.failed(OTHER, 50)
    run.failed(BACKEND, 10)
    assert (run.fail, run.fail_ns, run.failures) == (3, 160, {BACKEND: 2, OTHER: 1})
    pipe = Commands()
    record(pipe, "m", run, 0)
    record_failures(pipe, "m", 2, REJECTED, [5, 7])
    record_failures(pipe, "m", 2, CANCELED, [])  # nothing to add: no command
    assert len(pipe) == 2
    # EVAL, script, 1, key, version, last inference ms, then field/amount pairs
    fields = [dict(zip(cmd[6::2], cmd[7::2], strict=True)) for cmd in pipe.queued]
    assert fields[0]["fail.count"] == 3 and fields[0]["fail.BACKEND.count"] == 2
    assert fields[0]["fail.OTHER.count"] == 1 and fields[0]["execution_count"] == 1
    assert fields[1] == {"fail.count": 2, "fail.ns": 12, "fail.REJECTED.count": 2}
    assert pipe.queued[1][4] == 2  # the version
