"""Several processes against one Redis: workers sharing a queue, several gateways,
deadlines, `conch serve` as one command, and perf_analyzer driving it all."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.devtools.redis_server import free_port
from conch.wire import worker_reports

from harness import (
    ROOT,
    reference_mlp,
    run_perf_analyzer,
    start_gateway,
    start_serve,
    start_worker,
    wait_grpc_model_ready,
    wait_model_ready,
    wait_until,
    waiting,
    worker_requests,
)
from models import add_inputs


@pytest.fixture()
def db(redis_url: str, request: pytest.FixtureRequest) -> str:
    """A Redis database of this test's own, emptied first."""
    index = 1 + list(request.module.__dict__).index(request.function.__name__) % 14
    url = redis_url.rsplit("/", 1)[0] + f"/{index}"
    redis.Redis.from_url(url).flushdb()
    return url


def test_two_workers_share_one_queue(model_repo: Path, db: str, log_dir: Path) -> None:
    w1 = start_worker(model_repo, db, log_dir, "--models", "add")
    w2 = start_worker(model_repo, db, log_dir, "--models", "add")
    gw, url = start_gateway(model_repo, db, log_dir, workers=2, threads=32)
    try:
        wait_until(
            lambda: len(worker_reports.snapshot(redis.Redis.from_url(db))) == 2,
            60,
            "two workers",
            w1,
            w2,
        )
        wait_model_ready(url, "add", 60, w1, w2, gw)
        rng = np.random.default_rng(7)
        pairs = [
            (
                rng.standard_normal((1, 4), dtype=np.float32),
                rng.standard_normal((1, 4), dtype=np.float32),
            )
            for _ in range(300)
        ]

        def one(pair):
            a, b = pair
            return (
                httpclient.InferenceServerClient(url).infer("add", add_inputs(a, b)).as_numpy("OUT")
            )

        with ThreadPoolExecutor(24) as pool:
            results = list(pool.map(one, pairs))
        for (a, b), got in zip(pairs, results, strict=True):
            np.testing.assert_array_equal(got, a + b)
        # Both workers took a share (their counters reach Redis with the next heartbeat).
        wait_until(
            lambda: sum(worker_requests(redis.Redis.from_url(db), "add").values()) == 300,
            10,
            "the workers' counters",
        )
        shares = worker_requests(redis.Redis.from_url(db), "add")
        assert len(shares) == 2 and all(n > 0 for n in shares.values()), shares
    finally:
        gw.stop()
        w1.stop()
        w2.stop()


def test_two_gateways_one_queue(model_repo: Path, db: str, log_dir: Path) -> None:
    worker = start_worker(model_repo, db, log_dir, "--models", "mlp")
    gw1, url1 = start_gateway(model_repo, db, log_dir)
    gw2, url2 = start_gateway(model_repo, db, log_dir, workers=2)
    try:
        for url in (url1, url2):
            wait_model_ready(url, "mlp", 60, worker, gw1, gw2)
        xs = [
            np.random.default_rng(i).standard_normal((2, 64), dtype=np.float32) for i in range(120)
        ]

        def one(i: int) -> np.ndarray:
            client = httpclient.InferenceServerClient((url1, url2)[i % 2])
            inp = httpclient.InferInput("INPUT0", [2, 64], "FP32")
            inp.set_data_from_numpy(xs[i])
            return client.infer("mlp", [inp]).as_numpy("OUTPUT0")

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, range(len(xs))))
        for x, got in zip(xs, results, strict=True):
            np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-5, atol=1e-5)
    finally:
        gw1.stop()
        gw2.stop()
        worker.stop()


def test_deadline_expires_and_the_request_never_runs(
    model_repo: Path, db: str, log_dir: Path
) -> None:
    # No worker serves "add" yet: the request waits in its queue until its deadline.
    gw, url = start_gateway(model_repo, db, log_dir)
    try:
        client = httpclient.InferenceServerClient(url)
        a = np.ones((1, 4), np.float32)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as exc:
            client.infer("add", add_inputs(a, a), timeout=300_000)  # Triton's timeout: microseconds
        waited = time.monotonic() - started
        assert exc.value.status() == "503"
        assert "timeout" in str(exc.value).lower() and "'add'" in str(exc.value)
        assert 0.25 < waited < 5
        assert waiting(db, "add") == 1
        # A worker that comes later drops the expired request instead of running it.
        worker = start_worker(model_repo, db, log_dir, "--models", "add")
        try:
            wait_until(
                lambda: waiting(db, "add") == 0,
                30,
                "the queue to drain",
                worker,
            )
            wait_until(
                lambda: "deadline passed" in worker.log(), 10, "the drop to be logged", worker
            )
            time.sleep(2)  # one heartbeat: the counters would show an execution
            assert sum(worker_requests(redis.Redis.from_url(db), "add").values()) == 0
            # ...and it still serves requests that are in time.
            wait_model_ready(url, "add", 30, worker)
            np.testing.assert_array_equal(
                client.infer("add", add_inputs(a, a)).as_numpy("OUT"), a + a
            )
        finally:
            worker.stop()
    finally:
        gw.stop()


def test_default_deadline_is_configurable(model_repo: Path, db: str, log_dir: Path) -> None:
    gw, url = start_gateway(model_repo, db, log_dir, "--request-timeout-secs", "0.4")
    try:
        a = np.ones((1, 4), np.float32)
        started = time.monotonic()
        with pytest.raises(InferenceServerException, match="add"):
            httpclient.InferenceServerClient(url).infer("add", add_inputs(a, a))
        assert time.monotonic() - started < 5
    finally:
        gw.stop()


def test_conch_serve_runs_the_whole_stack(model_repo: Path, db: str, log_dir: Path) -> None:
    """HTTP and gRPC both, over one worker."""
    serve, url, grpc_url = start_serve(model_repo, db, log_dir)
    try:
        wait_model_ready(url, "mlp", 90, serve)
        x = np.random.default_rng(3).standard_normal((4, 64), dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [4, 64], "FP32")
        inp.set_data_from_numpy(x)
        got = httpclient.InferenceServerClient(url).infer("mlp", [inp]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-5, atol=1e-5)
        wait_grpc_model_ready(grpc_url, "mlp", 60, serve)
        grpc_client = grpcclient.InferenceServerClient(grpc_url)
        ginp = grpcclient.InferInput("INPUT0", [4, 64], "FP32")
        ginp.set_data_from_numpy(x)
        got = grpc_client.infer("mlp", [ginp]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-5, atol=1e-5)
        grpc_client.close()
    finally:
        assert serve.stop() == 0, serve.log()[-3000:]
    # Its children are gone with it.
    assert not worker_reports.snapshot(redis.Redis.from_url(db))


def test_conch_serve_starts_a_private_redis(
    model_repo: Path, log_dir: Path, tmp_path: Path
) -> None:
    """With no REDIS_URL and nothing on the default port, serve brings its own Redis."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    # Point the local probe at a port where nothing listens (6379 may be taken here).
    env["CONCH_LOCAL_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    serve, url, _ = start_serve(
        model_repo, None, log_dir, "--allow-grpc=false", name="serve-private", env=env
    )
    try:
        wait_model_ready(url, "mlp", 90, serve)
        assert "private redis-server" in serve.log()
        # ...which the worker and gateway on this host reach over its Unix socket.
        assert "broker: unix://" in serve.log()
    finally:
        assert serve.stop() == 0


def test_perf_analyzer_runs_against_the_server(model_repo: Path, db: str, log_dir: Path) -> None:
    worker = start_worker(model_repo, db, log_dir, "--models", "mlp")
    gw, url = start_gateway(model_repo, db, log_dir, workers=2, threads=16)
    try:
        wait_model_ready(url, "mlp", 60, worker, gw)
        out, throughputs = run_perf_analyzer(
            "-m", "mlp", "-u", url, "-i", "http", "--concurrency-range", "1:4:3"
        )
        # "statistics" is advertised: perf_analyzer reads them around every window and
        # prints the server's side (queue, compute) next to its own.
        assert "Server: " in out and "compute infer" in out, out[-3000:]
        counts = [int(n) for n in re.findall(r"Inference count: (\d+)", out)]
        assert counts and all(n > 0 for n in counts), out[-3000:]
        assert len(throughputs) == 2 and all(t > 0 for t in throughputs)
    finally:
        gw.stop()
        worker.stop()


def test_perf_analyzer_over_grpc_against_conch_serve(db: str, log_dir: Path) -> None:
    """Issue 14's done-when: ``perf_analyzer -i grpc`` against what ``make serve`` runs
    (``conch serve`` on functions/), for the MLP (unary calls, then a stream) and the
    sentiment ensemble (BYTES in, from --string-data)."""
    serve, _, url = start_serve(ROOT / "functions", db, log_dir)
    try:
        for model in ("mlp", "sentiment"):
            wait_grpc_model_ready(url, model, 120, serve)
        common = ["-u", url, "-i", "grpc"]
        for extra in (
            ("--concurrency-range", "1:4:3"),
            ("--concurrency-range", "4", "--streaming"),
        ):
            out, throughputs = run_perf_analyzer("-m", "mlp", *common, *extra)
            assert throughputs and all(t > 0 for t in throughputs), out[-3000:]
            # The server's side, from the statistics RPC around every window.
            assert "Server: " in out and "compute infer" in out, out[-3000:]
        out, throughputs = run_perf_analyzer(
            "-m", "sentiment", *common, "--concurrency-range", "2", "--string-data", "a great film"
        )
        assert len(throughputs) == 1 and throughputs[0] > 0, out[-3000:]
        assert "Composing models:" in out and "preprocessing" in out, out[-3000:]
        assert serve.alive()
    finally:
        assert serve.stop() == 0, serve.log()[-3000:]
