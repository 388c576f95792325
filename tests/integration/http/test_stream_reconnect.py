"""Streams that outlive their connection (issue 30, point 3), through the real path: a
real Redis, workers and gateways, read by a stock SSE client (``sseclient-py``) that
resumes with ``Last-Event-ID`` as a browser's EventSource does.

- a client that reconnects, across a gateway restart, gets exactly the events it had not
  received;
- a worker SIGKILLed mid-stream: the request runs again on another, the client is told
  (``event: restart``), and never sees two runs interleaved;
- a client that does not come back within the grace time cancels the request (the
  model's ``is_cancelled()`` turns true), one that comes back in time does not;
- the resume route's bad input gets a 400 in Triton's form.
"""

from __future__ import annotations

import json
import queue
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import sseclient
import tritonclient.grpc as grpcclient

from conch.wire import stream_log

from harness import (
    Service,
    fresh_db,
    start_gateway,
    start_grpc,
    start_worker,
    wait_grpc_model_ready,
    wait_model_ready,
    wait_until,
)

# Sends N responses, DELAY_MS apart: its index and the pid of the worker running it.
TICKER = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0]
            for index in range(count):
                if index:
                    time.sleep(delay / 1000.0)
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("IDX", np.array([index], np.int32)),
                    pb_utils.Tensor("PID", np.array([os.getpid()], np.int32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
TICKER_CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
instance_group [ { count: 2 kind: KIND_CPU } ]
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "PID" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Ticks every 50 ms until its caller is gone (is_cancelled), then ends with CANCELLED=1.
WATCHER = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            index = 0
            started = time.monotonic()
            while not request.is_cancelled() and time.monotonic() - started < 50:
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("IDX", np.array([index], np.int32)),
                    pb_utils.Tensor("CANCELLED", np.array([0], np.int32)),
                ]))
                index += 1
                time.sleep(0.05)
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("IDX", np.array([index], np.int32)),
                pb_utils.Tensor("CANCELLED", np.array([int(request.is_cancelled())], np.int32)),
            ]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
WATCHER_CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "GO" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "CANCELLED" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
GRACE_S = 2.0  # the cancel tests' --stream-grace-secs
LONG_GRACE_S = 60.0  # long enough that a gateway restart cancels nothing
VISIBILITY_S = 3  # a dead worker's message comes back this soon


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("streams") / "models"
    for name, source, config in (
        ("ticker", TICKER, TICKER_CONFIG),
        ("watcher", WATCHER, WATCHER_CONFIG),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.fixture()
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 13)


def workers(repo: Path, db: str, log_dir: Path, n: int) -> list[Service]:
    env = {"CONCH_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S)}
    return [
        start_worker(repo, db, log_dir, "--models", "ticker,watcher", env=env) for _ in range(n)
    ]


def gateway(repo: Path, db: str, log_dir: Path, grace_s: float) -> tuple[Service, str]:
    return start_gateway(repo, db, log_dir, env={"CONCH_STREAM_GRACE_S": str(grace_s)})


def open_stream(url: str, model: str, body: dict) -> requests.Response:
    r = requests.post(
        f"http://{url}/v2/models/{model}/generate_stream",
        data=json.dumps(body),
        stream=True,
        timeout=60,
        headers={"Accept": "text/event-stream"},
    )
    assert r.status_code == 200, r.text
    return r


def reopen(url: str, location: str, last_event_id: str) -> requests.Response:
    headers = {"Accept": "text/event-stream", "Last-Event-ID": last_event_id}
    return requests.get(f"http://{url}{location}", stream=True, timeout=60, headers=headers)


def events(response: requests.Response) -> Iterator[sseclient.Event]:
    return sseclient.SSEClient(response).events()


def test_a_reconnect_across_a_gateway_restart_gets_exactly_the_rest(
    repo: Path, db: str, log_dir: Path
) -> None:
    (worker,) = workers(repo, db, log_dir, 1)
    gw, url = gateway(repo, db, log_dir, LONG_GRACE_S)
    try:
        wait_model_ready(url, "ticker", 120, worker, gw)
        r = open_stream(url, "ticker", {"N": 30, "DELAY_MS": 100})
        location = r.headers["Content-Location"]
        assert location.startswith("/v2/streams/")
        got: list[sseclient.Event] = []
        for event in events(r):
            got.append(event)
            if len(got) == 5:
                break
        assert [e.id for e in got] == [f"1-{i}" for i in range(5)]
        # The gateway goes away in the middle of the stream; another comes up.
        gw.stop(signal.SIGKILL)
        r.close()
        gw, url = gateway(repo, db, log_dir, LONG_GRACE_S)
        with reopen(url, location, got[-1].id) as again:
            assert again.status_code == 200, again.text
            rest = list(events(again))
        docs = [json.loads(e.data) for e in got + rest]
        assert [d["IDX"] for d in docs] == list(range(30))  # none lost, none repeated
        assert [e.id for e in rest] == [f"1-{i}" for i in range(5, 30)]
        # The same again from the start, and from the middle, while the stream is kept.
        with reopen(url, location, "") as whole:
            assert [json.loads(e.data)["IDX"] for e in events(whole)] == list(range(30))
        with reopen(url, location, "1-27") as tail:
            assert [json.loads(e.data)["IDX"] for e in events(tail)] == [28, 29]
    finally:
        gw.stop()
        worker.stop()


def test_a_worker_killed_mid_stream_restarts_it_and_says_so(
    repo: Path, db: str, log_dir: Path
) -> None:
    pool = workers(repo, db, log_dir, 2)
    gw, url = gateway(repo, db, log_dir, LONG_GRACE_S)
    try:
        wait_model_ready(url, "ticker", 120, gw, *pool)
        r = open_stream(url, "ticker", {"N": 20, "DELAY_MS": 150})
        seen: list[sseclient.Event] = []
        stream = events(r)
        for event in stream:
            seen.append(event)
            if len(seen) == 4:
                break
        victim_pid = json.loads(seen[0].data)["PID"]
        (victim,) = [w for w in pool if w.pid == victim_pid]
        victim.stop(signal.SIGKILL)
        for event in stream:
            seen.append(event)
        restarts = [i for i, e in enumerate(seen) if e.event == "restart"]
        assert len(restarts) == 1, [(e.event, e.id, e.data) for e in seen]
        before = [json.loads(e.data) for e in seen[: restarts[0]]]
        after = [(e.id, json.loads(e.data)) for e in seen[restarts[0] + 1 :]]
        # The lost run's responses, then the whole of the new run, never mixed.
        assert [d["IDX"] for d in before] == list(range(len(before)))
        assert {d["PID"] for d in before} == {victim_pid}
        assert [d["IDX"] for _, d in after] == list(range(20))
        assert {d["PID"] for _, d in after} == {next(w.pid for w in pool if w is not victim)}
        assert [i for i, _ in after] == [f"2-{n}" for n in range(20)]
    finally:
        gw.stop()
        for w in pool:
            w.stop()


def test_a_grpc_stream_is_told_when_its_request_restarts(
    repo: Path, db: str, log_dir: Path
) -> None:
    pool = workers(repo, db, log_dir, 2)
    server, grpc_url = start_grpc(repo, db, log_dir)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        wait_grpc_model_ready(grpc_url, "ticker", 120, server, *pool)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        inputs = []
        for name, value in (("N", 12), ("DELAY_MS", 150)):
            tensor = grpcclient.InferInput(name, [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], np.int32))
            inputs.append(tensor)
        client.async_stream_infer(
            "ticker", inputs, request_id="t", enable_empty_final_response=True
        )
        got: list[tuple[int, int, bool, bool]] = []
        while not got or not got[-1][3]:
            try:
                result, error = answers.get(timeout=60)
            except queue.Empty:
                raise AssertionError(f"no answer after {got}") from None
            assert error is None, error
            params = result.get_response().parameters
            restarted = "conch_restarted" in params and params["conch_restarted"].bool_param
            final = params["triton_final_response"].bool_param
            if result.get_response().outputs:
                idx, pid = (int(result.as_numpy(n)[0]) for n in ("IDX", "PID"))
                got.append((idx, pid, restarted, final))
            else:
                got.append((-1, 0, restarted, final))
            if len(got) == 3:
                (victim,) = [w for w in pool if w.pid == got[0][1]]
                victim.stop(signal.SIGKILL)
        (at,) = [i for i, g in enumerate(got) if g[2]]  # one response says so, once
        assert [g[0] for g in got[:at]] == list(range(at))
        assert [g[0] for g in got[at:-1]] == list(range(12))  # the whole new run
        assert len({g[1] for g in got[at:-1]}) == 1 and got[at][1] != got[0][1]
    finally:
        client.stop_stream()
        client.close()
        server.stop()
        for w in pool:
            w.stop()


def test_a_cancelled_grpc_stream_cancels_its_request_at_once(
    repo: Path, db: str, log_dir: Path
) -> None:
    (worker,) = workers(repo, db, log_dir, 1)
    server, grpc_url = start_grpc(repo, db, log_dir)
    try:
        wait_grpc_model_ready(grpc_url, "watcher", 120, server, worker)
        go = grpcclient.InferInput("GO", [1], "INT32")
        go.set_data_from_numpy(np.array([1], np.int32))
        answers: queue.Queue = queue.Queue()
        first = grpcclient.InferenceServerClient(grpc_url)
        first.start_stream(callback=lambda result, error: answers.put((result, error)))
        first.async_stream_infer("watcher", [go], request_id="a")
        result, error = answers.get(timeout=30)
        assert error is None and int(result.as_numpy("CANCELLED")[0]) == 0
        first.stop_stream(cancel_requests=True)
        first.close()
        # The model's one instance was held by that request for up to 50 s: it sees
        # is_cancelled() and ends it, so a second request starts at once.
        second = grpcclient.InferenceServerClient(grpc_url)
        again: queue.Queue = queue.Queue()
        second.start_stream(callback=lambda result, error: again.put((result, error)))
        started = time.monotonic()
        second.async_stream_infer("watcher", [go], request_id="b")
        result, error = again.get(timeout=30)
        assert error is None and time.monotonic() - started < 10
        second.stop_stream(cancel_requests=True)
        second.close()
    finally:
        server.stop()
        worker.stop()


def log_entries(db: str, stream_id: str) -> list[stream_log.Entry]:
    return stream_log.read(
        redis.Redis.from_url(db), stream_id, stream_log.HEAD, block_ms=0, count=100_000
    )


def test_a_client_gone_past_its_grace_time_cancels_the_request(
    repo: Path, db: str, log_dir: Path
) -> None:
    (worker,) = workers(repo, db, log_dir, 1)
    gw, url = gateway(repo, db, log_dir, GRACE_S)
    try:
        wait_model_ready(url, "watcher", 120, worker, gw)
        r = open_stream(url, "watcher", {"GO": 1})
        location = r.headers["Content-Location"]
        stream_id = location.rsplit("/", 1)[1]
        first = next(events(r))
        assert json.loads(first.data)["CANCELLED"] == 0
        r.close()  # away, but back within the grace time: nothing is cancelled
        time.sleep(GRACE_S / 2)
        with reopen(url, location, first.id) as again:
            assert again.status_code == 200
            more = []
            for event in events(again):
                more.append(json.loads(event.data))
                if len(more) == 3:
                    break
        assert [d["CANCELLED"] for d in more] == [0, 0, 0]
        assert more[0]["IDX"] == json.loads(first.data)["IDX"] + 1
        # Away for good: the model finds itself cancelled within the grace time (and the
        # lease's renewal period), and ends the stream.
        gone = time.monotonic()

        def ended() -> bool:
            entries = log_entries(db, stream_id)
            return bool(entries) and entries[-1].reply.final

        wait_until(ended, GRACE_S + 10, "the model to see it was cancelled", worker, gw)
        assert time.monotonic() - gone > GRACE_S - 0.5
        last = log_entries(db, stream_id)[-1].reply
        assert {name: raw for name, _, _, raw in last.outputs or ()}["CANCELLED"] == (
            (1).to_bytes(4, "little")
        )
    finally:
        gw.stop()
        worker.stop()


def test_the_resume_route_refuses_bad_input(repo: Path, db: str, log_dir: Path) -> None:
    (worker,) = workers(repo, db, log_dir, 1)
    gw, url = gateway(repo, db, log_dir, LONG_GRACE_S)
    try:
        wait_model_ready(url, "ticker", 120, worker, gw)
        with open_stream(url, "ticker", {"N": 2, "DELAY_MS": 0}) as r:
            location = r.headers["Content-Location"]
            assert [e.id for e in events(r)] == ["1-0", "1-1"]
        cases = {
            "/v2/streams/not-a-stream": ("", "is not a stream id"),
            "/v2/streams/" + "ab" * 16: ("", "is unknown or expired"),
            location + "?": ("7-7", "is not an event of stream"),
            location: ("yesterday", "is not a stream position"),
        }
        for path, (last, words) in cases.items():
            got = reopen(url, path.rstrip("?"), last)
            assert got.status_code == 400, (path, got.text)
            assert words in got.json()["error"], got.text
    finally:
        gw.stop()
        worker.stop()
