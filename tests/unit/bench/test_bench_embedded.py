"""bench/embedded.py (issue 33, point 1): its measuring loop and its table."""

from __future__ import annotations

import time

from unit.bench._bench import bench_module


def test_measure_counts_rows_over_the_window_and_reports_latencies() -> None:
    embedded = bench_module("embedded")
    rate, p50, p99, calls = embedded.measure(lambda: time.sleep(0.002), 8, 2, 0.2)
    assert calls > 20
    assert 1.5 <= p50 <= p99 < 50  # each call sleeps 2 ms
    assert 0.5 * 8 * 2 / 0.002 < rate < 8 * 2 / 0.002 * 1.1  # two threads, 8 rows a call


def test_table_gives_every_way_and_the_ratio_to_the_runtime() -> None:
    embedded = bench_module("embedded")
    points = [
        embedded.Point("onnxruntime", 1, 4, 1000.0, 0.5, 1.0, 10),
        embedded.Point("embedded", 1, 4, 800.0, 0.6, 1.2, 8),
        embedded.Point("connected", 1, 4, 200.0, 2.0, 4.0, 2),
    ]
    lines = embedded.table(points).splitlines()
    assert lines[0].startswith("| rows | conc | onnxruntime")
    assert lines[2] == (
        "| 1 | 4 | 1,000 (0.500 / 1.000) | 800 (0.600 / 1.200) | 200 (2.000 / 4.000) | 0.80 |"
    )
