"""bench/drain.py end to end with a tiny N: a floor, a worker and a gateway row, each
with positive numbers, in its table and in its JSON, and the hops' latency floor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "drain.py"

# The script starts a redis-server of its own, in the child process.
pytestmark = pytest.mark.redis


def test_the_drain_bench_measures_its_three_rows(tmp_path: Path) -> None:
    out = tmp_path / "drain.json"
    argv = [sys.executable, str(SCRIPT), "--quick", "--n", "50", "--concurrency", "4"]
    argv += ["--json", str(out)]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    table = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in proc.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| row ")
    ]
    assert {cells[0] for cells in table} == {"floor", "worker", "bundled", "gateway", "hops"}
    (hops,) = (cells for cells in table if cells[0] == "hops")
    assert hops[3] == "50" and float(hops[4]) > 0  # a mean latency, no cost
    table = [cells for cells in table if cells[0] != "hops"]
    assert "hops batch 1, 1 KiB: p50 " in proc.stdout
    for kind, batch, tensor, n, wall, cpu, redis_cpu, *ratios in table:
        assert n == "50" and tensor in ("1 KiB", "64 KiB"), (kind, batch)
        assert float(wall) > 0 and float(cpu) > 0 and float(redis_cpu) > 0, (kind, batch, tensor)
        assert all(float(r) > 0 for r in ratios), (kind, batch, tensor)
    rows = [r for r in json.loads(out.read_text())["rows"] if r["kind"] != "hops"]
    # Each size: a floor and a worker row at each of three batch sizes, a bundled row at
    # the two that batch, and a gateway row.
    assert len(rows) == len(table) == 2 * (3 + 3 + 2 + 1)
    assert all(r["wall_us"] > 0 and r["cpu_us"] > 0 for r in rows)


def test_the_worker_rows_run_on_the_python_backend_with_python(tmp_path: Path) -> None:
    out = tmp_path / "drain.json"
    argv = [sys.executable, str(SCRIPT), "--n", "40", "--python", "--concurrency", "1"]
    proc = subprocess.run(
        [*argv, "--json", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    # Each reply was checked to be its request's input: the echo model.py answered them.
    workers = [r for r in rows if r["kind"] in ("worker", "bundled")]
    assert len(workers) == 2 * (3 + 2) and all(r["cpu_us"] > 0 for r in workers)
    assert all(r["note"].endswith("on PythonBackend") for r in workers)
