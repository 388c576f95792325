#!/usr/bin/env python3
"""conch's tensor backends in process, KIND_GPU against KIND_CPU, per batch size.

    .venv/bin/python bench/gpu.py                        # all models, batches 1,8,64
    .venv/bin/python bench/gpu.py --models mlp --batches 1,64 --seconds 2

Each model loads from a one-model repository through the backend class a conch worker
uses (``OnnxRuntimeBackend``, ``PyTorchBackend``), once as a CPU instance and once as a
GPU instance (``cuda:0``), and ``execute()`` runs one request of ``batch`` rows at a time,
timed with ``time.perf_counter`` around each call after a warm-up. The time is what a
worker's batch costs in the backend: host tensors in, host tensors out (the copies to and
from the GPU included), no server, no Redis.

Models:

* ``mlp``: the shipped ``functions/mlp`` (ONNX, 64 -> 256 -> 16), overhead-bound;
* ``mlp_large``: ``bench/models.py``'s compute-bound ONNX MLP 1024 -> 4096 -> 4096 -> 1024
  (~96 MB of weights, generated here from its fixed seed);
* ``tiny_cnn``: the shipped ``functions/tiny_cnn`` (TorchScript), on the pytorch backend.
  Its ``max_batch_size`` is 32, so its largest batch is 32.

CPU instances keep the configs' threads (one intra-op thread, as conch's defaults). A GPU
instance that cannot load here (onnxruntime without CUDAExecutionProvider, a CPU-only
torch, no GPU) gets a row that says why, and the CPU rows still run. Each GPU result is
compared with the CPU result for the same input (max |difference| in the table).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "platform"))

from conch.backends import BackendRequest, InstanceSpec, backend_class  # noqa: E402
from conch.backends.completion import complete  # noqa: E402
from conch.core.errors import ConchError  # noqa: E402
from conch.core.repository import ModelRepository  # noqa: E402

import models  # noqa: E402

MODELS = ("mlp", "mlp_large", "tiny_cnn")


@dataclass
class Row:
    model: str
    backend: str
    kind: str
    batch: int
    iters: int = 0
    median_us: float = 0.0
    p99_us: float = 0.0
    rows_per_s: float = 0.0
    max_abs_diff: float | None = None  # GPU rows: against the CPU result
    note: str = ""


def _place(name: str, repo: Path) -> None:
    """Write model ``name`` under ``repo`` as the shipped (or bench) repository has it."""
    dest = repo / name
    if name == "mlp_large":
        (dest / "1").mkdir(parents=True)
        (dest / "1" / "model.onnx").write_bytes(models.build_large().SerializeToString())
        (dest / "config.pbtxt").write_text(models.LARGE_CONFIG)
    else:
        shutil.copytree(ROOT / "functions" / name, dest)


def _load(repo: Path, name: str, kind: str) -> tuple[Any, str]:
    """The model's backend for one instance of ``kind``, loaded; raises ``ConchError``."""
    entry = ModelRepository(repo, complete=complete, gpu_count=0).scan()[name]
    if entry.error is not None:
        raise RuntimeError(f"model '{name}': {entry.error}")
    spec = entry.spec(entry.latest())
    backend = backend_class(entry.backend)(spec, InstanceSpec(f"{name}_0", kind, 0))
    backend.load()
    return backend, entry.backend


def _input(backend: Any, batch: int, seed: int) -> tuple[dict[str, np.ndarray], list[str]]:
    config = backend.spec.config
    rng = np.random.default_rng(seed)
    inputs = {
        e.name: rng.standard_normal((batch, *(int(d) for d in e.dims))).astype(np.float32)
        for e in config.input
    }
    return inputs, [e.name for e in config.output]


def _time(call: Callable[[], Any], warmup: int, seconds: float, max_iters: int) -> list[float]:
    for _ in range(warmup):
        call()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while len(times) < max_iters and (len(times) < 20 or time.perf_counter() < end):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def _execute(backend: Any, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict:
    [result] = backend.execute([BackendRequest(inputs, outputs)])
    if isinstance(result, ConchError):
        raise result
    return result


def measure(
    name: str, repo: Path, batches: list[int], warmup: int, seconds: float, max_iters: int
) -> list[Row]:
    rows: list[Row] = []
    cpu, backend_name = _load(repo, name, "CPU")
    try:
        gpu, why = _load(repo, name, "GPU")[0], ""
    except ConchError as exc:
        gpu, why = None, exc.message
    limit = cpu.spec.config.max_batch_size or max(batches)
    for batch in sorted({min(b, limit) for b in batches}):
        inputs, outputs = _input(cpu, batch, seed=batch)
        reference = _execute(cpu, inputs, outputs)
        for kind, backend in (("CPU", cpu), ("GPU", gpu)):
            row = Row(name, backend_name, kind, batch)
            rows.append(row)
            if backend is None:
                row.note = f"not run: {why}"
                continue
            if kind == "GPU":
                got = _execute(backend, inputs, outputs)
                row.max_abs_diff = max(
                    float(np.max(np.abs(got[o] - reference[o]))) for o in outputs
                )

            def call(b: Any = backend, i: dict = inputs, o: list = outputs) -> dict:
                return _execute(b, i, o)

            times = _time(call, warmup, seconds, max_iters)
            row.iters = len(times)
            row.median_us = statistics.median(times) * 1e6
            row.p99_us = float(np.percentile(times, 99)) * 1e6
            row.rows_per_s = batch / statistics.median(times)
    for backend in (cpu, gpu):
        if backend is not None:
            backend.unload()
    return rows


def environment() -> dict[str, str]:
    env = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
        env["ort_providers"] = ",".join(onnxruntime.get_available_providers())
    except ImportError:
        pass
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = str(torch.version.cuda)
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return env


def table(rows: list[Row]) -> str:
    head = (
        f"{'model':<10} {'backend':<12} {'kind':<4} {'batch':>5} {'iters':>7} "
        f"{'median us':>10} {'p99 us':>10} {'rows/s':>11} {'GPU/CPU':>8} {'max|diff|':>9}"
    )
    lines = [head, "-" * len(head)]
    cpu = {(r.model, r.batch): r for r in rows if r.kind == "CPU" and r.iters}
    said: set[str] = set()
    for r in rows:
        if not r.iters:
            note = r.note if r.note not in said else "not run (as above)"
            said.add(r.note)
            lines.append(f"{r.model:<10} {r.backend:<12} {r.kind:<4} {r.batch:>5}  {note}")
            continue
        base = cpu.get((r.model, r.batch))
        speedup = f"{base.median_us / r.median_us:.2f}x" if r.kind == "GPU" and base else ""
        diff = f"{r.max_abs_diff:.1e}" if r.max_abs_diff is not None else ""
        lines.append(
            f"{r.model:<10} {r.backend:<12} {r.kind:<4} {r.batch:>5} {r.iters:>7} "
            f"{r.median_us:>10.1f} {r.p99_us:>10.1f} {r.rows_per_s:>11.0f} {speedup:>8} {diff:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"from {','.join(MODELS)}")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--warmup", type=int, default=50, help="calls before timing (default 50)")
    p.add_argument("--seconds", type=float, default=1.0, help="timed seconds per row")
    p.add_argument("--max-iters", type=int, default=20000)
    p.add_argument("--json", type=Path, help="also write the rows and environment here")
    args = p.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    batches = [int(b) for b in args.batches.split(",") if b]
    env = environment()
    print(" ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="conch-gpu-bench-") as tmp:
        repo = Path(tmp)
        for name in names:
            _place(name, repo)
            rows += measure(name, repo, batches, args.warmup, args.seconds, args.max_iters)
            print(f"{name}: done", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"env": env, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
