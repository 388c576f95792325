"""The bench's overhead and CPU tables (issue 12, points 4 and 5): what they compute."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from unit.bench._bench import bench_run


@pytest.fixture(scope="module")
def run():
    return bench_run()


BATCHED = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 500 }\n"


def _repo(tmp_path: Path, models: tuple[tuple[str, str], ...] | None = None) -> Path:
    for name, extra in models or (("batched", BATCHED), ("plain", "max_batch_size: 0\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n{extra}'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        )
    return tmp_path


def test_overhead_is_p50_less_compute_less_the_configured_delay(run, tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    results = run.Results()
    results.points += [
        run.Point("conch", "batched", 1, infer_per_s=900, p50_ms=1.07, compute_ms=0.05),
        run.Point("triton", "batched", 1, infer_per_s=1100, p50_ms=0.87, compute_ms=0.12),
        run.Point("conch", "plain", 1, infer_per_s=2000, p50_ms=0.45, compute_ms=0.03),
    ]
    args = argparse.Namespace(models=["batched", "plain"], concurrency=[1])
    rows = {
        line.split(" | ")[0].strip("| "): [c.strip() for c in line.strip("|").split("|")]
        for line in run.format_overhead_table(results, args, repo).splitlines()[2:]
    }
    # 1.07 - 0.05 - 0.5 (its max_queue_delay) = 0.52: over the 0.5 ms goal.
    assert rows["batched"][1:6] == ["0.50", "1.07", "0.050", "0.52", "FAIL"]
    assert rows["batched"][6:] == ["0.87", "0.120", "0.25"]
    # No dynamic batching: no delay to take off; 0.42 ms passes; Triton was not run.
    assert rows["plain"][1:] == ["0.00", "0.45", "0.030", "0.42", "PASS", "-", "-", "-"]


def test_compute_per_request_comes_from_the_statistics_counters(run) -> None:
    assert run._compute_ms((10, 5_000_000), (110, 15_000_000)) == pytest.approx(0.1)
    assert run._compute_ms((10, 5_000_000), (10, 5_000_000)) is None


def test_grpc_column_is_measured_against_http_in_the_same_run(run, tmp_path: Path) -> None:
    results = run.Results()
    results.points += [
        run.Point("conch", "mlp", 16, infer_per_s=6000, p50_ms=2.2, p99_ms=5.0, mean_batch=5.0),
        run.Point("conch-grpc", "mlp", 16, infer_per_s=4500, p50_ms=3.1),
    ]
    args = argparse.Namespace(
        models=["mlp"], concurrency=[16], skip_grpc=False, skip_mlserver=True, skip_triton=True
    )
    row = [c.strip() for c in run.format_table(results, args).splitlines()[2].strip("|").split("|")]
    assert row[6:9] == ["4,500", "3.10", "0.75"]  # gRPC infer/s, its p50, gRPC ÷ HTTP
    repo = _repo(tmp_path, (("mlp", BATCHED), ("mlp_large", BATCHED)))
    floor = next(f for f in run.floors(results, repo) if "gRPC" in f[0])
    assert floor[1:] == ("0.75x (4,500 vs 6,000)", "FAIL")
    results.points[1].infer_per_s = 6100
    assert next(f for f in run.floors(results, repo) if "gRPC" in f[0])[2] == "PASS"


def test_cpu_table_has_a_row_per_protocol(run) -> None:
    results = run.Results()
    results.points += [
        run.Point("conch", "mlp", 16, infer_per_s=1000, cpu_ms_per_request={"gateway": 0.2}),
        run.Point("conch-grpc", "mlp", 16, infer_per_s=500, cpu_ms_per_request={"grpc": 0.6}),
    ]
    args = argparse.Namespace(models=["mlp"], concurrency=[16])
    rows = run.format_cpu_table(results, args).splitlines()[2:]
    assert [r.split(" | ")[2] for r in rows] == ["conch HTTP", "conch gRPC"]
    assert rows[1].endswith("| - | 0.60 | - | - | - | - | - | 0.60 | 0.30 |")


def test_instances_are_set_in_a_copy_and_their_memory_tabled(run, tmp_path: Path) -> None:
    """``--instances N``: every instance group's count, in a copy (an ensemble, with no
    group, keeps none); the process instances' memory, from each model's last point."""
    (tmp_path / "repo").mkdir()
    repo = _repo(
        tmp_path / "repo",
        (
            ("two", BATCHED + "instance_group [ { kind: KIND_CPU count: 2 } ]\n"),
            ("ens", 'platform: "ensemble"\n'),
        ),
    )
    copy = run.with_instances(repo, tmp_path / "copy", 3)
    assert "count: 3" in (copy / "two" / "config.pbtxt").read_text()
    assert "count: 2" in (repo / "two" / "config.pbtxt").read_text()
    assert "instance_group" not in (copy / "ens" / "config.pbtxt").read_text()
    results = run.Results()
    mib = 2**20
    results.points += [
        run.Point(
            "conch", "two", 16, instances=[{"instance": "two_0", "pid": 1, "host_bytes": mib}]
        ),
        run.Point(
            "conch",
            "two",
            64,
            instances=[
                {"instance": "two_1", "pid": 9, "host_bytes": 96 * mib, "gpu_bytes": 512 * mib},
                {"instance": "two_0", "pid": 8, "host_bytes": 95 * mib, "gpu_bytes": None},
            ],
        ),
        run.Point("conch", "ens", 64),  # thread instances: no row
    ]
    assert run.format_instance_table(results).splitlines()[2:] == [
        "| two | two_0 | 8 | 95 | - |",
        "| two | two_1 | 9 | 96 | 512 |",
    ]
    assert run.format_instance_table(run.Results()) == ""


def test_issue_42_goals_judge_conch_against_triton_in_the_same_run(run) -> None:
    """Throughput and CPU at 16 and 64 (perf_analyzer's CPU left out on both sides), gRPC
    against Triton's gRPC, p50 at 1; an ONNX model whose Triton twin has its own rows is
    judged there; a point not measured is SKIP."""
    results = run.Results()
    cpu = {"gateway": 0.30, "worker": 0.10, "redis": 0.05, "perf_analyzer": 9.0}
    triton_cpu = {"tritonserver": 0.20, "python_stubs": 0.10, "perf_analyzer": 0.1}
    results.points += [
        run.Point("conch", "mlp_py", 16, infer_per_s=900, cpu_ms_per_request=cpu),
        run.Point("triton", "mlp_py", 16, infer_per_s=1000, cpu_ms_per_request=triton_cpu),
        run.Point("conch-grpc", "mlp_py", 16, infer_per_s=700),
        run.Point("triton-grpc", "mlp_py", 16, infer_per_s=1000),
        run.Point("conch", "mlp_py", 1, p50_ms=1.50),
        run.Point("triton", "mlp_py", 1, p50_ms=1.00),
    ]
    args = argparse.Namespace(models=["mlp", "mlp_py"], concurrency=[1, 16], gpu=False)
    got = {goal: (measured, verdict) for goal, measured, verdict in run.goals(results, args)}
    assert got == {
        "mlp_py c=16: conch >= 0.8x Triton": ("0.90x (900 vs 1,000)", "PASS"),
        # 0.45 / 0.30 ms: conch's gateway, worker and Redis against Triton's server and stubs.
        "mlp_py c=16: conch CPU <= 1.5x Triton's": ("1.50x (0.450 vs 0.300 ms/request)", "PASS"),
        "mlp_py c=16: conch gRPC >= 0.8x Triton gRPC": ("0.70x (700 vs 1,000)", "FAIL"),
        "mlp_py c=1: conch p50 within 0.4 ms of Triton's": ("+0.50 ms (1.50 vs 1.00)", "FAIL"),
    }
    results.points[0].cpu_ms_per_request = {**cpu, "worker": 0.11}
    verdicts = {goal: verdict for goal, _m, verdict in run.goals(results, args)}
    assert verdicts["mlp_py c=16: conch CPU <= 1.5x Triton's"] == "FAIL"
    args.models = ["mlp"]  # its twin, mlp_py, not served to conch: judged on mlp's own rows
    assert {v for _g, _m, v in run.goals(results, args)} == {"SKIP"}


def test_triton_grpc_points_have_rows_of_their_own(run) -> None:
    results = run.Results()
    results.points += [
        run.Point(
            "triton",
            "add_sub",
            16,
            infer_per_s=4000,
            p50_ms=3.9,
            cpu_ms_per_request={"tritonserver": 0.2},
        ),
        run.Point(
            "triton-grpc",
            "add_sub",
            16,
            infer_per_s=2000,
            p50_ms=7.9,
            cpu_ms_per_request={"tritonserver": 0.4},
        ),
    ]
    args = argparse.Namespace(models=["add_sub"], concurrency=[16])
    rows = run.format_triton_table(results, args).splitlines()[2:]
    assert [r.split(" | ")[2:4] for r in rows] == [["HTTP", "4,000"], ["gRPC", "2,000"]]
    cpu_rows = run.format_cpu_table(results, args).splitlines()[2:]
    assert [r.split(" | ")[2] for r in cpu_rows] == ["triton", "triton gRPC"]
