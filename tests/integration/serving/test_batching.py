"""Triton's dynamic batching and queue policy, observed through the real path."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.wire import broker, keys, worker_reports

from harness import start_gateway, start_worker, wait_model_ready, wait_until

MODELS = (
    "add",
    "add_batched",
    "add_preferred",
    "add_pref4",
    "step_prio",
    "step_reject",
    "step_delay",
    "step_bounded",
    "loop_ordered",
    "loop_unordered",
    "batch_probe",
    "batch_probe_alone",
)


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    url = redis_url.rsplit("/", 1)[0] + "/15"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="module")
def stack(model_repo: Path, db: str, log_dir: Path) -> Iterator[str]:
    worker = start_worker(model_repo, db, log_dir, "--models", ",".join(MODELS))
    gateway, url = start_gateway(model_repo, db, log_dir, workers=2, threads=32)
    try:
        for m in MODELS:
            wait_model_ready(url, m, 90, worker, gateway)
        yield url
    finally:
        gateway.stop()
        worker.stop()


def counters(db: str, model: str) -> dict[str, int]:
    total = {"executions": 0, "requests": 0, "rows": 0}
    for report in worker_reports.snapshot(redis.Redis.from_url(db)):
        for k, v in report.get("stats", {}).get(model, {}).items():
            total[k] = total.get(k, 0) + v
    return total


def settled(db: str, model: str, requests: int) -> dict[str, int]:
    """The counters once the worker's heartbeat has reported ``requests`` of them."""
    wait_until(lambda: counters(db, model)["requests"] >= requests, 10, f"{model} counters")
    return counters(db, model)


def add(url: str, model: str, a: np.ndarray, **kw) -> np.ndarray:
    inputs = []
    for name in ("A", "B"):
        i = httpclient.InferInput(name, list(a.shape), "FP32")
        i.set_data_from_numpy(a)
        inputs.append(i)
    return (
        httpclient.InferenceServerClient(url, network_timeout=60)
        .infer(model, inputs, **kw)
        .as_numpy("OUT")
    )


def step(url: str, model: str, value: float, **kw) -> np.ndarray:
    x = np.full((1, 4), value, np.float32)
    i = httpclient.InferInput("X", [1, 4], "FP32")
    i.set_data_from_numpy(x)
    return (
        httpclient.InferenceServerClient(url, network_timeout=60)
        .infer(model, [i], **kw)
        .as_numpy("Y")
    )


def test_requests_of_different_sizes_batch_together_and_split_back(stack: str, db: str) -> None:
    before = counters(db, "add_batched")
    arrays = [
        np.random.default_rng(i).standard_normal((1 + i % 3, 4), dtype=np.float32)
        for i in range(32)
    ]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda a: add(stack, "add_batched", a), arrays))
    for a, got in zip(arrays, results, strict=True):
        np.testing.assert_array_equal(got, a + a)
    after = settled(db, "add_batched", before["requests"] + 32)
    executions = after["executions"] - before["executions"]
    rows = after["rows"] - before["rows"]
    assert rows == sum(a.shape[0] for a in arrays)
    assert executions < 32 / 2, f"{executions} executions for 32 requests: they were not batched"
    assert rows / executions <= 16  # never past max_batch_size


def test_auto_complete_adds_no_batcher_to_a_config_listing_its_tensors(stack: str) -> None:
    """The ONNX model "add" lists its inputs and outputs, max_batch_size 8, no scheduler.
    Triton's onnxruntime backend completes nothing in such a config (its L0_model_config
    onnx/cpu_instance expects no batcher), so it runs on the default scheduler. conch
    used to add a dynamic batcher preferring batches of max_batch_size."""
    config = httpclient.InferenceServerClient(stack).get_model_config("add")
    assert config["max_batch_size"] == 8 and "dynamic_batching" not in config


def _probe_burst(url: str, db: str, model: str) -> list[int]:
    """A half-second request, then five more queued behind it on the model's one
    instance: how many requests each one's execution held."""

    def one(seconds: float) -> int:
        i = httpclient.InferInput("X", [1, 1], "FP32")
        i.set_data_from_numpy(np.full((1, 1), seconds, np.float32))
        y = httpclient.InferenceServerClient(url, network_timeout=60).infer(model, [i])
        return int(y.as_numpy("Y")[0, 1])

    queue = broker.queue_name(model).encode()
    inflight = redis.Redis.from_url(db)
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(one, 0.5)
        wait_until(
            lambda: any(queue in v for v in inflight.hvals(keys.UNACKED)), 10, "the first request"
        )
        rest = [pool.submit(one, 0.0) for _ in range(5)]
        return [f.result() for f in (first, *rest)]


def test_a_python_model_without_dynamic_batching_runs_each_request_alone(
    stack: str, db: str
) -> None:
    # Triton's Python backend adds no dynamic_batching: max_batch_size 8 alone does not
    # make the model take 8 requests at once.
    config = httpclient.InferenceServerClient(stack).get_model_config("batch_probe_alone")
    assert config["max_batch_size"] == 8 and "dynamic_batching" not in config
    assert _probe_burst(stack, db, "batch_probe_alone") == [1] * 6
    # The same model asking for dynamic_batching takes the queued ones together.
    assert max(_probe_burst(stack, db, "batch_probe")) > 1


def test_no_dynamic_batching_runs_one_request_per_execution(
    model_repo: Path, redis_url: str, log_dir: Path
) -> None:
    db = redis_url.rsplit("/", 1)[0] + "/14"
    redis.Redis.from_url(db).flushdb()
    flags = ("--disable-auto-complete-config",)
    worker = start_worker(model_repo, db, log_dir, "--models", "add", *flags)
    gateway, url = start_gateway(model_repo, db, log_dir, *flags, threads=16)
    try:
        wait_model_ready(url, "add", 60, worker, gateway)
        assert "dynamic_batching" not in httpclient.InferenceServerClient(url).get_model_config(
            "add"
        )
        arrays = [np.full((2, 4), float(i), np.float32) for i in range(24)]
        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(lambda a: add(url, "add", a), arrays))
        for a, got in zip(arrays, results, strict=True):
            np.testing.assert_array_equal(got, a + a)
        assert settled(db, "add", 24)["executions"] == 24
    finally:
        gateway.stop()
        worker.stop()


def _timed_burst(url: str, model: str, n: int) -> float:
    barrier = threading.Barrier(n)

    def one(i: int) -> float:
        barrier.wait()
        t = time.monotonic()
        add(url, model, np.full((1, 4), float(i), np.float32))
        return time.monotonic() - t

    with ThreadPoolExecutor(n) as pool:
        return max(pool.map(one, range(n)))


def test_batch_waits_out_the_delay_unless_a_preferred_size_is_reached(stack: str) -> None:
    # max_queue_delay is 1 s on both; four requests make a batch of 4 rows.
    assert _timed_burst(stack, "add_preferred", 4) > 0.9  # waited for more, from the oldest
    assert _timed_burst(stack, "add_pref4", 4) < 0.6  # 4 is preferred: it goes at once


def test_priority_levels_run_high_before_low(stack: str) -> None:
    # A backlog of low-priority work (level 2, the default), then high-priority requests.
    done: list[tuple[str, float]] = []
    lock = threading.Lock()

    def one(kind: str, value: float, priority: int) -> None:
        got = step(stack, "step_prio", value, priority=priority)
        np.testing.assert_array_equal(got, np.full((1, 4), value + 1, np.float32))
        with lock:
            done.append((kind, time.monotonic()))

    with ThreadPoolExecutor(20) as pool:
        lows = [pool.submit(one, "low", float(i), 0) for i in range(12)]
        # The backlog is queued and the worker is busy with it.
        wait_until(lambda: len(done) >= 1, 30, "the first low request")
        with lock:
            low_before = len(done)
        highs = [pool.submit(one, "high", float(i), 1) for i in range(4)]
        for f in lows + highs:
            f.result()
    order = [kind for kind, _ in sorted(done, key=lambda d: d[1])]
    last_high = max(i for i, k in enumerate(order) if k == "high")
    lows_overtaken = order[last_high:].count("low")
    # The high requests overtake the low backlog: only the lows already done or running
    # when they arrived (one runs at a time, ~40 ms each) finish before them.
    assert lows_overtaken >= 12 - low_before - 2, order


def test_queue_timeout_reject_and_delay(stack: str) -> None:
    # 12 requests at once to a model that runs one at a time (~40 ms each): the later ones
    # wait past the 150 ms queue timeout.
    def burst(model: str) -> list[object]:
        def one(i: int) -> object:
            try:
                return step(stack, model, float(i))
            except InferenceServerException as exc:
                return exc

        with ThreadPoolExecutor(12) as pool:
            return list(pool.map(one, range(12)))

    rejected = [r for r in burst("step_reject") if isinstance(r, InferenceServerException)]
    assert rejected, "REJECT let every request wait past its queue timeout"
    assert all(r.status() == "503" and "Request timeout expired" in str(r) for r in rejected)
    delayed = burst("step_delay")
    assert not [
        r for r in delayed if isinstance(r, InferenceServerException)
    ]  # DELAY runs them all
    for i, r in enumerate(delayed):
        np.testing.assert_array_equal(r, np.full((1, 4), i + 1.0, np.float32))


def test_full_queue_is_refused_with_503(stack: str) -> None:
    def one(i: int) -> object:
        try:
            return step(stack, "step_bounded", float(i))
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(one, range(10)))
    refused = [r for r in results if isinstance(r, InferenceServerException)]
    assert refused and all(r.status() == "503" and "maximum queue size" in str(r) for r in refused)
    served = [r for r in results if not isinstance(r, InferenceServerException)]
    assert served  # the ones that fit are served


# Linux's SO_TIMESTAMPNS (Python's socket module does not name it): the kernel stamps
# every received segment, so the order responses arrived in is read off the wire, not
# off which client thread the GIL happened to wake first.
SO_TIMESTAMPNS = 35


def _infer_bytes(model: str, rounds: float) -> bytes:
    tensor = {"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [rounds]}
    body = json.dumps({"inputs": [tensor]}).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _arrival_ns(sock: socket.socket) -> int:
    """When the first bytes of the response on ``sock`` reached this host (kernel time)."""
    sock.settimeout(60)
    data, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(16))
    assert data.startswith(b"HTTP/1.1 200"), data
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", raw[:16])
            return sec * 1_000_000_000 + nsec
    raise AssertionError("no receive timestamp")


def _completion_order(url: str, db: str, model: str) -> list[float]:
    """A long request, then short ones, over two instances: the order replies come back."""
    host, port = url.rsplit(":", 1)
    rounds = [150.0] + [1.0] * 6  # about half a second on one instance; a few ms each
    socks = [socket.create_connection((host, int(port)), timeout=30) for _ in rounds]
    try:
        for s in socks:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        socks[0].sendall(_infer_bytes(model, rounds[0]))
        # The short ones go once the long one is taken (in flight on this model's queue),
        # not after a guess at how long that takes on a loaded machine, nor on another
        # request's say-so (the unacked hash is shared by every model: look for this one's).
        inflight = redis.Redis.from_url(db)
        queue = broker.queue_name(model).encode()
        wait_until(
            lambda: any(queue in v for v in inflight.hvals(keys.UNACKED)), 10, "the long request"
        )
        for s, r in zip(socks[1:], rounds[1:], strict=True):
            s.sendall(_infer_bytes(model, r))
            time.sleep(0.01)
        arrived = [_arrival_ns(s) for s in socks]
    finally:
        for s in socks:
            s.close()
    return [r for _, r in sorted(zip(arrived, rounds, strict=True))]


def test_preserve_ordering_holds_replies_back_until_earlier_ones_are_out(
    stack: str, db: str
) -> None:
    # Without preserve_ordering the short requests overtake the long one...
    assert _completion_order(stack, db, "loop_unordered")[0] == 1.0
    # ...with it, every reply leaves in the order the requests were taken.
    assert _completion_order(stack, db, "loop_ordered")[0] == 150.0
