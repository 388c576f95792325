#!/usr/bin/env python3
"""A tree model (issue 31, point 5): conch's fil backend against MLServer's XGBoost runtime.

    make bench                                   # after bench/streaming.py
    make bench TREE_BENCH_ARGS="--quick"
    .venv/bin/python bench/trees.py --concurrency 16,64 --batches 256

The model is the shipped ``functions/breast_cancer_xgb`` (``make functions`` trains it):
50 XGBoost trees over 30 features, served under Triton FIL's config (``backend: "fil"``,
``predict_proba``, ``cpu_nthread`` 1, ``max_batch_size`` 32,768, dynamic batching). The
requests hold real rows of the data set it was trained on (``--input-data``), one row or
``--batches`` rows each (perf_analyzer's ``-b``). One run measures, at each concurrency and
request size:

1. conch: a private redis-server on a Unix socket, one ``conch worker``, one ``conch
   gateway``, driven by ``perf_analyzer -i http`` with binary tensors (``conch``), then with
   JSON tensors (``conch-json``: the wire MLServer is driven over);
2. MLServer 1.7.1 with ``mlserver-xgboost``, the runtime a tree-model user would pick, on
   the same file, one process, adaptive batching off and on (the config's bounds), JSON
   tensors (it has no binary tensor extension). Its runtime is used as it is
   (``bench/mlserver_xgb_runtime.py`` adds only what perf_analyzer needs), with the same
   thread count as conch's instance;
3. in process, with no server running: ``xgboost`` on the same file, one thread,
   ``Booster.inplace_predict`` (what conch's backend calls), at each request size and at
   each mean batch conch formed.

Before measuring, each server's answer to 8 rows is checked against xgboost's in process.
Goal (issue 31): conch's inferences/s at least MLServer's best at concurrency 16 and 64.

Progress goes to stderr, the tables to stdout; logs, perf_analyzer CSVs and ``results.json``
to ``.cache/bench/runs/trees-<time>/``. Exit status: 0 when the tables were printed, 2 when
the benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "functions"))

import build_tree_model  # noqa: E402
import inprocess  # noqa: E402
import procs  # noqa: E402
import run  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402

MODEL = build_tree_model.NAME
MODEL_FILE = build_tree_model.FILENAME
INPUT = "input__0"  # the config's input
MLSERVER_OUTPUT = "predict"  # mlserver-xgboost's default output: P(class 1) a row
SAMPLES = 8  # rows perf_analyzer cycles through, and the answers checked
GOAL = 1.0  # conch's infer/s over MLServer's best, at least
GOAL_CONCURRENCY = (16, 64)
AGREE_ATOL = 1e-6


def say(msg: str) -> None:
    run.say(msg)


def build_repository(dest: Path) -> Path:
    """``dest`` holding the shipped model as ``functions/`` has it."""
    source = ROOT / "functions" / MODEL
    if not (source / "1" / MODEL_FILE).exists():
        raise RuntimeError(f"{source}/1/{MODEL_FILE} is missing: run `make functions`")
    shutil.copytree(source, dest / MODEL, dirs_exist_ok=True)
    return dest


def sample_rows() -> np.ndarray:
    """``SAMPLES`` rows of the data set, spread over it (both classes among them)."""
    x, _ = build_tree_model.dataset()
    return x[np.linspace(0, len(x) - 1, SAMPLES).astype(int)]


def write_input_data(dest: Path) -> Path:
    """perf_analyzer ``--input-data``: one real row a request, a row repeated for ``-b``."""
    rows = sample_rows()
    data = [{INPUT: {"content": [float(v) for v in row], "shape": [len(row)]}} for row in rows]
    dest.write_text(json.dumps({"data": data}))
    return dest


def booster(repo: Path, threads: int) -> Any:
    import xgboost as xgb

    model = xgb.Booster(model_file=str(repo / MODEL / "1" / MODEL_FILE))
    model.set_param({"nthread": threads})
    return model


def threads(repo: Path) -> int:
    """The config's ``cpu_nthread``: the thread count every contender gets."""
    config = run._triton_config(repo / MODEL)
    return int(config["parameters"]["cpu_nthread"]["string_value"])


# --------------------------------------------------------------------------- answers


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.load(resp)


def check_answers(url: str, output: str, column: int, expected: np.ndarray) -> None:
    """The server at ``url`` answers ``sample_rows()`` with ``expected`` (P(class 1)) in
    ``column`` of its ``output`` (a row's values: P(class 1) alone, or one a class)."""
    rows = sample_rows()
    body = {
        "inputs": [
            {
                "name": INPUT,
                "datatype": "FP32",
                "shape": list(rows.shape),
                "data": rows.ravel().tolist(),
            }
        ],
        "outputs": [{"name": output}],
    }
    doc = _post(f"http://{url}/v2/models/{MODEL}/infer", body)
    out = next(o for o in doc["outputs"] if o["name"] == output)
    got = np.asarray(out["data"], np.float32).reshape(len(rows), -1)[:, column]
    if not np.allclose(got, expected, atol=AGREE_ATOL):
        raise RuntimeError(f"{url} answers {got.tolist()}, xgboost in process {expected.tolist()}")


# --------------------------------------------------------------------------- MLServer


def write_mlserver_repo(variant: str, repo: Path, dest: Path, port: int, nthread: int) -> Path:
    """MLServer's repository for one variant: mlserver-xgboost on the model's file, and the
    Triton config perf_analyzer reads, with the runtime's output in place of FIL's."""
    run.write_mlserver_settings(dest, port)
    config = run._triton_config(repo / MODEL)
    config["output"] = [{"name": MLSERVER_OUTPUT, "data_type": "TYPE_FP32", "dims": []}]
    delay_us = int(config["dynamic_batching"].get("max_queue_delay_microseconds", 0))
    settings: dict[str, Any] = {
        "name": MODEL,
        "implementation": "mlserver_xgb_runtime.XGBoostBenchModel",
        "inputs": run._metadata_tensors(config["input"], True),
        "outputs": run._metadata_tensors(config["output"], True),
        "parameters": {
            "uri": str(repo / MODEL / "1" / MODEL_FILE),
            "extra": {"nthread": nthread, "triton_config": config},
        },
        "max_batch_size": int(config["max_batch_size"]) if variant == "batch" else 0,
        "max_batch_time": delay_us / 1e6 if variant == "batch" else 0,
    }
    (dest / MODEL).mkdir(parents=True, exist_ok=True)
    (dest / MODEL / "model-settings.json").write_text(json.dumps(settings, indent=2))
    return dest


def bench_mlserver(
    args: argparse.Namespace,
    repo: Path,
    pa: run.PaOptions,
    run_dir: Path,
    results: run.Results,
    expected: np.ndarray,
) -> None:
    from conch.devtools.redis_server import free_port

    if not run.MLSERVER_BIN.exists():
        raise RuntimeError(
            f"MLServer is not installed in {run.MLSERVER_VENV}: run `make bench` (it installs "
            "it), or pass --skip-mlserver"
        )
    for variant in run.MLSERVER_VARIANTS:
        tag = f"mlserver-{variant}"
        port = free_port()
        mrepo = write_mlserver_repo(variant, repo, run_dir / tag, port, threads(repo))
        with procs.Group(run_dir / "logs") as group:
            group.start(
                tag, [str(run.MLSERVER_BIN), "start", str(mrepo)], env={"PYTHONPATH": str(BENCH)}
            )
            say(f"{tag}: waiting for {MODEL} on 127.0.0.1:{port}")
            ready = f"http://127.0.0.1:{port}/v2/models/{MODEL}/ready"
            procs.wait_until(lambda ready=ready: run._http_ok(ready), 180, group, tag)
            check_answers(f"127.0.0.1:{port}", MLSERVER_OUTPUT, 0, expected)
            for batch in args.batches:
                for c in args.concurrency:
                    group.check_alive()
                    say(f"{tag}: at concurrency {c}, {batch} row(s) a request")
                    point = run.run_perf_analyzer(
                        pa, f"127.0.0.1:{port}", MODEL, c, run_dir, tag, json=True, batch=batch
                    )
                    results.points.append(point)
                    run._report_point(point)


# --------------------------------------------------------------------------- conch


def bench_inprocess(args: argparse.Namespace, repo: Path, results: run.Results) -> None:
    """xgboost in process at each request size and each mean batch conch formed."""
    budget = 0.5 if args.quick else 1.5
    model = booster(repo, threads(repo))
    x_all, _ = build_tree_model.dataset()
    formed = run._batches_formed(results, lambda m: m == MODEL)
    table = results.inprocess.setdefault(MODEL, {})
    for batch in sorted({*args.batches, *formed}):
        x = np.resize(x_all, (batch, x_all.shape[1]))
        table[batch] = inprocess.rate(lambda x=x: model.inplace_predict(x), batch, budget)
        run._say_rate(f"xgboost, {MODEL}", batch, table[batch])


# --------------------------------------------------------------------------- report


def _cells(p: run.Point | None) -> list[str]:
    if p is None or p.infer_per_s is None:
        return ["n/a"] * 3
    return [f"{p.infer_per_s:,.0f}", run._f(p.p50_ms, ".2f"), run._f(p.p99_ms, ".2f")]


def _best_mlserver(results: run.Results, c: int, batch: int) -> run.Point | None:
    found = [results.get(f"mlserver-{v}", MODEL, c, batch) for v in run.MLSERVER_VARIANTS]
    return max(
        (p for p in found if p and p.infer_per_s), key=lambda p: p.infer_per_s or 0, default=None
    )


def report(results: run.Results, args: argparse.Namespace) -> str:
    servers = ("conch", "conch-json", *(f"mlserver-{v}" for v in run.MLSERVER_VARIANTS))
    head = " | ".join(f"{s} rows/s | p50 ms | p99 ms" for s in servers)
    lines = [
        f"{MODEL}: rows/s (perf_analyzer's inferences/s: requests/s times the rows a request) "
        "and latency by server (conch: HTTP, binary and JSON tensors; MLServer: JSON tensors, "
        "adaptive batching off and on)",
        f"| rows a request | c | {head} | conch mean batch | conch ÷ MLServer best |",
        "|" + "---:|" * (4 + 3 * len(servers)),
    ]
    verdicts = []
    for batch in args.batches:
        for c in args.concurrency:
            cells: list[str] = [str(batch), str(c)]
            for server in servers:
                cells += _cells(results.get(server, MODEL, c, batch))
            conch = results.get("conch", MODEL, c, batch)
            best = _best_mlserver(results, c, batch)
            ratio = (
                conch.infer_per_s / best.infer_per_s
                if conch and best and conch.infer_per_s and best.infer_per_s
                else None
            )
            cells += [run._f(conch.mean_batch if conch else None, ".1f"), run._ratio(ratio)]
            lines.append("| " + " | ".join(cells) + " |")
            if c in GOAL_CONCURRENCY:
                met = "n/a" if ratio is None else ("met" if ratio >= GOAL else "MISSED")
                verdicts.append(f"{batch} row(s), c={c}: {run._ratio(ratio)} ({met})")
    lines += [
        "",
        f"xgboost in process, {MODEL}, one thread (Booster.inplace_predict)",
        "| rows a call | rows/s | ms a call |",
        "|---:|---:|---:|",
    ]
    for batch, rate in sorted(results.inprocess.get(MODEL, {}).items()):
        lines.append(f"| {batch} | {rate:,.0f} | {1000 * batch / rate:.3f} |")
    lines += ["", f"goal (issue 31): conch >= {GOAL:g}x MLServer's best at c=16 and 64"]
    lines += [f"- {v}" for v in verdicts]
    for p in results.points:
        if p.error:
            lines.append(f"note: {p.server}, {p.batch} row(s), c={p.concurrency}: {p.error}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="1 s windows, shorter in-process timing")
    p.add_argument("--concurrency", default="1,16,64", help="perf_analyzer's (default 1,16,64)")
    p.add_argument("--batches", default="1,256", help="rows a request (default 1,256)")
    p.add_argument("--window-ms", type=int, default=None, help="default 2000, quick 1000")
    p.add_argument("--skip-mlserver", action="store_true", help="conch and in process only")
    args = p.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        p.error("--batches takes integers, e.g. 1,256")
    if not args.batches or min(args.batches) < 1:
        p.error("--batches takes positive integers")
    # run.bench_conch's options, its defaults but for these.
    args.conch = run.parse_args(["--skip-grpc", "--concurrency", args.concurrency])
    args.conch.models = [MODEL]
    args.concurrency = args.conch.concurrency
    args.window_ms = args.window_ms or (1000 if args.quick else 2000)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measure(run_dir: Path, results: run.Results) -> None:
        repo = build_repository(run_dir / "repo")
        expected = booster(repo, threads(repo)).inplace_predict(sample_rows())
        pa = run.PaOptions(perf_analyzer.binary(), args.window_ms, 100, 5)
        pa.input_files[MODEL] = write_input_data(run_dir / "input-data.json")
        run.bench_conch(
            args.conch,
            repo,
            pa,
            run_dir,
            results,
            batches=tuple(args.batches),
            json_too=True,
            hop_floor=False,
            on_ready=lambda url: check_answers(url, "output__0", 1, expected),
        )
        if not args.skip_mlserver:
            bench_mlserver(args, repo, pa, run_dir, results, expected)
        bench_inprocess(args, repo, results)

    return run.run_script(
        "trees", "tree", args.window_ms, measure, lambda results: report(results, args)
    )


if __name__ == "__main__":
    sys.exit(main())
