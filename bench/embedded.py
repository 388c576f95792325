#!/usr/bin/env python3
"""conch.Server in process (issue 33, point 1): what the in-process API costs over the runtime.

    make bench                                  # runs this too (EMBED_BENCH_ARGS)
    .venv/bin/python bench/embedded.py --seconds 3 --concurrency 1,4,16 --rows 1,64

functions/'s ``mlp`` called from Python threads in this process, three ways, back to back
and with the same client loop, so only the path differs:

- ``onnxruntime``: the model file on an onnxruntime session with the options conch's worker
  gives it, shared by the threads (the floor: no queue, no batching);
- ``embedded``: ``conch.Server("functions")``, no Redis: the request checked, queued,
  batched by the model's dynamic batching (500 µs), run and answered in this process;
- ``connected``: ``conch.Server(redis_url=...)`` on a private redis-server (Unix socket) with
  one ``conch worker``: the request crosses Redis to the worker and back, as a gateway's does.

Triton's own in-process API (the ``tritonserver`` package) is not installable on this machine
(no wheel in its package index), so it is not in the table; bench/run.py measures Triton over
HTTP. Each point runs ``--seconds`` after a warm-up; every way's answer is checked against
onnxruntime's first. Progress goes to stderr, the table to stdout. Exit status 2 when the
benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import inprocess  # noqa: E402

import conch  # noqa: E402
from conch.devtools import processes, redis_server  # noqa: E402

FUNCTIONS = ROOT / "functions"
MODEL = "mlp"
WAYS = ("onnxruntime", "embedded", "connected")


@dataclass
class Point:
    way: str
    rows: int
    concurrency: int
    rows_per_s: float
    p50_ms: float
    p99_ms: float
    calls: int


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(call: Callable[[], Any], rows: int, concurrency: int, seconds: float) -> tuple:
    """``concurrency`` threads calling ``call`` for ``seconds`` after a warm-up: rows a
    second, and the calls' p50 and p99 in ms."""
    for _ in range(20):
        call()
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    start = threading.Barrier(concurrency + 1)
    stop = threading.Event()

    def loop(k: int) -> None:
        mine = latencies[k]
        start.wait()
        while not stop.is_set():
            t0 = time.perf_counter()
            call()
            mine.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    every = np.array([x for mine in latencies for x in mine]) * 1000
    return (
        rows * len(every) / elapsed,
        float(np.percentile(every, 50)),
        float(np.percentile(every, 99)),
        len(every),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--rows", default="1,64")
    parser.add_argument("--quick", action="store_true", help="1 s points at 1 and 16")
    parser.add_argument("--skip-connected", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the points here")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.concurrency = 1.0, "1,16"
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    row_counts = [int(r) for r in args.rows.split(",")]
    model_file = FUNCTIONS / MODEL / "1" / "model.onnx"
    if not model_file.exists():
        say(f"{model_file} is missing")
        return 2
    session = inprocess.ort_session(model_file)
    calls: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "onnxruntime": lambda x: session.run(None, {"INPUT0": x})[0]
    }
    embedded = conch.Server(FUNCTIONS, model_control_mode="explicit", startup_models=[MODEL])
    embedded.start(wait_until_ready=True)
    calls["embedded"] = _caller(embedded)
    cleanup: list[Callable[[], None]] = [embedded.stop]
    if not args.skip_connected:
        try:
            connected, stop_fleet = _fleet()
        except Exception as exc:
            say(f"connected: could not start a fleet: {exc}")
            return 2
        cleanup += [stop_fleet, connected.stop]  # stopped in reverse: the server first
        calls["connected"] = _caller(connected)
    points: list[Point] = []
    try:
        rng = np.random.default_rng(0)
        for rows in row_counts:
            x = rng.standard_normal((rows, 64)).astype(np.float32)
            want = calls["onnxruntime"](x)
            for way, call in calls.items():
                np.testing.assert_allclose(call(x), want, rtol=1e-5, atol=1e-6, err_msg=way)
            for concurrency in concurrencies:
                for way, call in calls.items():
                    rate, p50, p99, n = measure(
                        lambda c=call, x=x: c(x), rows, concurrency, args.seconds
                    )
                    say(
                        f"{way:12} rows {rows:3} c={concurrency:2}: {rate:10.0f} rows/s, p50 {p50:.3f} ms"
                    )
                    points.append(Point(way, rows, concurrency, rate, p50, p99, n))
    finally:
        for stop in reversed(cleanup):
            stop()
    print(table(points))
    if args.json:
        args.json.write_text(json.dumps([asdict(p) for p in points], indent=2))
    return 0


def _caller(server: conch.Server) -> Callable[[np.ndarray], np.ndarray]:
    model = server.model(MODEL)

    def call(x: np.ndarray) -> np.ndarray:
        return next(iter(model.infer({"INPUT0": x}))).outputs["OUTPUT0"]

    return call


def _fleet() -> tuple[conch.Server, Callable[[], None]]:
    """A private redis-server and one worker serving ``mlp``; a connected server on them."""
    redis = redis_server.start_private(unix_socket=True)
    log = open(Path(tempfile.mkdtemp(prefix="conch-embed-bench-")) / "worker.log", "wb")  # noqa: SIM115
    worker = processes.spawn(
        processes.conch(
            "worker",
            "--model-repository",
            str(FUNCTIONS),
            "--models",
            MODEL,
            "--redis-url",
            redis.url,
        ),
        log,
        env={**os.environ},
    )

    def stop() -> None:
        worker.terminate()
        worker.wait(30)
        log.close()
        redis.stop()

    server = conch.Server(FUNCTIONS, redis_url=redis.url)
    server.start()
    if not processes.wait_until(lambda: server.model(MODEL).ready(), 120):
        stop()
        raise RuntimeError(f"the worker did not get {MODEL} ready (log: {log.name})")
    return server, stop


def table(points: list[Point]) -> str:
    by = {(p.way, p.rows, p.concurrency): p for p in points}
    ways = [w for w in WAYS if any(p.way == w for p in points)]
    head = "| rows | conc | " + " | ".join(f"{w} rows/s (p50 / p99 ms)" for w in ways)
    head += " | embedded ÷ onnxruntime |"
    lines = [head, "|" + "---|" * (len(ways) + 3)]
    for rows, concurrency in sorted({(p.rows, p.concurrency) for p in points}):
        cells = []
        for w in ways:
            p = by[(w, rows, concurrency)]
            cells.append(f"{p.rows_per_s:,.0f} ({p.p50_ms:.3f} / {p.p99_ms:.3f})")
        ratio = (
            by[("embedded", rows, concurrency)].rows_per_s
            / by[("onnxruntime", rows, concurrency)].rows_per_s
        )
        lines.append(f"| {rows} | {concurrency} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
