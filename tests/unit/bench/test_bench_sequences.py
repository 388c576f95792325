"""bench/sequences.py's own parts: the GRU cell it serves, its A/B order and its tables."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from unit.bench._bench import bench_module


@pytest.fixture(scope="module")
def seq():
    return bench_module("sequences")


def test_the_gru_cell_carries_its_state_and_obeys_start_and_ready(seq, tmp_path: Path) -> None:
    import onnxruntime as ort

    path = seq.build_gru(tmp_path, "gru", 8, 16, state_in_redis=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((2, 8), dtype=np.float32)
    one, zero = np.ones((2, 1), np.float32), np.zeros((2, 1), np.float32)

    def step(state, start, ready):
        feed = {"INPUT": x, "START": start, "READY": ready, "STATE_IN": state}
        out, new = session.run(["OUTPUT", "STATE_OUT"], feed)
        assert out.shape == (2, seq.OUTPUT_SIZE)
        return new

    first = step(np.zeros((2, 16), np.float32), one, one)
    second = step(first, zero, one)
    assert not np.allclose(first, second)  # the state moved on
    assert np.allclose(step(second, one, one), first)  # START: back to the initial state
    assert np.array_equal(step(second, zero, zero), second)  # not READY: left as it was
    config = (tmp_path / "gru" / "config.pbtxt").read_text()
    assert "sequence_state_in_redis" not in config and "dims: [ 16 ]" in config
    seq.build_gru(tmp_path, "local", 8, 16, state_in_redis=False)
    assert 'string_value: "false"' in (tmp_path / "local" / "config.pbtxt").read_text()


def test_rounds_alternate_and_points_are_their_mean(seq) -> None:
    assert seq._abba(3) == [seq.MODEL, seq.LOCAL, seq.LOCAL, seq.MODEL, seq.MODEL, seq.LOCAL]
    results = seq.Results()
    point = seq.run.Point
    results.points += [
        point("conch", seq.MODEL, 16, infer_per_s=900, p50_ms=10, p99_ms=20, mean_batch=4),
        point("conch", seq.MODEL, 16, infer_per_s=1100, p50_ms=12, p99_ms=30, mean_batch=6),
        point("conch", seq.MODEL, 16, error="failed"),  # a failed round counts for nothing
        point("conch", seq.LOCAL, 16, infer_per_s=1250, p50_ms=10, p99_ms=20, mean_batch=5),
    ]
    mean = results.get("conch", seq.MODEL, 16)
    assert (mean.infer_per_s, mean.p50_ms, mean.p99_ms, mean.mean_batch) == (1000, 11, 25, 5)
    assert results.get("conch-grpc", seq.MODEL, 16) is None
    results.inprocess = {1: 10_000.0, 5: 40_000.0}
    results.state_us = {"bytes": 1047.0, "pack_us": 2.0, "set_us": 13.0, "commit_us": 25.0}
    args = argparse.Namespace(concurrency=[16], skip_grpc=True, rounds=3, input_size=64, hidden=256)
    text = seq.report(results, args)
    assert "| Redis | http | 16 | 1,000 | 11.00 | 25.00 | 5.0 | 40,000 (batch 5) | 0.0250 |" in text
    assert "| http | 16 | 0.80 | +1.00 | +5.00 |" in text  # Redis ÷ worker, ms added
    assert "15.0 us a step" in text
