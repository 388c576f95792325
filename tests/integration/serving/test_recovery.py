"""Nothing lost: workers killed mid-batch, poison requests, and warm shutdown."""

from __future__ import annotations

import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.devtools.redis_server import free_port
from conch.wire import broker, keys, worker_reports
from conch.wire.work_owed import work_owed

from harness import start_gateway, start_worker, wait_model_ready, wait_until, waiting


@pytest.fixture()
def db(redis_url: str, request: pytest.FixtureRequest) -> str:
    index = 8 + list(request.module.__dict__).index(request.function.__name__) % 7
    url = redis_url.rsplit("/", 1)[0] + f"/{index}"
    redis.Redis.from_url(url).flushdb()
    return url


def slow_request(url: str, value: float) -> np.ndarray:
    x = np.full((1, 4), value, np.float32)
    inp = httpclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    return (
        httpclient.InferenceServerClient(url, network_timeout=120)
        .infer("slow", [inp])
        .as_numpy("Y")
    )


def answered(futures: list[Future], timeout: float) -> None:
    """Every ``slow_request`` (the i-th sent value i) got its own right answer."""
    for i, f in enumerate(futures):
        np.testing.assert_array_equal(
            f.result(timeout=timeout), np.full((1, 4), i + 1.0, np.float32)
        )


def in_flight(url: str) -> int:
    """Messages in flight, of every queue (a bundle of requests is one)."""
    return redis.Redis.from_url(url).zcard(keys.UNACKED_INDEX)


def owed(url: str, model: str) -> int:
    """``model``'s requests waiting or in flight: a bundle counts each of its own."""
    return work_owed(redis.Redis.from_url(url), [model])[model].owed


def requests_in_flight(url: str, model: str) -> int:
    """``model``'s requests in flight: a bundle counts each of its own."""
    return work_owed(redis.Redis.from_url(url), [model])[model].in_flight


@pytest.mark.parametrize("flags", [(), ("--batch-jobs=false",)], ids=["jobs", "no-jobs"])
def test_sigkill_mid_batch_loses_nothing(
    model_repo: Path, db: str, log_dir: Path, flags: tuple[str, ...]
) -> None:
    """What a killed worker held comes back to the queue: kombu's restore sweep, which
    Celery's consumer runs, and conch's RestoreSweep in workers whose consumer has no
    queue (no-jobs: neither worker takes batch jobs)."""
    first = start_worker(model_repo, db, log_dir, "--models", "slow", *flags)
    gw, url = start_gateway(model_repo, db, log_dir, threads=16)
    pool = ThreadPoolExecutor(8)
    try:
        wait_model_ready(url, "slow", 60, first, gw)
        futures: list[Future] = [pool.submit(slow_request, url, float(i)) for i in range(6)]
        wait_until(lambda: requests_in_flight(db, "slow") >= 6, 30, "the batch to be taken", first)
        first.stop(signal.SIGKILL)
        killed = time.monotonic()
        second = start_worker(model_repo, db, log_dir, "--models", "slow", *flags)
        try:
            answered(futures, timeout=60)
            # Back within the default visibility timeout and sweep, plus the batch's own run.
            assert time.monotonic() - killed < 10 + 5
            assert in_flight(db) == 0
        finally:
            second.stop()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        gw.stop()
        first.stop()


def test_sigkill_with_a_bundle_in_flight_loses_nothing(
    model_repo: Path, db: str, log_dir: Path
) -> None:
    """Requests that meet in the gateway's publish go as one message (a bundle); the work
    owed (``/queue-depth``, KEDA's) counts each of them, and a worker killed holding the
    bundle leaves all of it to come back and run."""
    first = start_worker(model_repo, db, log_dir, "--models", "slow")
    metrics = free_port()
    gw, url = start_gateway(model_repo, db, log_dir, threads=16, metrics_port=metrics)
    pool = ThreadPoolExecutor(6)
    client = redis.Redis.from_url(db)
    try:
        wait_model_ready(url, "slow", 60, first, gw)
        # Redis held still while the requests come: they meet in the gateway's next flush.
        client.client_pause(1000)
        futures: list[Future] = [pool.submit(slow_request, url, float(i)) for i in range(6)]
        wait_until(lambda: owed(db, "slow") == 6, 30, "the requests to be queued", first, gw)
        depth = requests.get(f"http://127.0.0.1:{metrics}/queue-depth", params={"model": "slow"})
        assert depth.json()["models"]["slow"]["owed"] == 6  # requests, not messages
        bundles = client.hkeys(broker.bundled_key(broker.queue_name("slow")))
        assert bundles  # fewer messages than requests

        def held() -> bool:  # a bundle in flight: kombu's unacked holds it
            return any(client.hexists(keys.UNACKED, tag) for tag in bundles)

        wait_until(held, 30, "a bundle to be taken", first)
        first.stop(signal.SIGKILL)
        second = start_worker(model_repo, db, log_dir, "--models", "slow")
        try:
            answered(futures, timeout=60)
            assert in_flight(db) == 0
            assert client.hlen(broker.bundled_key(broker.queue_name("slow"))) == 0
            assert requests_in_flight(db, "slow") == 0 and waiting(db, "slow") == 0
        finally:
            second.stop()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        gw.stop()
        first.stop()


def test_poison_request_is_dead_lettered(model_repo: Path, db: str, log_dir: Path) -> None:
    env = {"CONCH_VISIBILITY_TIMEOUT_S": "2", "CONCH_MAX_ATTEMPTS": "2"}
    gw, url = start_gateway(model_repo, db, log_dir)
    pool = ThreadPoolExecutor(1)
    try:
        future = pool.submit(slow_request, url, 1.0)
        # Each worker that takes the request dies with it (as a request that crashes its
        # worker would make it): attempts 1 and 2.
        for attempt in (1, 2):
            w = start_worker(model_repo, db, log_dir, "--models", "slow", env=env)
            r = redis.Redis.from_url(db)
            wait_until(
                lambda a=attempt, r=r: r.hvals(keys.ATTEMPTS) == [str(a).encode()],
                60,
                f"attempt {attempt}",
                w,
            )
            w.stop(signal.SIGKILL)
        # The third worker finds it over the limit: dead-letters it and answers the caller.
        w = start_worker(model_repo, db, log_dir, "--models", "slow", env=env)
        try:
            with pytest.raises(InferenceServerException) as exc:
                future.result(timeout=60)
            assert exc.value.status() == "500"
            assert "dead-lettered after 2 attempts" in str(exc.value)
            dead = redis.Redis.from_url(db).lrange(keys.DEADLETTER, 0, -1)
            assert len(dead) == 1 and b"dead-lettered" in dead[0]
            assert in_flight(db) == 0
            # The metrics say so: taken again twice (attempts 2 and 3), set aside once,
            # failed as OTHER, and loaded by each of the three workers.
            samples = (
                'conch_redeliveries_total{model="slow"} 2',
                'conch_dead_letters_total{model="slow"} 1',
                'nv_inference_request_failure{model="slow",reason="OTHER",version="1"} 1',
                'conch_model_loads_total{model="slow"} 3',
            )

            def scraped() -> str:
                return requests.get(f"http://{gw.metrics_url}/metrics", timeout=10).text

            # A worker's own counters reach the metrics port with its next report.
            wait_until(
                lambda: all(s in scraped().splitlines() for s in samples), 15, "the counters"
            )
            text = scraped()
            for sample in samples:
                assert sample in text.splitlines(), (sample, text)
            assert 'conch_model_load_duration_seconds{model="slow"} ' in text
            # The worker is fine and serves the next request.
            wait_model_ready(url, "slow", 30, w)
            np.testing.assert_array_equal(slow_request(url, 3.0), np.full((1, 4), 4.0, np.float32))
        finally:
            w.stop()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        gw.stop()


def test_sigterm_finishes_the_batch_and_exits_cleanly(
    model_repo: Path, db: str, log_dir: Path
) -> None:
    worker = start_worker(model_repo, db, log_dir, "--models", "slow")
    gw, url = start_gateway(model_repo, db, log_dir, threads=32)
    pool = ThreadPoolExecutor(12)
    try:
        wait_model_ready(url, "slow", 60, worker, gw)
        futures = [pool.submit(slow_request, url, float(i)) for i in range(12)]
        wait_until(lambda: in_flight(db) >= 1, 30, "a batch to start", worker)
        assert worker.stop(signal.SIGTERM, timeout=60) == 0
        assert "Warm shutdown" in worker.log() or "warm shutdown" in worker.log().lower()
        # What it ran was answered; what it had not run went back to the queue, and the
        # next worker serves it: every caller gets the right answer.
        after = start_worker(model_repo, db, log_dir, "--models", "slow")
        try:
            answered(futures, timeout=90)
            assert in_flight(db) == 0
        finally:
            after.stop()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        gw.stop()
        worker.stop()


def test_redelivered_request_past_its_deadline_is_dropped(
    model_repo: Path, db: str, log_dir: Path
) -> None:
    first = start_worker(model_repo, db, log_dir, "--models", "slow")
    gw, url = start_gateway(model_repo, db, log_dir)
    pool = ThreadPoolExecutor(1)
    try:
        wait_model_ready(url, "slow", 60, first, gw)

        def call() -> object:
            x = np.ones((1, 4), np.float32)
            inp = httpclient.InferInput("X", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            try:  # a 3 s deadline: shorter than the visibility timeout
                return httpclient.InferenceServerClient(url).infer("slow", [inp], timeout=3_000_000)
            except InferenceServerException as exc:
                return exc

        future = pool.submit(call)
        wait_until(lambda: in_flight(db) >= 1, 30, "the request to be taken", first)
        first.stop(signal.SIGKILL)
        second = start_worker(model_repo, db, log_dir, "--models", "slow")
        try:
            result = future.result(timeout=30)
            assert isinstance(result, InferenceServerException) and result.status() == "503"
            # kombu restores it after the visibility timeout; the new worker drops it unrun.
            wait_until(lambda: "deadline passed" in second.log(), 30, "the drop", second)
            assert in_flight(db) == 0 and waiting(db, "slow") == 0
            time.sleep(2)  # a heartbeat: an execution would show in the counters
            reports = worker_reports.snapshot(redis.Redis.from_url(db))
            assert all(
                r.get("stats", {}).get("slow", {}).get("executions", 0) == 0 for r in reports
            )
        finally:
            second.stop()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        gw.stop()
        first.stop()
