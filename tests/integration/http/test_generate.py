"""Triton's generate extension through a real gateway, worker and Redis, read with plain
``requests`` (a raw Server-Sent Events reader: ``data:`` lines).

- ``repeat`` (decoupled): one response per element of ``IN``, ``DELAY_MS`` apart; an
  element -1 is an error response that ends the request.
- ``shout`` (one response): ``PROMPT`` upper-cased into ``TEXT``, ``PROMPT``'s length
  into ``LEN``, and the request's ``suffix`` parameter appended when given.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from harness import (
    Service,
    connect,
    fresh_db,
    start_gateway,
    start_worker,
    wait_model_ready,
    wait_until,
    waiting,
)

REPEAT = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0]
            for index, value in enumerate(values):
                if index:
                    time.sleep(delay / 1000.0)
                if value == 0:
                    continue  # no response for it
                if value == -1:
                    error = pb_utils.TritonError("An Error Occurred")
                    sender.send(pb_utils.InferenceResponse(error=error),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                ]))
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
REPEAT_CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""
SHOUT = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            text = prompt.reshape(-1)[0].decode().upper()
            text += json.loads(request.parameters() or "{}").get("suffix", "")
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TEXT", np.array([[text.encode()]], np.object_)),
                pb_utils.Tensor("LEN", np.array([[len(text)]], np.int32)),
            ]))
        return responses
"""
SHOUT_CONFIG = """backend: "python"
max_batch_size: 4
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "LEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
SSE = "text/event-stream; charset=utf-8"
GRACE_S = 2.0  # how long a stream's request outlives its client (--stream-grace-secs)


@pytest.fixture(scope="module")
def served(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[tuple[str, str]]:
    repo = tmp_path_factory.mktemp("generate") / "models"
    for name, source, config in (("repeat", REPEAT, REPEAT_CONFIG), ("shout", SHOUT, SHOUT_CONFIG)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(source)
        (repo / name / "config.pbtxt").write_text(config)
    db = fresh_db(redis_url, 12)
    worker: Service = start_worker(repo, db, log_dir, "--models", "repeat,shout")
    gateway, url = start_gateway(repo, db, log_dir, env={"CONCH_STREAM_GRACE_S": str(GRACE_S)})
    try:
        for model in ("repeat", "shout"):
            wait_model_ready(url, model, 120, worker, gateway)
        yield url, db
    finally:
        gateway.stop()
        worker.stop()


@pytest.fixture()
def url(served: tuple[str, str]) -> str:
    return served[0]


def post(url: str, model: str, route: str, body: object, **kw) -> requests.Response:
    data = body if isinstance(body, str) else json.dumps(body)
    return requests.post(f"http://{url}/v2/models/{model}/{route}", data=data, timeout=60, **kw)


def events(response: requests.Response) -> Iterator[tuple[float, dict]]:
    """Each ``data:`` event as it arrives, with when it arrived."""
    lines = []
    for line in response.iter_lines(chunk_size=1, decode_unicode=True):
        if line:
            lines.append(line)
            continue
        if lines:
            data = [x for x in lines if not x.startswith("id: ")]  # a kept stream's ids
            assert all(x.startswith("data: ") for x in data), lines
            yield time.monotonic(), json.loads("".join(x[len("data: ") :] for x in data))
            lines = []
    assert not lines, f"an event left unterminated: {lines}"


def test_generate_stream_sends_each_response_as_it_comes(url: str) -> None:
    started = time.monotonic()
    with post(
        url, "repeat", "generate_stream", {"IN": [7, 8, 9, 10], "DELAY_MS": 400}, stream=True
    ) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"] == SSE
        got = list(events(r))
    ended = time.monotonic()
    docs = [doc for _, doc in got]
    assert docs == [
        {"IDX": i, "OUT": v, "model_name": "repeat", "model_version": "1"}
        for i, v in enumerate([7, 8, 9, 10])
    ]
    arrivals = [t for t, _ in got]
    # Three 400 ms sleeps lie between the first response and the last: the first event
    # was read long before the stream ended, and each one after a pause.
    assert arrivals[-1] - arrivals[0] > 1.0
    assert ended - arrivals[0] > 1.0
    assert all(b - a > 0.25 for a, b in itertools.pairwise(arrivals))
    assert arrivals[0] - started < ended - started - 1.0


def test_generate_stream_on_a_one_response_model_is_one_event(url: str) -> None:
    with post(url, "shout", "generate_stream", {"PROMPT": "hi", "id": "7"}, stream=True) as r:
        assert r.status_code == 200 and r.headers["Content-Type"] == SSE
        docs = [doc for _, doc in events(r)]
    assert docs == [
        {"LEN": 2, "TEXT": "HI", "id": "7", "model_name": "shout", "model_version": "1"}
    ]


def test_generate_answers_a_one_response_model_in_json(url: str) -> None:
    r = post(url, "shout", "generate", {"PROMPT": ["quiet"], "parameters": {"suffix": "!"}})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/json"
    assert r.json() == {"LEN": 6, "TEXT": "QUIET!", "model_name": "shout", "model_version": "1"}
    assert list(r.json()) == ["LEN", "TEXT", "model_name", "model_version"]
    # The version in the URL, and a request id given back.
    r = requests.post(
        f"http://{url}/v2/models/shout/versions/1/generate",
        data=json.dumps({"id": "abc", "PROMPT": "x", "COUNT": 3}),
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "abc" and r.json()["TEXT"] == "X"


def test_generate_takes_a_decoupled_model_that_sends_one_response(url: str) -> None:
    r = post(url, "repeat", "generate", {"IN": [5], "DELAY_MS": 0})
    assert r.status_code == 200, r.text
    assert r.json() == {"IDX": 0, "OUT": 5, "model_name": "repeat", "model_version": "1"}


@pytest.mark.parametrize("values", [[1, 2, 3], [0]])
def test_generate_refuses_other_than_one_response_in_tritons_words(url: str, values) -> None:
    r = post(url, "repeat", "generate", {"IN": values, "DELAY_MS": 0})
    assert r.status_code == 500
    assert r.headers["Content-Type"] == "application/json"
    assert r.json() == {
        "error": "generate expects model to produce exactly 1 response, use generate "
        "stream for model that generates various number of responses"
    }


def test_an_error_mid_stream_is_an_error_event_under_200(url: str) -> None:
    with post(
        url, "repeat", "generate_stream", {"IN": [1, 2, -1, 4], "DELAY_MS": 10}, stream=True
    ) as r:
        assert r.status_code == 200 and r.headers["Content-Type"] == SSE
        docs = [doc for _, doc in events(r)]
    assert [d.get("OUT") for d in docs[:2]] == [1, 2]
    assert len(docs) == 3 and docs[2]["error"].endswith("An Error Occurred")


def test_an_error_as_the_first_response_sets_the_status(url: str) -> None:
    with post(url, "repeat", "generate_stream", {"IN": [-1], "DELAY_MS": 0}, stream=True) as r:
        assert r.status_code >= 400
        assert r.headers["Content-Type"] == SSE
        docs = [doc for _, doc in events(r)]
    assert len(docs) == 1 and docs[0]["error"].endswith("An Error Occurred")


def model_counts(url: str, model: str) -> tuple[int, int, int]:
    stats = requests.get(f"http://{url}/v2/models/{model}/stats", timeout=10).json()
    version = stats["model_stats"][0]
    inference = version["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"], version["execution_count"]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize("body", [{}, {"abc": 123}, "", {"id": ""}, {"id": "r1"}])
def test_a_body_that_matches_no_input_is_a_400_and_queues_nothing(
    served: tuple[str, str], route: str, body: object
) -> None:
    url, db = served
    before = model_counts(url, "shout")
    r = post(url, "shout", route, body)
    assert r.status_code == 400
    assert r.headers["Content-Type"] == "application/json"
    message = r.json()["error"]
    assert "expected 1 inputs but got 0 inputs for model 'shout'" in message or (
        "expected number of inputs between 1 and 2 but got 0" in message
    ), message
    assert waiting(db, "shout") == 0
    time.sleep(0.3)
    assert model_counts(url, "shout") == before  # nothing reached a worker


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_tritons_request_errors_come_before_anything_runs(url: str, route: str) -> None:
    cases = [
        ({"PROMPT": 123}, 400, "attempt to access JSON non-string as string"),
        ('{"PROMPT": "a", "PROMPT": "b"}', 400, "input 'PROMPT' already exists in request"),
        ({"PROMPT": "a", "PARAMS": {"x": 1}}, 400, "parameter 'PARAMS' has invalid type"),
        ({"PROMPT": "a", "parameters": 1}, 400, "Expected JSON object for keyword: 'parameters'"),
    ]
    for body, status, message in cases:
        r = post(url, "shout", route, body)
        assert r.status_code == status, (body, r.text)
        assert r.headers["Content-Type"] == "application/json"
        assert message in r.json()["error"], (body, r.json())
    r = post(url, "nope", route, {"PROMPT": "a"})
    assert r.status_code in (400, 404) and "nope" in r.json()["error"]


def test_a_client_that_goes_away_withdraws_its_queued_request(served: tuple[str, str]) -> None:
    url, db = served
    before = model_counts(url, "repeat")
    # The model's one instance is kept busy by a first stream (7 x 600 ms)...
    busy = post(
        url,
        "repeat",
        "generate_stream",
        {"IN": [1, 2, 3, 4, 5, 6, 7, 8], "DELAY_MS": 600},
        stream=True,
    )
    try:
        stream = events(busy)
        assert next(stream)[1]["OUT"] == 1
        # ... while a second request waits in the queue, its client then gone.
        body = json.dumps({"IN": [5, 6], "DELAY_MS": 0}).encode()
        sock = connect(url)
        sock.sendall(
            b"POST /v2/models/repeat/generate_stream HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        wait_until(lambda: waiting(db, "repeat") == 1, 5, "the second request queued")
        sock.close()
        # Its client may come back within the grace time: still queued meanwhile...
        time.sleep(GRACE_S / 2)
        assert waiting(db, "repeat") == 1
        # ... then withdrawn while the instance is still busy with the first (no worker
        # took it).
        wait_until(lambda: waiting(db, "repeat") == 0, GRACE_S + 1, "the request withdrawn")
        assert [d["OUT"] for _, d in stream] == [2, 3, 4, 5, 6, 7, 8]  # the first unharmed
    finally:
        busy.close()
    time.sleep(0.5)
    success, fail, executions = model_counts(url, "repeat")
    # Only the first request ran; the withdrawn one counts as a failure (cancelled).
    assert (success - before[0], fail - before[1], executions - before[2]) == (1, 1, 1)
