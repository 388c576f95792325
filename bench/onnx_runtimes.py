#!/usr/bin/env python3
"""The same ONNX MLPs on onnxruntime and on OpenVINO (issue 31, point 5), served and in process.

    make bench                                   # after bench/trees.py
    make bench OV_BENCH_ARGS="--quick"
    .venv/bin/python bench/onnx_runtimes.py --concurrency 16 --window-ms 2000

bench/models.py's ``mlp`` (overhead-bound) and ``mlp_large`` (compute-bound), each served
twice by one conch (a private redis-server on a Unix socket, one worker, one gateway): as
their configs say, on onnxruntime, and as ``<model>_openvino``, the same ``model.onnx`` under
``backend: "openvino"`` (``default_model_filename: "model.onnx"``), batching and instances
unchanged. Both runtimes run one inference thread an instance, conch's default for each.
perf_analyzer drives conch over HTTP (binary tensors) at each concurrency, the two runtimes
of a model back to back. Then, with no server running, each file in process: an onnxruntime
session with conch's options, and an OpenVINO compiled model with the properties conch's
backend gives the ``_openvino`` config, at batch 1 and at each mean batch conch formed.

Progress goes to stderr, the tables to stdout; logs, perf_analyzer CSVs and ``results.json``
to ``.cache/bench/runs/ov-<time>/``. Exit status: 0 when the tables were printed, 2 when the
benchmark could not run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import inprocess  # noqa: E402
import run  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402

import models  # noqa: E402

OV_SUFFIX = "_openvino"
TWINS = {name: name + OV_SUFFIX for name in models.ONNX_MODELS}  # onnxruntime -> OpenVINO
OV_RUNS_ON = 'backend: "openvino"\ndefault_model_filename: "model.onnx"'


def say(msg: str) -> None:
    run.say(msg)


def build_repository(dest: Path) -> Path:
    """``dest`` with each ONNX benchmark model and its OpenVINO twin, sharing one file."""
    source = models.build_repository()
    for onnx_name, ov_name in TWINS.items():
        config = (source / onnx_name / "config.pbtxt").read_text()
        what = (
            "on OpenVINO: the same model.onnx on Triton's openvino backend (bench/onnx_runtimes.py)"
        )
        configs = {
            onnx_name: config,
            ov_name: models.twin_config(config, onnx_name, OV_SUFFIX, OV_RUNS_ON, what),
        }
        for name, text in configs.items():
            (dest / name / "1").mkdir(parents=True, exist_ok=True)
            target = dest / name / "1" / "model.onnx"
            if not target.exists():
                models.link_or_copy(source / onnx_name / "1" / "model.onnx", target)
            (dest / name / "config.pbtxt").write_text(text)
    return dest


def openvino_call(model_dir: Path) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    """A call of the model compiled as conch's openvino backend compiles it for
    ``model_dir``'s config (the properties its parameters give), on the request's own
    tensors as the backend runs it, and the model's input width."""
    from conch.backends.openvino import OpenVinoParameters, load_openvino
    from conch.core.model_config import parse_config

    config = parse_config(
        (model_dir / "config.pbtxt").read_text(), model=model_dir.name, source="config.pbtxt"
    )
    params = OpenVinoParameters.from_config(config)
    ov = load_openvino()
    compiled = ov.Core().compile_model(
        str(model_dir / "1" / "model.onnx"), params.device, params.properties
    )
    request = compiled.create_infer_request()

    def call(x: np.ndarray) -> np.ndarray:
        request.set_input_tensor(ov.Tensor(x, True))
        request.infer()
        return request.get_output_tensor().data.copy()

    return call, int(compiled.input(0).get_partial_shape()[1].get_length())


def bench_inprocess(args: argparse.Namespace, repo: Path, results: run.Results) -> None:
    """Each model's file on both runtimes at batch 1 and the batches conch formed for it."""
    budget = 0.5 if args.quick else 1.5
    for onnx_name, ov_name in TWINS.items():
        if onnx_name not in args.models:
            continue
        session = inprocess.ort_session(repo / onnx_name / "1" / "model.onnx")
        ov_call, width = openvino_call(repo / ov_name)
        formed = run._batches_formed(results, lambda m, pair=(onnx_name, ov_name): m in pair)
        for batch in formed:
            x = np.random.default_rng(batch).standard_normal((batch, width), dtype=np.float32)
            ort_rate = inprocess.rows_per_second(session, batch, budget)
            ov_rate = inprocess.rate(lambda x=x, f=ov_call: f(x), batch, budget)
            results.inprocess.setdefault(onnx_name, {})[batch] = ort_rate
            results.inprocess.setdefault(ov_name, {})[batch] = ov_rate
            run._say_rate(onnx_name, batch, ort_rate)
            run._say_rate(ov_name, batch, ov_rate)


def _cells(p: run.Point | None) -> list[str]:
    if p is None or p.infer_per_s is None:
        return ["n/a"] * 4
    return [
        f"{p.infer_per_s:,.0f}",
        run._f(p.p50_ms, ".2f"),
        run._f(p.p99_ms, ".2f"),
        run._f(p.mean_batch, ".1f"),
    ]


def report(results: run.Results, args: argparse.Namespace) -> str:
    lines = [
        "conch over HTTP (binary tensors): the same model.onnx on onnxruntime and on OpenVINO",
        "| model | c | onnxruntime infer/s | p50 ms | p99 ms | mean batch "
        "| OpenVINO infer/s | p50 ms | p99 ms | mean batch | OpenVINO ÷ onnxruntime |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for onnx_name, ov_name in TWINS.items():
        if onnx_name not in args.models:
            continue
        for c in args.concurrency:
            ort_point = results.get("conch", onnx_name, c)
            ov_point = results.get("conch", ov_name, c)
            ratio = (
                run._ratio(ov_point.infer_per_s / ort_point.infer_per_s)
                if ort_point and ov_point and ort_point.infer_per_s and ov_point.infer_per_s
                else "n/a"
            )
            cells = [onnx_name, str(c), *_cells(ort_point), *_cells(ov_point), ratio]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "in process, one thread each (rows/s)",
        "| model | batch | onnxruntime | OpenVINO | OpenVINO ÷ onnxruntime |",
        "|---|---:|---:|---:|---:|",
    ]
    for onnx_name, ov_name in TWINS.items():
        ort_rates = results.inprocess.get(onnx_name, {})
        for batch, ort_rate in sorted(ort_rates.items()):
            ov_rate = results.inprocess.get(ov_name, {}).get(batch)
            ratio = run._ratio(ov_rate / ort_rate) if ov_rate else "n/a"
            lines.append(
                f"| {onnx_name} | {batch} | {ort_rate:,.0f} | {run._f(ov_rate, ',.0f')} | {ratio} |"
            )
    for p in results.points:
        if p.error:
            lines.append(f"note: {p.model} at c={p.concurrency}: {p.error}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="1 s windows, shorter in-process timing")
    p.add_argument(
        "--models",
        default=",".join(TWINS),
        help=f"comma-separated, from {', '.join(TWINS)} (default: both)",
    )
    p.add_argument("--concurrency", default="1,16,64", help="perf_analyzer's (default 1,16,64)")
    p.add_argument("--window-ms", type=int, default=None, help="default 2000, quick 1000")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = set(args.models) - set(TWINS)
    if unknown:
        p.error(f"unknown model(s) {sorted(unknown)}; choose from {', '.join(TWINS)}")
    # run.bench_conch's options, its defaults but for these.
    conch_args = run.parse_args(["--skip-grpc", "--concurrency", args.concurrency])
    conch_args.models = [m for pair in TWINS.items() if pair[0] in args.models for m in pair]
    args.concurrency = conch_args.concurrency
    args.window_ms = args.window_ms or (1000 if args.quick else 2000)
    args.conch = conch_args
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measure(run_dir: Path, results: run.Results) -> None:
        repo = build_repository(run_dir / "repo")
        pa = run.PaOptions(perf_analyzer.binary(), args.window_ms, 100, 5)
        run.bench_conch(args.conch, repo, pa, run_dir, results, hop_floor=False)
        bench_inprocess(args, repo, results)

    return run.run_script(
        "ov", "OpenVINO", args.window_ms, measure, lambda results: report(results, args)
    )


if __name__ == "__main__":
    sys.exit(main())
