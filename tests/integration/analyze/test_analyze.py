"""``conch analyze`` end to end (issue 33): the shipped ``mlp`` swept on a small grid with
the real worker, gateway, Redis and perf_analyzer; the table, the results JSON, the
picture, the pick (at least the default's throughput within the budget) and ``--write``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conch.core.model_config import parse_config

ROOT = Path(__file__).resolve().parents[3]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# The analyzer starts a redis-server of its own, in the child process.
pytestmark = pytest.mark.redis


@pytest.mark.timeout(400)
def test_analyze_picks_at_least_the_default_and_writes_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "functions" / "mlp", repo / "mlp")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "conch", "analyze", "mlp", "--model-repository", str(repo)]
    argv += ["--max-batch-sizes", "8,64", "--queue-delays-us", "0", "--instance-counts", "1"]
    argv += ["--concurrency", "8", "--window-ms", "1000", "--latency-budget-ms", "200"]
    argv += ["--budget-s", "300", "--out", str(out), "--write", "--no-progress"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=380)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert took < 330, f"the sweep took {took:.0f} s, past its --budget-s"

    results = json.loads((out / "results.json").read_text())
    labels = [c["label"] for c in results["configs"]]
    # mlp's own config is max_batch_size 64, 500 us: the grid is it and two others.
    assert len(labels) == 3 and labels[0].startswith("default ("), labels
    assert results["not_measured"] == []
    for config in results["configs"]:
        assert config["label"] in proc.stdout  # the table lists every configuration
        assert [p["concurrency"] for p in config["points"]] == [8], config
        assert all(p["infer_per_s"] > 0 and p["p99_ms"] > 0 for p in config["points"]), config
    assert "best within p99 <= 200 ms" in proc.stdout

    by_label = {c["label"]: c for c in results["configs"]}
    picked, default = by_label[results["best"]], results["configs"][0]
    assert picked["rank"] == 1
    assert picked["best"]["p99_ms"] <= 200
    assert picked["best"]["infer_per_s"] >= default["best"]["infer_per_s"]

    png = out / "mlp.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert (out / "index.html").read_text().count("<img") == 1

    written = repo / "mlp" / "config.pbtxt"
    backup = repo / "mlp" / "config.pbtxt.orig"
    original = (ROOT / "functions" / "mlp" / "config.pbtxt").read_text()
    if picked["default"]:
        assert "left as it is" in proc.stdout
        assert written.read_text() == original and not backup.exists()
        return
    assert backup.read_text() == original
    cfg = parse_config(written.read_text(), model="mlp", source=str(written))
    settings = picked["settings"]
    assert cfg.name == "mlp"
    assert cfg.max_batch_size == settings["max_batch_size"]
    assert (
        cfg.dynamic_batching.max_queue_delay_microseconds
        == settings["max_queue_delay_microseconds"]
    )
    assert [g.count for g in cfg.instance_group] == [settings["instance_count"]]
    assert f"wrote {written}" in proc.stdout
