#!/usr/bin/env python3
"""conch's benchmark: perf_analyzer against conch, NVIDIA Triton, MLServer and in-process.

    make bench                                   # everything, several minutes
    make bench BENCH_ARGS="--quick --skip-mlserver --skip-triton"
    .venv/bin/python bench/run.py --models mlp,mlp_py --concurrency 16 --window-ms 2000

The models (bench/models.py): ``mlp`` (overhead-bound) and ``mlp_large`` (compute-bound) as
ONNX models, the same two as Python-backend models running onnxruntime (``mlp_py``,
``mlp_large_py``), and Triton's ``add_sub`` without batching. One run does, for each model:

1. conch: a private redis-server (on a Unix socket, as ``conch serve`` starts it;
   ``--redis-tcp`` for TCP), one ``conch worker``, one ``conch gateway`` and one ``conch
   grpc`` on 127.0.0.1, driven by ``perf_analyzer -i http`` (binary tensors) at each
   concurrency in fixed time windows, then at once by ``perf_analyzer -i grpc`` at the same
   concurrency (``--skip-grpc`` leaves it out): the two protocols are compared in the same
   run, back to back, over the same worker. The mean batch the worker formed during each
   measurement is read from the worker's counters in Redis (``rows / executions`` over
   the measurement).
2. MLServer (its own venv), ``parallel_workers`` 0, with adaptive batching off and on,
   serving the same .onnx files with onnxruntime through ``bench/mlserver_runtime.py``,
   driven the same way but with JSON tensors (MLServer has no binary tensor extension).
3. NVIDIA Triton 2.51 (``make triton``: the ``nvidia-pytriton`` wheel in its own venv),
   serving the same repository, driven like conch (binary tensors). The wheel has no ONNX
   backend, so Triton loads only the Python models; an ONNX model's row compares conch with
   Triton serving its Python twin. CPU per request of tritonserver, its Python backend stub
   processes and perf_analyzer; mean batch from Triton's statistics.
4. In process: an onnxruntime session on the same file with the session options conch
   uses (1 intra-op thread, 1 inter-op thread, all graph optimizations), timed at batch 1
   and at every mean batch size conch formed. Measured with no server running.

It prints the main table (stdout) with the ratios (gRPC ÷ HTTP among them), Triton's own
table, CPU ms per request by process for conch (over HTTP and over gRPC) and Triton, the overhead table at concurrency 1 (p50 minus the
model's compute_infer minus its max_queue_delay, issue 12's goal of 0.5 ms), MLServer's
table, then the floors of issue 3 point 8 with PASS or FAIL. Progress goes to stderr; logs, perf_analyzer CSVs and ``results.json`` go to
``.cache/bench/runs/<time>/``. Every process it starts is stopped when it ends, also on
error, Ctrl-C or SIGTERM.

``--gpu`` (make bench-gpu) serves bench/gpu_models.py's KIND_GPU variants with conch, then
Triton serving the MLPs on the same GPU as Python models on onnxruntime's CUDA provider
(``bench_triton_gpu``; its cells say why where it cannot run), then the same files in process
on the GPU; ``--rehearse`` does all of it on the CPU.

Exit status: 0 when the table was printed (1 with ``--strict`` if a floor failed), 2 when
the benchmark could not run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import gpu_models  # noqa: E402
import inprocess  # noqa: E402
import procs  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402

import models  # noqa: E402

CACHE = ROOT / ".cache" / "bench"
MLSERVER_VENV = CACHE / "mlserver-venv"
MLSERVER_BIN = MLSERVER_VENV / "bin" / "mlserver"
TRITON_VENV = CACHE / "triton-venv"
# make bench-gpu's Triton: the same wheel with onnxruntime-gpu (make triton-gpu,
# bench/triton_venv.sh); --rehearse uses TRITON_VENV's CPU onnxruntime.
TRITON_GPU_VENV = CACHE / "triton-gpu-venv"

ALL_MODELS = models.ALL_MODELS
ALL_CONCURRENCY = (1, 16, 64)
MLSERVER_VARIANTS = ("nobatch", "batch")


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- results


@dataclass
class Point:
    server: str  # "conch" (HTTP), "conch-grpc", "triton" or "mlserver-<variant>"
    model: str
    concurrency: int
    batch: int = 1  # rows a request (perf_analyzer's -b)
    infer_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    mean_batch: float | None = None  # conch and Triton: rows / executions during the run
    executions: int | None = None
    # conch and Triton: CPU milliseconds per request, by process (conch: gateway, grpc,
    # worker, redis; Triton: tritonserver, python_stubs; both: perf_analyzer), over the
    # whole perf_analyzer invocation.
    cpu_ms_per_request: dict[str, float] | None = None
    # conch and Triton: the model's own compute per request over the run (statistics
    # extension: compute_infer ns / count), for the overhead table.
    compute_ms: float | None = None
    # conch with --instance-form process: each instance's pid, host and GPU bytes.
    instances: list[dict[str, Any]] | None = None
    wall_s: float | None = None
    error: str | None = None


@dataclass
class Results:
    points: list[Point] = field(default_factory=list)
    # model -> batch size -> rows/s in process
    inprocess: dict[str, dict[int, float]] = field(default_factory=dict)
    # --gpu: workload -> batch size -> rows/s of sentence-transformers' encode
    reference: dict[str, dict[int, float]] = field(default_factory=dict)
    # --gpu: text model -> lowest cosine of its in-process embeddings against
    # sentence-transformers'; model -> why it was not run (no TensorRT)
    agreement: dict[str, float] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    # --gpu: server ("triton") -> why it did not run, or stopped
    servers_not_run: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def get(self, server: str, model: str, concurrency: int, batch: int = 1) -> Point | None:
        for p in self.points:
            if (p.server, p.model, p.concurrency, p.batch) == (server, model, concurrency, batch):
                return p
        return None

    def mlserver_best(self, model: str, concurrency: int) -> Point | None:
        candidates = [
            p
            for p in self.points
            if p.server.startswith("mlserver-")
            and p.model == model
            and p.concurrency == concurrency
            and p.infer_per_s
        ]
        return max(candidates, key=lambda p: p.infer_per_s or 0.0, default=None)


# --------------------------------------------------------------------------- perf_analyzer


@dataclass
class PaOptions:
    binary: str
    window_ms: int
    stability_pct: int
    max_trials: int
    input_files: dict[str, Path] = field(default_factory=dict)  # model -> --input-data


# Distinct request payloads perf_analyzer cycles through.
INPUT_SAMPLES = 8


def write_input_data(repo: Path, model: str, dest: Path) -> Path:
    """perf_analyzer ``--input-data`` JSON: standard-normal FP32 rows from a fixed seed, or
    for a text input (``TYPE_STRING`` of one element) one of the benchmark's texts each.

    perf_analyzer's own random data is random bit patterns, which include NaN and inf;
    in JSON tensors (MLServer) those are not valid JSON, so both servers get these.
    """
    config = _triton_config(repo / model)
    rng = np.random.default_rng(20240801)
    samples = []
    for i in range(INPUT_SAMPLES):
        sample = {}
        for entry in config.get("input", []):
            dims = [int(d) for d in entry.get("dims", [])]
            if entry.get("data_type") == "TYPE_STRING" and dims == [1]:
                text = gpu_models.TEXT_SAMPLES[i % len(gpu_models.TEXT_SAMPLES)]
                sample[entry["name"]] = {"content": [text], "shape": dims}
                continue
            if entry.get("data_type") != "TYPE_FP32":
                raise RuntimeError(
                    f"model '{model}': the benchmark generates FP32 inputs and one-text inputs only"
                )
            values = rng.standard_normal(int(np.prod(dims)), dtype=np.float32)
            sample[entry["name"]] = {"content": [float(v) for v in values], "shape": dims}
        samples.append(sample)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"data": samples}))
    return dest


# perf_analyzer gives up when the last three windows differ by more than the stability
# percentage. On a 2-core machine shared by the load generator and the servers that
# happens; the point is then measured again accepting any three windows.
FALLBACK_STABILITY_PCT = 1000


def run_perf_analyzer(
    pa: PaOptions,
    url: str,
    model: str,
    concurrency: int,
    out_dir: Path,
    tag: str,
    *,
    json: bool,
    protocol: str = "http",
    extra: tuple[str, ...] = (),
    batch: int = 1,
) -> Point:
    """One perf_analyzer point of requests of ``batch`` rows; ``extra``: more of its flags
    (a sequence model's)."""
    point = Point(tag, model, concurrency, batch)
    rows = f"-b{batch}" if batch > 1 else ""
    for attempt, stability in enumerate((pa.stability_pct, FALLBACK_STABILITY_PCT)):
        csv_path = (
            out_dir / f"pa-{tag}-{model}-c{concurrency}{rows}{'-retry' if attempt else ''}.csv"
        )
        args = perf_analyzer.window_args(
            model,
            url,
            protocol,
            concurrency,
            window_ms=pa.window_ms,
            stability_pct=stability,
            max_trials=pa.max_trials,
        )
        if model in pa.input_files:
            args += ["--input-data", str(pa.input_files[model])]
        if json:
            args += ["--input-tensor-format=json", "--output-tensor-format=json"]
        if batch > 1:
            args += ["-b", str(batch)]
        args += extra
        # Windows until stable (at most max_trials), plus start-up and draining slack.
        timeout = pa.window_ms / 1000 * (pa.max_trials + 2) + 60
        ran = perf_analyzer.run(pa.binary, args, csv_path, timeout_s=timeout)
        code, output, rows = ran.code, ran.output, ran.rows
        if code is None:
            point.error = f"perf_analyzer timed out after {timeout:.0f} s"
            return point
        if code == 0 and rows:
            row = rows[-1]
            point.infer_per_s = float(row["Inferences/Second"])
            point.p50_ms = float(row["p50 latency"]) / 1000
            point.p99_ms = float(row["p99 latency"]) / 1000
            if attempt:
                point.error = (
                    f"not stable within {pa.stability_pct}% in {pa.max_trials} windows; "
                    "measured again accepting any 3 windows"
                )
            return point
        last = " | ".join(output.strip().splitlines()[-2:])
        point.error = f"perf_analyzer exited {code}: {last}"
        if "stable" not in output:
            return point  # a real failure, not noise: retrying will not help
        say(f"  (not stable within {stability}%; measuring again)")
    return point


# --------------------------------------------------------------------------- conch


def _worker_counts(client: Any, model: str) -> tuple[tuple[int, int, int], float]:
    """((executions, rows, requests), oldest report time) summed over the live workers."""
    from conch.wire import worker_reports

    reports = worker_reports.snapshot(client)
    executions = rows = requests = 0
    oldest = min((r.get("at", 0.0) for r in reports), default=0.0)
    for r in reports:
        st = r.get("stats", {}).get(model) or {}
        executions += int(st.get("executions", 0))
        rows += int(st.get("rows", 0))
        requests += int(st.get("requests", 0))
    return (executions, rows, requests), oldest


def _fresh_counts(
    client: Any, model: str, since: float, timeout_s: float = 6.0
) -> tuple[int, int, int]:
    """(executions, rows, requests) from reports every worker published after ``since``."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts, oldest = _worker_counts(client, model)
        if oldest >= since or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def _instance_memory(client: Any, model: str) -> list[dict[str, Any]] | None:
    """``model``'s process instances and their memory, as the worker reports them (None
    when its instances are threads)."""
    from conch.wire import worker_reports

    reports = worker_reports.snapshot(client)
    found = [i for i in worker_reports.process_instances(reports) if i.get("model") == model]
    return found or None


def _cpu_snapshot(pids: dict[str, int], sessions: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far by name: ``pids`` by process, ``sessions`` by session (a
    gateway's session holds its gunicorn workers too), perf_analyzer's once reaped."""
    import resource

    by_id = procs.cpu_seconds(pids=list(pids.values()), sessions=list(sessions.values()))
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        **{name: by_id[pid] for name, pid in {**pids, **sessions}.items()},
        "perf_analyzer": usage.ru_utime + usage.ru_stime,
    }


# conch's frontends: the Point tag and perf_analyzer's -i for each; "conch-json" is HTTP
# with JSON tensors (the wire MLServer is driven over), the others carry binary tensors.
CONCH_PROTOCOLS = {"conch": "http", "conch-json": "http", "conch-grpc": "grpc"}


def bench_conch(
    args: argparse.Namespace,
    repo: Path,
    pa: PaOptions,
    run_dir: Path,
    results: Results,
    *,
    batches: tuple[int, ...] = (1,),
    json_too: bool = False,
    hop_floor: bool = True,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """conch serving ``repo``, each of ``args.models`` measured at each concurrency and
    request size (``batches``: rows a request) over HTTP, then over HTTP with JSON tensors
    if ``json_too``, then gRPC unless skipped; ``hop_floor``: then the hops' floor
    (drain.measure_hops) when concurrency 1 was run. ``on_ready`` is given the HTTP
    address (host:port) once the models are ready, before anything is measured."""
    import redis
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from conch.devtools import redis_server

    # As `conch serve` does: a private Redis on this host, reached over a Unix socket.
    say("conch: starting a private redis-server (Unix socket)")
    private = redis_server.start_private(unix_socket=args.redis_unix_socket)
    try:
        with procs.Group(run_dir / "logs") as group:
            group.guard("redis-server", private.process.pid)
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            port = redis_server.free_port()
            # --gpu: the chosen models' own (an ensemble's steps), not the whole repository.
            served = ["--models", ",".join(gpu_models.serves(args.models))] if args.gpu else []
            form = ["--instance-form", args.instance_form] if args.instance_form else []
            worker = group.start("conch-worker", conch("worker", *common, *served, *form))
            gw_args = [
                "--http-address",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--metrics-port",
                str(redis_server.free_port()),
            ]
            if args.http_workers:
                gw_args += ["--http-workers", str(args.http_workers)]
            if args.http_thread_count:
                gw_args += ["--http-thread-count", str(args.http_thread_count)]
            gateway = group.start("conch-gateway", conch("gateway", *common, *gw_args))
            url = f"127.0.0.1:{port}"
            clients: list[Any] = [httpclient.InferenceServerClient(url)]
            urls = {"conch": url, **({"conch-json": url} if json_too else {})}
            cpu_pids = {"redis": private.process.pid}
            cpu_sessions = {"gateway": gateway.pid, "worker": worker.pid}
            if not args.skip_grpc:
                grpc_port = redis_server.free_port()
                grpc_args = ["--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port)]
                if args.grpc_infer_thread_count:
                    grpc_args += ["--grpc-infer-thread-count", str(args.grpc_infer_thread_count)]
                if args.grpc_workers:
                    grpc_args += ["--grpc-workers", str(args.grpc_workers)]
                frontend = group.start("conch-grpc", conch("grpc", *common, *grpc_args))
                urls["conch-grpc"] = f"127.0.0.1:{grpc_port}"
                clients.append(grpcclient.InferenceServerClient(urls["conch-grpc"]))
                cpu_sessions["grpc"] = frontend.pid

            def ready() -> bool:
                try:
                    return all(c.is_model_ready(m) for c in clients for m in args.models)
                except Exception:
                    return False

            say(f"conch: waiting for {', '.join(args.models)} on {', '.join(urls.values())}")
            procs.wait_until(ready, 180, group, "conch readiness")
            if on_ready is not None:
                on_ready(url)
            r = redis.Redis.from_url(private.url)
            for model in args.models:
                # The worker's counters of the model that batches: an ensemble's encoder.
                counted = gpu_models.BY_NAME[model].batched if args.gpu else model
                for c, batch in [(c, b) for b in batches for c in args.concurrency]:
                    for tag, target in urls.items():
                        group.check_alive()
                        rows = f", {batch} rows a request" if batch > 1 else ""
                        say(f"{tag}: {model} at concurrency {c}{rows}")
                        before = _fresh_counts(r, counted, time.time())
                        compute0 = _compute_infer(url, model)
                        cpu0 = _cpu_snapshot(cpu_pids, cpu_sessions)
                        t0 = time.monotonic()
                        point = run_perf_analyzer(
                            pa,
                            target,
                            model,
                            c,
                            run_dir,
                            tag,
                            json=tag == "conch-json",
                            protocol=CONCH_PROTOCOLS[tag],
                            batch=batch,
                        )
                        point.wall_s = time.monotonic() - t0
                        cpu1 = _cpu_snapshot(cpu_pids, cpu_sessions)
                        after = _fresh_counts(r, counted, time.time())
                        point.compute_ms = _compute_ms(compute0, _compute_infer(url, model))
                        _count_point(point, before, after, cpu0, cpu1)
                        point.instances = _instance_memory(r, model)
                        results.points.append(point)
                        _report_point(point)
            for client in clients:
                client.close()
            gateway.stop()
            worker.stop()
            if (
                hop_floor and 1 in args.concurrency
            ):  # the floor of the hops, beside the overhead table
                import drain

                hops = drain.measure_hops(group, private.url, 1000)
                results.settings["hop_floor_p50_ms"] = hops.p50_s * 1000
                say(f"the hops' floor: p50 {hops.p50_s * 1000:.2f} ms")
    finally:
        private.stop()


# --------------------------------------------------------------------------- MLServer


def _triton_config(model_dir: Path) -> dict[str, Any]:
    from conch.core.model_config import config_to_json, parse_config

    text = (model_dir / "config.pbtxt").read_text()
    return config_to_json(parse_config(text, model=model_dir.name, source="config.pbtxt"))


def _metadata_tensors(entries: list[dict[str, Any]], batched: bool) -> list[dict[str, Any]]:
    out = []
    for e in entries:
        dims = [int(d) for d in e.get("dims", [])]
        out.append(
            {
                "name": e["name"],
                "datatype": e["data_type"].removeprefix("TYPE_"),
                "shape": ([-1] if batched else []) + dims,
            }
        )
    return out


def write_mlserver_settings(dest: Path, http_port: int) -> None:
    """MLServer's server settings for the benchmark: one process, on loopback, quiet."""
    from conch.devtools.redis_server import free_port

    dest.mkdir(parents=True, exist_ok=True)
    settings = {
        "parallel_workers": 0,
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": free_port(),
        "metrics_endpoint": None,  # no metrics server (one port less, less work per request)
        "debug": False,  # no access log line per request
        "load_models_at_startup": True,
    }
    (dest / "settings.json").write_text(json.dumps(settings, indent=2))


def write_mlserver_repo(
    variant: str, repo: Path, model_names: list[str], dest: Path, http_port: int
) -> Path:
    """An MLServer model repository for one variant, serving ``model_names`` from ``repo``."""
    write_mlserver_settings(dest, http_port)
    for name in model_names:
        config = _triton_config(repo / name)
        batched = int(config.get("max_batch_size", 0)) > 0
        delay_us = int(
            (config.get("dynamic_batching") or {}).get("max_queue_delay_microseconds", 0)
        )
        model_settings: dict[str, Any] = {
            "name": name,
            "implementation": "mlserver_runtime.OnnxRuntimeModel",
            "platform": config.get("platform", ""),
            "inputs": _metadata_tensors(config.get("input", []), batched),
            "outputs": _metadata_tensors(config.get("output", []), batched),
            "parameters": {
                "extra": {
                    "model_file": str(repo / name / "1" / "model.onnx"),
                    "intra_op_threads": inprocess.ORT_INTRA_OP_THREADS,
                    "inter_op_threads": inprocess.ORT_INTER_OP_THREADS,
                    "triton_config": config,
                }
            },
        }
        if variant == "batch":
            # Adaptive batching with the same bounds as conch's dynamic batching.
            model_settings["max_batch_size"] = int(config.get("max_batch_size", 0))
            model_settings["max_batch_time"] = delay_us / 1e6
        else:
            model_settings["max_batch_size"] = 0
            model_settings["max_batch_time"] = 0
        (dest / name).mkdir(exist_ok=True)
        (dest / name / "model-settings.json").write_text(json.dumps(model_settings, indent=2))
    return dest


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def bench_mlserver(
    args: argparse.Namespace, repo: Path, pa: PaOptions, run_dir: Path, results: Results
) -> None:
    from conch.devtools.redis_server import free_port

    if not MLSERVER_BIN.exists():
        raise RuntimeError(
            f"MLServer is not installed in {MLSERVER_VENV}: run `make bench` (it installs it), "
            "or pass --skip-mlserver"
        )
    served = [m for m in args.models if m in models.ONNX_MODELS]  # its runtime runs .onnx
    if not served:
        say("MLServer: none of the chosen models is an ONNX model; skipped")
        return
    for variant in MLSERVER_VARIANTS:
        tag = f"mlserver-{variant}"
        port = free_port()
        mrepo = write_mlserver_repo(variant, repo, served, run_dir / tag, port)
        with procs.Group(run_dir / "logs") as group:
            group.start(
                tag,
                [str(MLSERVER_BIN), "start", str(mrepo)],
                env={"PYTHONPATH": str(BENCH)},
                cwd=mrepo,
            )
            say(f"{tag}: waiting for {', '.join(served)} on 127.0.0.1:{port}")
            procs.wait_until(
                lambda port=port: all(
                    _http_ok(f"http://127.0.0.1:{port}/v2/models/{m}/ready") for m in served
                ),
                180,
                group,
                f"{tag} readiness",
            )
            for model in served:
                for c in args.concurrency:
                    group.check_alive()
                    say(f"{tag}: {model} at concurrency {c}")
                    point = run_perf_analyzer(
                        pa, f"127.0.0.1:{port}", model, c, run_dir, tag, json=True
                    )
                    results.points.append(point)
                    _report_point(point)


# --------------------------------------------------------------------------- Triton


def triton_twin(model: str, args: argparse.Namespace) -> str | None:
    """The model Triton serves in place of ``model``: with --gpu its workload's Python model
    (None where Triton serves none), else its Python twin or itself."""
    if getattr(args, "gpu", False):
        return gpu_models.triton_model(model)
    return models.TRITON_TWIN.get(model, model)


def triton_models(chosen: list[str]) -> list[str]:
    """What Triton serves for the chosen models: each ONNX model's Python twin, in order."""
    out: list[str] = []
    for m in chosen:
        t = models.TRITON_TWIN.get(m, m)
        if t not in out:
            out.append(t)
    return out


# What triton_layout asks the Triton venv's python: its site-packages, the LIBDIR (libpython)
# of the interpreter it was made from, the lib folders of the NVIDIA CUDA packages it sees
# (pip's nvidia-* wheels, e.g. beside a GPU image's torch), and its onnxruntime's providers.
_LAYOUT_PROBE = """
import glob, json, os, sys, sysconfig
out = {"purelib": sysconfig.get_paths()["purelib"], "libdir": sysconfig.get_config_var("LIBDIR")}
out["cuda_libs"] = sorted({d for p in sys.path for d in glob.glob(os.path.join(p, "nvidia", "*", "lib"))})
try:
    import onnxruntime
    out["onnxruntime"] = onnxruntime.__version__
    out["providers"] = onnxruntime.get_available_providers()
except Exception as exc:
    out["onnxruntime"] = f"not importable ({exc})"
    out["providers"] = []
print(json.dumps(out))
"""


def triton_layout(venv: Path = TRITON_VENV) -> dict[str, Any]:
    """The Triton venv as _LAYOUT_PROBE reports it (outside PYTHONPATH, as the server runs)."""
    py = venv / "bin" / "python"
    if not py.exists():
        hint = {
            TRITON_VENV: "`make triton` (`make bench` does)",
            TRITON_GPU_VENV: "`make triton-gpu` (`make bench-gpu` does)",
        }.get(venv, "bench/triton_venv.sh")
        raise RuntimeError(f"Triton is not installed in {venv}: run {hint}, or pass --skip-triton")
    out = subprocess.run(
        [str(py), "-c", _LAYOUT_PROBE],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    return json.loads(out.stdout)


def _compute_infer(url: str, model: str) -> tuple[int, int]:
    """(count, ns) of the model's compute_infer so far, from the statistics extension
    (conch and Triton answer it alike)."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as resp:
        doc = json.load(resp)
    compute = doc["model_stats"][0]["inference_stats"]["compute_infer"]
    return int(compute["count"]), int(compute["ns"])


def _count_point(
    point: Point,
    before: tuple[int, int, int],
    after: tuple[int, int, int],
    cpu0: dict[str, float],
    cpu1: dict[str, float],
) -> None:
    """The server's counters (executions, rows, requests) and CPU seconds by process
    around one perf_analyzer run: its mean batch and CPU ms per request."""
    executions, requests = after[0] - before[0], after[2] - before[2]
    if executions > 0:
        point.executions = executions
        point.mean_batch = (after[1] - before[1]) / executions
    if requests > 0:
        point.cpu_ms_per_request = {k: 1000 * (cpu1[k] - cpu0[k]) / requests for k in cpu0}


def _compute_ms(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    count = after[0] - before[0]
    return (after[1] - before[1]) / count / 1e6 if count > 0 else None


def _triton_stats(port: int, model: str) -> tuple[int, int, int]:
    """(executions, rows, successful requests) so far, from Triton's statistics extension."""
    url = f"http://127.0.0.1:{port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc = json.load(resp)
    st = doc["model_stats"][0]
    return (
        int(st.get("execution_count", 0)),
        int(st.get("inference_count", 0)),
        int(st["inference_stats"]["success"]["count"]),
    )


def _triton_cpu(server_pid: int) -> dict[str, float]:
    import resource

    # The server leads its own session; its Python backend stubs are in that session too.
    server = procs.cpu_seconds(pids=[server_pid])[server_pid]
    session = procs.cpu_seconds(sessions=[server_pid])[server_pid]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # perf_analyzer, once reaped
    return {
        "tritonserver": server,
        "python_stubs": session - server,
        "perf_analyzer": usage.ru_utime + usage.ru_stime,
    }


def triton_providers(log: Path) -> dict[str, str]:
    """model -> "<provider> (<details>)" from the lines bench/models.py's PY_MODEL prints."""
    out: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        if models.PROVIDER_MARK in line:
            model, _, said = line.split(models.PROVIDER_MARK, 1)[1].strip().partition(": ")
            out[model] = said
    return out


def bench_triton(
    args: argparse.Namespace,
    repo: Path,
    pa: PaOptions,
    run_dir: Path,
    results: Results,
    *,
    served: list[str] | None = None,
    venv: Path = TRITON_VENV,
    provider: str | None = None,
) -> None:
    """Triton from ``venv`` serving ``served`` (default: what it serves for ``args.models``)
    from ``repo``, each at ``args.concurrency``. ``provider``: the onnxruntime provider every
    served model must run on (its PY_MODEL line in the server's log says), else it raises."""
    from conch.devtools.redis_server import free_port

    layout = triton_layout(venv)
    if provider and provider not in layout["providers"]:
        raise RuntimeError(
            f"onnxruntime {layout['onnxruntime']} in {venv} has no {provider} "
            f"(it has {', '.join(layout['providers']) or 'none'})"
        )
    tdir = Path(layout["purelib"]) / "pytriton" / "tritonserver"
    served = served or triton_models(args.models)
    for m in served:
        if m not in pa.input_files:
            pa.input_files[m] = write_input_data(repo, m, run_dir / f"input-{m}.json")
    port = free_port()
    grpc_port = None if args.skip_grpc or args.gpu else free_port()
    cmd = [
        str(tdir / "bin" / "tritonserver"),
        "--model-repository",
        str(repo),
        "--backend-directory",
        str(tdir / "backends"),
        "--cache-directory",
        str(tdir / "caches"),
        "--http-address",
        "127.0.0.1",
        "--http-port",
        str(port),
        # Triton's gRPC beside its HTTP, as conch's is: issue 42's gRPC goal is against it.
        *(["--allow-grpc", "false"] if grpc_port is None else ["--grpc-port", str(grpc_port)]),
        "--metrics-address",
        "127.0.0.1",
        "--metrics-port",
        str(free_port()),
        "--allow-gpu-metrics",
        "false",
        "--exit-timeout-secs",
        "5",
        # The ONNX models are in the same repository; the wheel has no backend for them.
        "--model-control-mode",
        "explicit",
    ]
    for m in served:
        cmd += ["--load-model", m]
    env = {
        # The Python backend stub embeds libpython of the venv's base interpreter; onnxruntime's
        # CUDA provider wants the CUDA libraries (pip's nvidia-* lib folders, when there are).
        "LD_LIBRARY_PATH": os.pathsep.join(
            p
            for p in (
                layout["libdir"],
                str(Path(layout["purelib"]) / "nvidia_pytriton.libs"),
                *layout["cuda_libs"],
                os.environ.get("LD_LIBRARY_PATH", ""),
            )
            if p
        ),
        # ... and finds numpy and onnxruntime through the venv's python on PATH, not through
        # a PYTHONPATH meant for conch (its packages, numpy 2 among them, would come first).
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": "",
    }
    with procs.Group(run_dir / "logs") as group:
        server = group.start("tritonserver", cmd, env=env)
        say(f"triton: waiting for {', '.join(served)} on 127.0.0.1:{port}")
        procs.wait_until(
            lambda: _http_ok(f"http://127.0.0.1:{port}/v2/health/ready"),
            180,
            group,
            "tritonserver readiness",
        )
        said = triton_providers(server.log_path)
        results.settings.setdefault("triton_providers", {}).update(said)
        for model, how in said.items():
            say(f"triton: {model} runs on {how}")
        for model in served if provider else ():
            if not said.get(model, "").startswith(provider):
                raise RuntimeError(
                    f"Triton's {model} runs on {said.get(model) or 'an unknown provider'}, "
                    f"not {provider} (see {server.log_path})"
                )
        for model in served:
            for c in args.concurrency:
                group.check_alive()
                say(f"triton: {model} at concurrency {c}")
                before = _triton_stats(port, model)
                compute0 = _compute_infer(f"127.0.0.1:{port}", model)
                cpu0 = _triton_cpu(server.pid)
                t0 = time.monotonic()
                point = run_perf_analyzer(
                    pa, f"127.0.0.1:{port}", model, c, run_dir, "triton", json=False
                )
                point.wall_s = time.monotonic() - t0
                cpu1 = _triton_cpu(server.pid)
                after = _triton_stats(port, model)
                point.compute_ms = _compute_ms(compute0, _compute_infer(f"127.0.0.1:{port}", model))
                _count_point(point, before, after, cpu0, cpu1)
                results.points.append(point)
                _report_point(point)
        for model in served if grpc_port is not None else ():
            for c in args.concurrency:
                group.check_alive()
                say(f"triton-grpc: {model} at concurrency {c}")
                before = _triton_stats(port, model)
                cpu0 = _triton_cpu(server.pid)
                point = run_perf_analyzer(
                    pa,
                    f"127.0.0.1:{grpc_port}",
                    model,
                    c,
                    run_dir,
                    "triton-grpc",
                    json=False,
                    protocol="grpc",
                )
                _count_point(
                    point, before, _triton_stats(port, model), cpu0, _triton_cpu(server.pid)
                )
                results.points.append(point)
                _report_point(point)


def bench_triton_gpu(
    args: argparse.Namespace, repo: Path, pa: PaOptions, run_dir: Path, results: Results
) -> None:
    """--gpu: Triton beside conch, after it, on the same device: the MLP workloads among the
    chosen variants as Python models running onnxruntime on conch's .onnx files
    (gpu_models.build_triton_repository), KIND_GPU on the CUDA provider (--rehearse: KIND_CPU
    on the CPU, from make triton's venv). Where Triton cannot run, or stops,
    ``results.servers_not_run["triton"]`` says why and the run goes on."""
    served = gpu_models.triton_served(args.models)
    if args.skip_triton or not served:
        return
    venv = args.triton_venv or (TRITON_VENV if args.rehearse else TRITON_GPU_VENV)
    kind, provider = (
        ("KIND_CPU", "CPUExecutionProvider")
        if args.rehearse
        else ("KIND_GPU", "CUDAExecutionProvider")
    )
    try:
        trepo = gpu_models.build_triton_repository(repo, served, kind=kind)
        say(f"triton: {', '.join(served)} from {trepo} ({kind}), venv {venv}")
        bench_triton(
            args, trepo, pa, run_dir, results, served=served, venv=Path(venv), provider=provider
        )
    except Exception as exc:
        results.servers_not_run["triton"] = _why(exc)
        say(f"triton: not run further: {exc}")


def _why(exc: Exception) -> str:
    """One line for a table: the last ``error:`` line of ``exc``'s message (a server's log
    tail), else its first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    return (errors or lines or [type(exc).__name__])[-1 if errors else 0]


# --------------------------------------------------------------------------- in process


ONNX_SOURCE = {py: onnx for onnx, py in models.TRITON_TWIN.items()}


def onnx_source(model: str) -> str | None:
    """The ONNX model whose file ``model`` runs (itself, or its twin's); None for add_sub."""
    if model in models.ONNX_MODELS:
        return model
    return ONNX_SOURCE.get(model)


def inprocess_models(chosen: list[str]) -> list[str]:
    out: list[str] = []
    for m in chosen:
        src = onnx_source(m)
        if src and src not in out:
            out.append(src)
    return out


def _batches_formed(results: Results, runs_on: Any) -> list[int]:
    """1 and the mean batch sizes (rounded) conch formed over HTTP for the models for
    which ``runs_on(model)`` is true: the batch sizes to time in process."""
    return sorted(
        {1}
        | {
            max(1, round(p.mean_batch))
            for p in results.points
            if p.server == "conch" and runs_on(p.model) and p.mean_batch is not None
        }
    )


def _say_rate(what: str, batch: int, rows_per_s: float) -> None:
    say(
        f"in process: {what} batch {batch}: {rows_per_s:,.0f} rows/s "
        f"({1000 * batch / rows_per_s:.3f} ms per execution)"
    )


def bench_inprocess(args: argparse.Namespace, repo: Path, results: Results) -> None:
    budget = 0.5 if args.quick else 1.5
    for model in inprocess_models(args.models):
        session = inprocess.ort_session(repo / model / "1" / "model.onnx")
        table = results.inprocess.setdefault(model, {})
        for b in _batches_formed(results, lambda m, model=model: onnx_source(m) == model):
            table[b] = inprocess.rows_per_second(session, b, budget)
            _say_rate(model, b, table[b])
        del session


def bench_inprocess_gpu(args: argparse.Namespace, repo: Path, results: Results) -> None:
    """Each served variant's files in process on the GPU (on the CPU with --rehearse), at
    batch 1 and the batches conch formed; sentence-transformers on the same device at the
    batches any text_embedding variant formed."""
    budget = 0.5 if args.quick else 1.5
    device = inprocess.CPU if args.rehearse else inprocess.CUDA
    text_batches: set[int] = set()
    for name in args.models:
        variant = gpu_models.BY_NAME[name]
        sizes = _batches_formed(results, lambda m, name=name: m == name)
        table, agreement = inprocess.measure_variant(variant, repo, sizes, budget, device)
        results.inprocess[name] = table
        for b, value in table.items():
            _say_rate(f"{name} ({variant.runtime})", b, value)
        if agreement is not None:
            results.agreement[name] = agreement
            say(f"in process: {name}: lowest cosine against sentence-transformers {agreement:.6f}")
        if variant.family == gpu_models.TEXT_NAME:
            text_batches.update(sizes)
    if text_batches:
        table = inprocess.measure_sentence_transformers(sorted(text_batches), budget, device)
        results.reference[gpu_models.TEXT_NAME] = table
        for b, value in table.items():
            _say_rate(f"sentence-transformers on {device}", b, value)


# --------------------------------------------------------------------------- report


def _report_point(p: Point) -> None:
    if p.infer_per_s is None:
        say(f"  -> FAILED: {p.error}")
        return
    batch = f", mean batch {p.mean_batch:.1f}" if p.mean_batch is not None else ""
    note = f" ({p.error})" if p.error else ""
    say(
        f"  -> {p.infer_per_s:,.0f} infer/s, p50 {p.p50_ms:.2f} ms, p99 {p.p99_ms:.2f} ms{batch}{note}"
    )


def _f(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    return format(value, ".2f" if value >= 0.1 else ".4f")


def _inproc_at(
    results: Results, model: str, batch: float | None
) -> tuple[int | None, float | None]:
    if batch is None:
        return None, None
    b = max(1, round(batch))
    src = onnx_source(model)
    return b, (results.inprocess.get(src, {}).get(b) if src else None)


def format_table(results: Results, args: argparse.Namespace) -> str:
    head = (
        "| model | conc | conch infer/s | p50 ms | p99 ms | mean batch | gRPC infer/s "
        "| gRPC p50 ms | gRPC ÷ HTTP | in-process infer/s @ batch | conch / in-process "
        "| MLServer best infer/s (variant) | conch ÷ MLServer "
        "| Triton infer/s (Triton's model) | conch ÷ Triton |"
    )
    lines = [head, "|" + "---|" * 15]
    for model in args.models:
        for c in args.concurrency:
            p = results.get("conch", model, c) or Point("conch", model, c)
            g = results.get("conch-grpc", model, c)
            if g is None:
                grpc_txt = "skipped | - | -" if args.skip_grpc else "n/a | n/a | n/a"
            else:
                ratio_g = g.infer_per_s / p.infer_per_s if g.infer_per_s and p.infer_per_s else None
                grpc_txt = (
                    f"{_f(g.infer_per_s, ',.0f')} | {_f(g.p50_ms, '.2f')} | {_ratio(ratio_g)}"
                )
            b, inproc = _inproc_at(results, model, p.mean_batch)
            best = results.mlserver_best(model, c)
            ratio_ip = p.infer_per_s / inproc if p.infer_per_s and inproc else None
            ratio_ml = p.infer_per_s / best.infer_per_s if p.infer_per_s and best else None
            if best and best.infer_per_s:
                best_txt = f"{best.infer_per_s:,.0f} ({best.server.removeprefix('mlserver-')})"
            elif model not in models.ONNX_MODELS:
                best_txt = "not served (Python model)"
            else:
                best_txt = "skipped" if args.skip_mlserver else "n/a"
            tmodel = models.TRITON_TWIN.get(model, model)
            t = results.get("triton", tmodel, c)
            ratio_t = (
                p.infer_per_s / t.infer_per_s if p.infer_per_s and t and t.infer_per_s else None
            )
            if args.skip_triton:
                t_txt = "skipped"
            else:
                t_txt = _f(t.infer_per_s if t else None, ",.0f")
                if tmodel != model:
                    t_txt += f" ({tmodel}: wheel has no ONNX backend)"
            lines.append(
                f"| {model} | {c} | {_f(p.infer_per_s, ',.0f')} | {_f(p.p50_ms, '.2f')} "
                f"| {_f(p.p99_ms, '.2f')} | {_f(p.mean_batch, '.1f')} | {grpc_txt} "
                f"| {f'{inproc:,.0f} @ {b}' if inproc else 'n/a'} | {_ratio(ratio_ip)} "
                f"| {best_txt} | {_ratio(ratio_ml)} | {t_txt} | {_ratio(ratio_t)} |"
            )
    return "\n".join(lines)


def format_triton_table(results: Results, args: argparse.Namespace) -> str:
    lines = [
        "| Triton model | conc | protocol | infer/s | p50 ms | p99 ms | mean batch |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in triton_models(args.models):
        for c, server in itertools.product(args.concurrency, ("triton", "triton-grpc")):
            p = results.get(server, model, c)
            if p is None:
                continue
            note = f" ({p.error})" if p.error and p.infer_per_s is None else ""
            protocol = "gRPC" if server == "triton-grpc" else "HTTP"
            lines.append(
                f"| {model} | {c} | {protocol} | {_f(p.infer_per_s, ',.0f')}{note} "
                f"| {_f(p.p50_ms, '.2f')} | {_f(p.p99_ms, '.2f')} | {_f(p.mean_batch, '.1f')} |"
            )
    return "\n".join(lines)


def format_mlserver_table(results: Results, args: argparse.Namespace) -> str:
    lines = [
        "| model | conc | MLServer variant | infer/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for model in args.models:
        for c in args.concurrency:
            for v in MLSERVER_VARIANTS:
                p = results.get(f"mlserver-{v}", model, c)
                if p is None:
                    continue
                note = f" ({p.error})" if p.error and p.infer_per_s is None else ""
                lines.append(
                    f"| {model} | {c} | {v} | {_f(p.infer_per_s, ',.0f')}{note} "
                    f"| {_f(p.p50_ms, '.2f')} | {_f(p.p99_ms, '.2f')} |"
                )
    return "\n".join(lines)


def _triton_gpu_cells(results: Results, args: argparse.Namespace, model: str, conch: Point) -> str:
    """--gpu: the Triton infer/s, p50 and conch HTTP ÷ Triton cells of a variant's row: its
    workload's Triton model at the same concurrency, or why there is none."""
    tmodel = gpu_models.triton_model(model)
    if tmodel is None:
        return "not served by Triton | - | -"
    if getattr(args, "skip_triton", False):
        return "skipped | - | -"
    t = results.get("triton", tmodel, conch.concurrency)
    if t is None or t.infer_per_s is None:
        why = results.servers_not_run.get("triton")
        text = f"not run: {why}" if why else (t.error if t and t.error else "n/a")
        return f"{text.replace('|', '/')} | - | -"
    label = f"{t.infer_per_s:,.0f}" + (f" ({tmodel})" if tmodel != model else "")
    ratio = conch.infer_per_s / t.infer_per_s if conch.infer_per_s else None
    return f"{label} | {_f(t.p50_ms, '.2f')} | {_ratio(ratio)}"


def format_gpu_table(results: Results, args: argparse.Namespace) -> str:
    """--gpu: each variant served by conch (HTTP, then gRPC) against Triton serving its
    workload (HTTP, same concurrency), against its own files in process on the same device,
    at batch 1 and at the batch conch formed (an ensemble's encoder step's), and
    text_embedding against sentence-transformers' encode at that batch."""
    head = (
        "| model | runtime | conc | HTTP infer/s | p50 ms | p99 ms | mean batch "
        "| gRPC infer/s | gRPC ÷ HTTP | Triton infer/s | Triton p50 ms | HTTP ÷ Triton "
        "| in process @ 1 | in process @ batch formed "
        "| HTTP ÷ in process | sentence-transformers @ batch | HTTP ÷ sentence-transformers |"
    )
    lines = [head, "|" + "---|" * 17]
    for model in results.settings.get("models", args.models):
        variant = gpu_models.BY_NAME[model]
        why = results.not_run.get(model)
        if why:
            lines.append(f"| {model} | {variant.runtime} | - | {why} |" + " - |" * 13)
            continue
        table = results.inprocess.get(model, {})
        reference = results.reference.get(variant.family, {})
        for c in args.concurrency:
            p = results.get("conch", model, c) or Point("conch", model, c)
            g = results.get("conch-grpc", model, c)
            ratio_g = (
                g.infer_per_s / p.infer_per_s if g and g.infer_per_s and p.infer_per_s else None
            )
            b = max(1, round(p.mean_batch)) if p.mean_batch is not None else None
            inproc, ref = table.get(b) if b else None, reference.get(b) if b else None
            lines.append(
                f"| {model} | {variant.runtime} | {c} | {_f(p.infer_per_s, ',.0f')} "
                f"| {_f(p.p50_ms, '.2f')} | {_f(p.p99_ms, '.2f')} | {_f(p.mean_batch, '.1f')} "
                f"| {_f(g.infer_per_s if g else None, ',.0f')} | {_ratio(ratio_g)} "
                f"| {_triton_gpu_cells(results, args, model, p)} "
                f"| {_f(table.get(1), ',.0f')} | {f'{inproc:,.0f} @ {b}' if inproc else 'n/a'} "
                f"| {_ratio(p.infer_per_s / inproc if p.infer_per_s and inproc else None)} "
                f"| {f'{ref:,.0f} @ {b}' if ref else '-'} "
                f"| {_ratio(p.infer_per_s / ref if p.infer_per_s and ref else None) if ref else '-'} |"
            )
    if results.agreement:
        lines.append("")
        lines.append(
            "text_embedding in process, lowest cosine against sentence-transformers: "
            + ", ".join(f"{m} {v:.6f}" for m, v in results.agreement.items())
        )
    said = results.settings.get("triton_providers") or {}
    if said:
        lines.append("")
        lines.append(
            "Triton 2.51 (nvidia-pytriton 0.7.0), Python models running onnxruntime on conch's "
            ".onnx files: " + "; ".join(f"{m} on {how}" for m, how in said.items())
        )
    why = results.servers_not_run.get("triton")
    if why:
        lines.append("")
        lines.append(f"Triton did not run (or stopped): {why}")
    return "\n".join(lines)


CPU_KEYS = ("gateway", "grpc", "worker", "redis", "tritonserver", "python_stubs", "perf_analyzer")


def format_cpu_table(results: Results, args: argparse.Namespace) -> str:
    """Where conch's and Triton's CPU went: per request, by process, per perf_analyzer run."""
    lines = [
        "| model | conc | server | " + " | ".join(CPU_KEYS) + " | total | cores used |",
        "|---|---|---|" + "---|" * (len(CPU_KEYS) + 2),
    ]
    for model in args.models:
        for c in args.concurrency:
            for server, served in (
                ("conch", model),
                ("conch-grpc", model),
                ("triton", triton_twin(model, args)),
                ("triton-grpc", triton_twin(model, args)),
            ):
                p = results.get(server, served, c) if served else None
                if p is None or not p.cpu_ms_per_request:
                    continue
                if server.startswith("triton") and served != model and served in args.models:
                    continue  # printed on the Python model's own rows
                cpu = p.cpu_ms_per_request
                total = sum(cpu.values())
                cores = total / 1000 * (p.infer_per_s or 0)
                name = {
                    "conch": "conch HTTP",
                    "conch-grpc": "conch gRPC",
                    "triton-grpc": "triton gRPC",
                }.get(server, server)
                label = name if served == model else f"{name} ({served})"
                lines.append(
                    f"| {model} | {c} | {label} | "
                    + " | ".join(f"{cpu[k]:.2f}" if k in cpu else "-" for k in CPU_KEYS)
                    + f" | {total:.2f} | {cores:.2f} |"
                )
    return "\n".join(lines)


OVERHEAD_GOAL_MS = 0.5  # issue 12: conch's own overhead at concurrency 1


def _queue_delay_ms(repo: Path, model: str) -> float:
    """The model's configured max_queue_delay (0 without dynamic batching)."""
    config = _triton_config(repo / model)
    delay = config.get("dynamic_batching", {}).get("max_queue_delay_microseconds", 0)
    return int(delay) / 1000 if "dynamic_batching" in config else 0.0


def format_overhead_table(results: Results, args: argparse.Namespace, repo: Path) -> str:
    """Each server's own time at concurrency 1: p50 minus the model's compute (its
    statistics' compute_infer per request in the same run) minus max_queue_delay."""
    lines = [
        "| model | max_queue_delay ms | conch p50 ms | conch compute ms | conch overhead ms "
        f"| <= {OVERHEAD_GOAL_MS} ms | Triton p50 ms | Triton compute ms | Triton overhead ms |",
        "|" + "---|" * 9,
    ]

    def overhead(p: Point | None, delay: float) -> tuple[str, str, str, float | None]:
        if p is None or p.p50_ms is None or p.compute_ms is None:
            return "-", "-", "-", None
        value = p.p50_ms - p.compute_ms - delay
        return f"{p.p50_ms:.2f}", f"{p.compute_ms:.3f}", f"{value:.2f}", value

    for model in args.models:
        delay = _queue_delay_ms(repo, model)
        c_p50, c_comp, c_over, value = overhead(results.get("conch", model, 1), delay)
        twin = triton_twin(model, args)
        t_p50, t_comp, t_over, _ = overhead(results.get("triton", twin, 1) if twin else None, delay)
        if twin != model and (t_p50, t_comp) != ("-", "-"):
            t_over += f" ({twin})"
        verdict = "-" if value is None else ("PASS" if value <= OVERHEAD_GOAL_MS else "FAIL")
        lines.append(
            f"| {model} | {delay:.2f} | {c_p50} | {c_comp} | {c_over} | {verdict} "
            f"| {t_p50} | {t_comp} | {t_over} |"
        )
    return "\n".join(lines)


def floors(results: Results, repo: Path) -> list[tuple[str, str, str]]:
    """(floor, measured, PASS/FAIL/SKIP) for issue 3 point 8 and issue 14 point 7.

    Issue 3's mean-batch floor is withdrawn (issue 16): Triton's rule runs a batch as soon
    as the model is free, so the batch formed follows the load, not a floor."""
    out: list[tuple[str, str, str]] = []

    def verdict(ok: bool | None) -> str:
        return "SKIP" if ok is None else ("PASS" if ok else "FAIL")

    small, large = models.SMALL_NAME, models.LARGE_NAME
    p = results.get("conch", small, 16)
    best = results.mlserver_best(small, 16)
    ok = None
    measured = "not measured"
    if p and p.infer_per_s and best:
        ratio = p.infer_per_s / best.infer_per_s
        ok, measured = (
            ratio >= 0.8,
            f"{ratio:.2f}x ({p.infer_per_s:,.0f} vs {best.infer_per_s:,.0f})",
        )
    out.append((f"{small} c=16: conch >= 0.8x MLServer best", measured, verdict(ok)))

    p = results.get("conch", large, 64)
    ok, measured = None, "not measured"
    if p and p.infer_per_s and p.mean_batch is not None:
        b, inproc = _inproc_at(results, large, p.mean_batch)
        if inproc:
            ratio = p.infer_per_s / inproc
            ok, measured = ratio >= 0.6, f"{ratio:.0%} of {inproc:,.0f} rows/s at batch {b}"
    out.append((f"{large} c=64: conch >= 60% of in-process at batch formed", measured, verdict(ok)))

    best = results.mlserver_best(large, 64)
    ok, measured = None, "not measured"
    if p and p.infer_per_s and best:
        ratio = p.infer_per_s / best.infer_per_s
        ok, measured = (
            ratio >= 1.5,
            f"{ratio:.2f}x ({p.infer_per_s:,.0f} vs {best.infer_per_s:,.0f})",
        )
    out.append((f"{large} c=64: conch >= 1.5x MLServer best", measured, verdict(ok)))

    # Issue 14, point 7: over gRPC, at least the HTTP path's throughput in the same run.
    p, g = results.get("conch", small, 16), results.get("conch-grpc", small, 16)
    ok, measured = None, "not measured"
    if p and p.infer_per_s and g and g.infer_per_s:
        ratio = g.infer_per_s / p.infer_per_s
        ok = ratio >= 1.0
        measured = f"{ratio:.2f}x ({g.infer_per_s:,.0f} vs {p.infer_per_s:,.0f})"
    out.append((f"{small} c=16: conch gRPC >= conch HTTP (issue 14)", measured, verdict(ok)))

    return out


# Issue 42's goals (bench/README.md, "conch against NVIDIA Triton and MLServer").
GOAL_THROUGHPUT = 0.8  # conch ÷ Triton infer/s at concurrency 16 and 64
GOAL_CPU = 1.5  # conch's CPU per request (all its processes) ÷ Triton's, at 16 and 64
GOAL_P50_MS = 0.4  # conch's p50 minus Triton's at concurrency 1
GOAL_GRPC = 0.8  # conch's gRPC ÷ Triton's gRPC infer/s at 16 and 64
GOAL_CONCURRENCY = (16, 64)
# Whose CPU counts as the server's: perf_analyzer, the client, is left out on both sides.
SERVER_CPU = {"conch": ("gateway", "worker", "redis"), "conch-grpc": ("grpc", "worker", "redis")}
TRITON_CPU = ("tritonserver", "python_stubs")


def _server_cpu(p: Point | None, keys: tuple[str, ...]) -> float | None:
    if p is None or not p.cpu_ms_per_request:
        return None
    return sum(p.cpu_ms_per_request.get(k, 0.0) for k in keys)


def _at_least(mine: Point | None, theirs: Point | None, goal: float) -> tuple[bool | None, str]:
    """Whether ``mine`` made at least ``goal`` times ``theirs``'s infer/s, and the figures
    (None, "not measured" when either is missing)."""
    if not (mine and theirs and mine.infer_per_s and theirs.infer_per_s):
        return None, "not measured"
    ratio = mine.infer_per_s / theirs.infer_per_s
    return ratio >= goal, f"{ratio:.2f}x ({mine.infer_per_s:,.0f} vs {theirs.infer_per_s:,.0f})"


def goals(results: Results, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(goal, measured, PASS/FAIL/SKIP) for issue 42 point 5, each on the models this run
    served to both conch and Triton: throughput and CPU at 16 and 64, p50 at 1, gRPC
    against Triton's gRPC. The drain bench prints the gateway row's goal; the MLServer
    floors are ``floors``."""
    out: list[tuple[str, str, str]] = []

    def add(goal: str, ok: bool | None, measured: str) -> None:
        out.append((goal, measured, "SKIP" if ok is None else ("PASS" if ok else "FAIL")))

    for model in args.models:
        tmodel = triton_twin(model, args)
        if not tmodel or (tmodel != model and tmodel in args.models):
            continue  # an ONNX model whose Triton twin has its own rows
        name = model if tmodel == model else f"{model} (Triton: {tmodel})"
        for c in (c for c in args.concurrency if c in GOAL_CONCURRENCY):
            p, t = results.get("conch", model, c), results.get("triton", tmodel, c)
            add(
                f"{name} c={c}: conch >= {GOAL_THROUGHPUT}x Triton",
                *_at_least(p, t, GOAL_THROUGHPUT),
            )
            mine, theirs = _server_cpu(p, SERVER_CPU["conch"]), _server_cpu(t, TRITON_CPU)
            ok, measured = None, "not measured"
            if mine and theirs:
                ok = mine <= GOAL_CPU * theirs
                measured = f"{mine / theirs:.2f}x ({mine:.3f} vs {theirs:.3f} ms/request)"
            add(f"{name} c={c}: conch CPU <= {GOAL_CPU}x Triton's", ok, measured)
            g, tg = results.get("conch-grpc", model, c), results.get("triton-grpc", tmodel, c)
            add(
                f"{name} c={c}: conch gRPC >= {GOAL_GRPC}x Triton gRPC",
                *_at_least(g, tg, GOAL_GRPC),
            )
        if 1 in args.concurrency:
            p, t = results.get("conch", model, 1), results.get("triton", tmodel, 1)
            ok, measured = None, "not measured"
            if p and t and p.p50_ms is not None and t.p50_ms is not None:
                gap = p.p50_ms - t.p50_ms
                ok = gap <= GOAL_P50_MS
                measured = f"{gap:+.2f} ms ({p.p50_ms:.2f} vs {t.p50_ms:.2f})"
            add(f"{name} c=1: conch p50 within {GOAL_P50_MS} ms of Triton's", ok, measured)
    return out


# --------------------------------------------------------------------------- main


def run_script(
    prefix: str,
    what: str,
    window_ms: int,
    measure: Callable[[Path, Results], None],
    report: Callable[[Results], str],
) -> int:
    """A benchmark script's whole run (bench/trees.py, bench/onnx_runtimes.py): signals
    that stop what it started, a run folder ``<prefix>-<time>``, ``measure(run_dir,
    results)``, ``results.json`` whatever happens, then ``report``'s tables and a footer.
    0 when the tables were printed, 2 when the benchmark could not run, 130 interrupted."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    started = time.monotonic()
    run_dir = CACHE / "runs" / time.strftime(f"{prefix}-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    results = Results(
        settings={
            "argv": sys.argv[1:],
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "cpus": os.cpu_count(),
            "window_ms": window_ms,
            "loadavg_before": " ".join(f"{v:.2f}" for v in os.getloadavg()),
            "cpu_busy_before": cpu_busy_fraction(),
        }
    )
    try:
        measure(run_dir, results)
    except KeyboardInterrupt:
        say("interrupted: the processes it started are stopped")
        return 130
    except Exception:
        traceback.print_exc(file=sys.stderr)
        say(f"the {what} benchmark failed (above); results.json has what was measured")
        return 2
    finally:
        results.settings["loadavg_after"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
        (run_dir / "results.json").write_text(json.dumps(asdict(results), indent=2))
    print(report(results))
    s = results.settings
    print(
        f"\n{s['started']}; {s['cpus']} CPUs; load average before {s['loadavg_before']}, after "
        f"{s['loadavg_after']}; results in {run_dir} (took {time.monotonic() - started:.0f} s)"
    )
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="1 s windows, shorter in-process timing")
    p.add_argument("--skip-mlserver", action="store_true", help="do not run MLServer")
    p.add_argument("--skip-triton", action="store_true", help="do not run NVIDIA Triton")
    p.add_argument(
        "--instance-form",
        choices=("thread", "process"),
        help="conch's --instance-form: each model instance a thread of the worker, or a "
        "process of its own (default: the worker's default)",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=None,
        help="every model's instance_group count, for conch and Triton alike (default: "
        "the models' configs)",
    )
    p.add_argument(
        "--redis-tcp",
        dest="redis_unix_socket",
        action="store_false",
        help="reach conch's private Redis over loopback TCP instead of a Unix socket",
    )
    p.add_argument(
        "--models",
        default=",".join(ALL_MODELS),
        help=f"comma-separated, from {', '.join(ALL_MODELS)} (default: all)",
    )
    p.add_argument(
        "--concurrency",
        default=",".join(map(str, ALL_CONCURRENCY)),
        help="comma-separated perf_analyzer concurrencies (default: 1,16,64)",
    )
    p.add_argument(
        "--window-ms", type=int, default=None, help="measurement window (default 3000, quick 1000)"
    )
    p.add_argument(
        "--stability-percentage",
        type=int,
        default=100,
        help="perf_analyzer's stability threshold in %% (default 100: the last 3 windows "
        "within 2x; this machine is noisy)",
    )
    p.add_argument("--max-trials", type=int, default=5, help="windows per point at most")
    p.add_argument("--http-workers", type=int, default=None, help="conch gateway processes")
    p.add_argument(
        "--http-thread-count", type=int, default=None, help="threads per conch gateway process"
    )
    p.add_argument(
        "--skip-grpc",
        action="store_true",
        help="do not drive conch over gRPC (perf_analyzer -i grpc)",
    )
    p.add_argument(
        "--grpc-infer-thread-count", type=int, default=None, help="conch grpc's infer threads"
    )
    p.add_argument("--grpc-workers", type=int, default=None, help="conch grpc's server processes")
    p.add_argument("--strict", action="store_true", help="exit 1 if a floor or a goal fails")
    p.add_argument(
        "--gpu",
        action="store_true",
        help="make bench-gpu: bench/gpu_models.py's KIND_GPU models (mlp_large and "
        "text_embedding on onnxruntime's CUDA provider, its TensorRT provider where that runs, "
        "and TorchScript) against the same files in process on the GPU, and against Triton "
        "serving the MLPs as Python models on onnxruntime's CUDA provider (--skip-triton: not); "
        f"MLServer is skipped; models from {', '.join(gpu_models.BY_NAME)} (default: all but "
        "mlp). Exits 2 without a CUDA GPU",
    )
    p.add_argument(
        "--gpu-check",
        action="store_true",
        help="with --gpu: only check for a CUDA GPU, onnxruntime's CUDA provider and torch's "
        "CUDA (exit 2 when one is missing) and say whether onnxruntime's TensorRT provider runs",
    )
    p.add_argument(
        "--rehearse",
        action="store_true",
        help="with --gpu: the same models and steps with KIND_CPU instances and in process on "
        "the CPU, to check the benchmark itself on a machine without a GPU (numbers mean nothing)",
    )
    p.add_argument(
        "--triton-venv",
        type=Path,
        default=None,
        help="with --gpu: the venv Triton runs from (default: .cache/bench/triton-gpu-venv, "
        "make triton-gpu or bench/triton_venv.sh; with --rehearse .cache/bench/triton-venv)",
    )
    args = p.parse_args(argv)
    if (args.gpu_check or args.rehearse) and not args.gpu:
        p.error("--gpu-check and --rehearse go with --gpu")
    known = gpu_models.BY_NAME if args.gpu else ALL_MODELS
    if args.gpu:
        args.skip_mlserver = True
        if args.models == ",".join(ALL_MODELS):
            args.models = ",".join(gpu_models.DEFAULT_MODELS)
    args.models = [m for m in args.models.split(",") if m]
    unknown = set(args.models) - set(known)
    if unknown:
        p.error(f"unknown model(s) {sorted(unknown)}; choose from {', '.join(known)}")
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    except ValueError:
        p.error("--concurrency takes integers, e.g. 1,16,64")
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency takes positive integers")
    if args.window_ms is None:
        args.window_ms = 1000 if args.quick else 3000
    return args


def cpu_busy_fraction(seconds: float = 1.0) -> float | None:
    """How busy the CPUs are (0..1) over ``seconds``, from /proc/stat; None where unreadable."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return idle, sum(values)

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return 1 - (idle1 - idle0) / total if total > 0 else None


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def gpu_preflight(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(why the GPU benchmark cannot run here, why onnxruntime's TensorRT provider does not
    run here), each None when it can; on the CPU with --rehearse, neither is asked."""
    if args.rehearse:
        return None, None
    problem = inprocess.gpu_problem()
    if problem:
        return problem, None
    return None, inprocess.tensorrt_problem(
        ROOT / "functions" / models.SMALL_NAME / "1" / "model.onnx"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem, no_trt = gpu_preflight(args) if args.gpu else (None, None)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.gpu_check:
        if args.rehearse:
            print("GPU: none needed (--rehearse runs everything on the CPU)")
        else:
            print(f"GPU: {inprocess.gpu_name()}; TensorRT: {no_trt or 'runs'}")
        return 0
    # Ctrl-C raises KeyboardInterrupt even where the shell started us with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    started = time.monotonic()
    run_dir = CACHE / "runs" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    results = Results(
        settings={
            "argv": sys.argv[1:],
            "window_ms": args.window_ms,
            "stability_percentage": args.stability_percentage,
            "max_trials": args.max_trials,
            "cpus": os.cpu_count(),
        }
    )
    try:
        say(f"run folder: {run_dir}")
        busy = cpu_busy_fraction()
        results.settings["cpu_busy_before"] = busy
        if busy is not None and busy > 0.2:
            say(
                f"warning: the CPUs are already {busy:.0%} busy with other work; "
                "the numbers will be lower and noisier than on an idle machine"
            )
        say("building the benchmark models (reused when up to date)")
        if args.gpu:
            repo = (
                gpu_models.build_repository(gpu_models.REHEARSAL_OUT, kind="KIND_CPU")
                if args.rehearse
                else gpu_models.build_repository()
            )
            results.settings["device"] = (
                "cpu (--rehearse)" if args.rehearse else inprocess.gpu_name()
            )
            results.settings["models"] = list(args.models)
            for name in [
                m for m in args.models if gpu_models.BY_NAME[m].runtime == gpu_models.ORT_TRT
            ]:
                if no_trt:
                    results.not_run[name] = f"no TensorRT: {no_trt}"
                    args.models.remove(name)
                    say(f"{name}: not run, no TensorRT: {no_trt}")
        else:
            repo = models.build_repository()
        if args.instances:
            repo = with_instances(repo, run_dir / "models", args.instances)
            results.settings["instances"] = args.instances
        results.settings["instance_form"] = args.instance_form
        pa = PaOptions(
            perf_analyzer.binary(), args.window_ms, args.stability_percentage, args.max_trials
        )
        say(f"perf_analyzer: {pa.binary}")
        for model in args.models:
            pa.input_files[model] = write_input_data(repo, model, run_dir / f"input-{model}.json")
        bench_conch(args, repo, pa, run_dir, results)
        if not args.skip_mlserver:
            bench_mlserver(args, repo, pa, run_dir, results)
        if args.gpu:
            bench_triton_gpu(args, repo, pa, run_dir, results)
        elif not args.skip_triton:
            bench_triton(args, repo, pa, run_dir, results)
        if args.gpu:
            bench_inprocess_gpu(args, repo, results)
        else:
            bench_inprocess(args, repo, results)
    except KeyboardInterrupt:
        say("interrupted; every process this run started has been stopped")
        return 130
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        say(f"error: {exc}")
        (run_dir / "results.json").write_text(json.dumps(_as_json(results), indent=2))
        return 2

    (run_dir / "results.json").write_text(json.dumps(_as_json(results), indent=2))
    busy = results.settings.get("cpu_busy_before")
    if busy is not None and busy > 0.2:
        print(f"\nWARNING: the CPUs were {busy:.0%} busy with other work when the run began.")
    grpc_note = "" if args.skip_grpc else ", then -i grpc against conch"
    if args.gpu:
        print(
            f"\nconch GPU benchmark ({results.settings['device']}, {os.cpu_count()} CPUs; "
            f"perf_analyzer -i http{grpc_note}, {args.window_ms} ms windows, binary tensors)\n"
        )
        print(format_gpu_table(results, args))
        print_cpu_and_overhead(results, args, repo)
        print_notes(results)
        return _footer(run_dir, started, 0)
    print(
        f"\nconch benchmark ({os.cpu_count()} CPUs; perf_analyzer -i http{grpc_note}, "
        f"{args.window_ms} ms windows; conch and Triton binary tensors, MLServer JSON)\n"
    )
    for model in inprocess_models(args.models):
        row1 = results.inprocess.get(model, {}).get(1)
        if row1:
            per_row = 1000 / row1
            extra = ""
            if model == models.LARGE_NAME:
                extra = (
                    f"  [compute-bound check, >= 2 ms/row: {'PASS' if per_row >= 2 else 'FAIL'}]"
                )
            print(
                f"in-process {model} at batch 1: {row1:,.0f} infer/s, {per_row:.3f} ms/row{extra}"
            )
    print()
    print(format_table(results, args))
    if not args.skip_triton:
        print(
            "\nNVIDIA Triton 2.51 (PyPI nvidia-pytriton 0.7.0) has no ONNX backend: it serves "
            "the Python models only; an ONNX model's row compares conch's ONNX model with "
            "Triton's Python model running onnxruntime on the same file.\n"
        )
        print(format_triton_table(results, args))
    print_cpu_and_overhead(results, args, repo)
    if not args.skip_mlserver and any(p.server.startswith("mlserver-") for p in results.points):
        print()
        print(format_mlserver_table(results, args))
    print_notes(results)
    failed = False
    for title, rows in (
        ("goals (issue 42, point 5; the gateway's: bench/drain.py)", goals(results, args)),
        ("floors (issue 3, point 8; issue 14, point 7)", floors(results, repo)),
    ):
        print(f"\n{title}:")
        for name, measured, verdict in rows:
            failed |= verdict == "FAIL"
            print(f"  {verdict:4}  {name}: {measured}")
    return _footer(run_dir, started, 1 if failed and args.strict else 0)


def format_instance_table(results: Results) -> str:
    """Per model, each process instance's resident host memory and GPU memory (MiB), as
    the worker reported them after the model's last point; empty for thread instances."""
    last: dict[str, list[dict[str, Any]]] = {}
    for p in results.points:
        if p.server == "conch" and p.instances:
            last[p.model] = p.instances
    if not last:
        return ""
    rows = ["| model | instance | pid | host MiB | GPU MiB |", "|---|---|---|---|---|"]
    for model, instances in last.items():
        for i in sorted(instances, key=lambda i: i.get("instance", "")):
            gpu = i.get("gpu_bytes")
            rows.append(
                f"| {model} | {i.get('instance')} | {i.get('pid')} | "
                f"{i.get('host_bytes', 0) / 2**20:,.0f} | "
                f"{'-' if gpu is None else f'{gpu / 2**20:,.0f}'} |"
            )
    return "\n".join(rows)


def with_instances(repo: Path, dest: Path, count: int) -> Path:
    """A copy of ``repo`` whose models' instance groups each have ``count`` instances (a
    model without a group, an ensemble say, keeps what it has)."""
    import re
    import shutil

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(repo, dest, symlinks=True)
    for config in dest.glob("*/config.pbtxt"):
        text = config.read_text()
        if "instance_group" in text:
            config.write_text(re.sub(r"\bcount:\s*\d+", f"count: {count}", text))
    return dest


def print_cpu_and_overhead(results: Results, args: argparse.Namespace, repo: Path) -> None:
    print(
        "\nCPU ms per request by process over each perf_analyzer run (python_stubs: Triton's "
        "Python backend stub processes; cores used = total x infer/s; this machine has "
        f"{os.cpu_count()}):\n"
    )
    print(format_cpu_table(results, args))
    instances = format_instance_table(results)
    if instances:
        print("\nconch's process instances (--instance-form process): memory each holds\n")
        print(instances)
    if 1 in args.concurrency:
        print(
            "\nOwn overhead at concurrency 1: p50 - the model's compute (compute_infer per "
            "request, same run) - its max_queue_delay:\n"
        )
        print(format_overhead_table(results, args, repo))
        hops = results.settings.get("hop_floor_p50_ms")
        if hops is not None:
            print(
                f"\nThe floor of conch's hops at concurrency 1 (bench/drain.py's hops: a "
                f"client, a gateway process, Redis, a worker process, Redis, and back, with "
                f"no conch code), same run: p50 {hops:.2f} ms. Triton's request crosses one "
                "process."
            )


def print_notes(results: Results) -> None:
    notes = [p for p in results.points if p.error]
    if notes:
        print()
        for p in notes:
            print(f"note: {p.server} {p.model} c={p.concurrency}: {p.error}")


def _footer(run_dir: Path, started: float, code: int) -> int:
    print(
        f"\n(results, logs and perf_analyzer CSVs: {run_dir}; took {time.monotonic() - started:.0f} s)"
    )
    return code


def _as_json(results: Results) -> dict[str, Any]:
    return {
        "settings": results.settings,
        "points": [asdict(p) for p in results.points],
        "inprocess": {m: {str(b): v for b, v in t.items()} for m, t in results.inprocess.items()},
        "reference": {m: {str(b): v for b, v in t.items()} for m, t in results.reference.items()},
        "agreement": results.agreement,
        "not_run": results.not_run,
        "servers_not_run": results.servers_not_run,
    }


if __name__ == "__main__":
    sys.exit(main())
