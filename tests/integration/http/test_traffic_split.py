"""Traffic splits across a model's versions (canary, A/B, shadow) through the real path.

One Redis, one worker, two gateways and a gRPC server. The model ``canary`` serves
versions 1, 2 and 3 (``version_policy: specific``; a version 4 in the repository is not
served), each answering Y = X + 100 * version, so an answer says which version made it,
beside its ``model_version``. ``idle`` has two versions no worker serves (never ready).
Gateway A is open; gateway B restricts the model-repository group
(``--http-restricted-api``), which the traffic routes belong to, as load and unload do.
A split set over HTTP routes the gRPC server's calls and streams too.
"""

from __future__ import annotations

import json
import queue
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.grpc as grpcclient

from conch.wire import traffic_split

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
from models import offset_model

MODEL = "canary"
HEADER = {"admin-key": "s3cret"}  # opens gateway B's model-repository group
X = [0.0, 1.0, 2.0, 3.0]
# Long enough for every gateway's copy of the splits to be read again.
SETTLE_S = traffic_split.MAX_AGE_S + 0.5


@dataclass
class Stack:
    a: str  # the open gateway's address
    b: str  # the restricted one's
    db: str  # its Redis database
    grpc: str  # the gRPC server's address


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[Stack]:
    repo = tmp_path_factory.mktemp("traffic") / "models"
    for name, versions in ((MODEL, (1, 2, 3)), ("idle", (1, 2))):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            "dynamic_batching { }\n"
            f"version_policy: {{ specific: {{ versions: {list(versions)} }} }}\n"
        )
        for v in (*versions, len(versions) + 1):  # and one more, not served
            offset_model(repo / name, v, 100.0 * v)
    db = fresh_db(redis_url, 12)
    worker: Service = start_worker(repo, db, log_dir, "--models", MODEL)
    a_svc, a = start_gateway(repo, db, log_dir)
    b_svc, b = start_gateway(
        repo, db, log_dir, "--http-restricted-api", "model-repository:admin-key=s3cret"
    )
    g_svc, g = start_grpc(repo, db, log_dir)
    try:
        for url in (a, b):
            wait_model_ready(url, MODEL, 120, worker, a_svc, b_svc)
        wait_grpc_model_ready(g, MODEL, 120, worker, g_svc)
        yield Stack(a, b, db, g)
    finally:
        g_svc.stop()
        b_svc.stop()
        a_svc.stop()
        worker.stop()


@pytest.fixture(autouse=True)
def no_split_after(stack: Stack) -> Iterator[None]:
    """Each test starts and ends with no split, in every gateway's copy too."""
    yield
    requests.delete(_traffic_url(stack.a, MODEL), timeout=10).raise_for_status()
    time.sleep(SETTLE_S)


def _traffic_url(url: str, model: str) -> str:
    return f"http://{url}/v2/repository/models/{model}/traffic"


def _set(url: str, split: object, model: str = MODEL, **kw) -> requests.Response:
    return requests.post(_traffic_url(url, model), data=json.dumps(split), timeout=10, **kw)


def _infer(url: str, version: str = "", request_id: str = "", session=requests) -> int:
    """One request; the version that answered, checked against the answer itself."""
    path = f"/versions/{version}" if version else ""
    body = {"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": X}]}
    if request_id:
        body["id"] = request_id
    r = session.post(f"http://{url}/v2/models/{MODEL}{path}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    doc = r.json()
    answered = int(doc["model_version"])
    assert doc["outputs"][0]["data"] == [x + 100 * answered for x in X], doc
    if request_id:
        assert doc["id"] == request_id
    return answered


def _many(url: str, n: int, ids: list[str] | None = None) -> list[int]:
    """``n`` requests naming no version, 8 at a time; the versions that answered."""

    def one(i: int) -> int:
        return _infer(url, request_id=ids[i] if ids else "")

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def _successes(url: str, version: int) -> int:
    r = requests.get(f"http://{url}/v2/models/{MODEL}/versions/{version}/stats", timeout=10)
    r.raise_for_status()
    return r.json()["model_stats"][0]["inference_stats"]["success"]["count"]


def _shadow_records(stack: Stack, answered: dict[str, int]) -> dict[str, dict[str, str]]:
    """The shadow's record of each request ``answered`` (id -> the version that
    answered), once all are there: each ran on version 3, beside the version named."""
    client = redis.Redis.from_url(stack.db)

    def records() -> dict[str, dict[str, str]]:
        rows = traffic_split.shadow_records(client, MODEL)
        return {row["id"]: row for row in rows if row["id"] in answered}

    wait_until(lambda: len(records()) == len(answered), 30, "a shadow record for each request")
    got = records()
    for rid, row in got.items():
        assert row["version"] == "3" and row["status"] == "ok", row
        assert row["primary_version"] == str(answered[rid])
    return got


def test_no_split_answers_from_the_latest_version(stack: Stack) -> None:
    r = requests.get(_traffic_url(stack.a, MODEL), timeout=10)
    assert r.status_code == 200 and r.json() == {"weights": {}}
    assert _infer(stack.a) == _infer(stack.b) == 3


def test_weights_split_the_requests_of_every_gateway(stack: Stack) -> None:
    split = {"weights": {"1": 80, "2": 20}}
    r = _set(stack.a, split)
    assert r.status_code == 200 and r.json() == split
    # Set through one gateway, read through the other: the split lives in Redis.
    assert requests.get(_traffic_url(stack.b, MODEL), timeout=10).status_code == 403
    got = requests.get(_traffic_url(stack.b, MODEL), headers=HEADER, timeout=10)
    assert got.status_code == 200 and got.json() == split
    time.sleep(SETTLE_S)
    before = {v: _successes(stack.a, v) for v in (1, 2, 3)}
    with ThreadPoolExecutor(2) as pool:
        on_a, on_b = pool.map(lambda url: _many(url, 200), (stack.a, stack.b))
    seen = on_a + on_b
    assert set(seen) <= {1, 2}
    share = seen.count(2) / len(seen)
    assert 0.12 <= share <= 0.28, share  # 20% +- 8 points (4 standard deviations)
    for answers in (on_a, on_b):  # each gateway applies it
        assert 0.05 <= answers.count(2) / len(answers) <= 0.40, answers.count(2)
    # The statistics per version agree with what the clients saw.
    after = {v: _successes(stack.b, v) for v in (1, 2, 3)}
    assert {v: after[v] - before[v] for v in after} == {1: seen.count(1), 2: seen.count(2), 3: 0}


def test_a_request_that_names_a_version_is_untouched(stack: Stack) -> None:
    assert _set(stack.a, {"weights": {"1": 1}}).status_code == 200
    assert [_infer(stack.a, v) for v in ("3", "2", "1", "")] == [3, 2, 1, 1]


def test_a_shadow_copy_is_recorded_and_never_returned(stack: Stack) -> None:
    split = {"weights": {"1": 50, "2": 50}, "shadow": {"version": 3, "share": 1.0}}
    assert _set(stack.a, split).json() == split
    before = _successes(stack.a, 3)
    ids = [f"shadow-{uuid.uuid4().hex[:8]}-{i}" for i in range(30)]
    answered = dict(zip(ids, _many(stack.a, len(ids), ids), strict=True))
    assert set(answered.values()) <= {1, 2}  # the split's versions answer, never the shadow
    for row in _shadow_records(stack, answered).values():
        assert row["error"] == "", row
        assert row["message"] and row["shadow_message"] and row["message"] != row["shadow_message"]
        assert float(row["took_ms"]) >= 0 and float(row["at"]) > 0
        (output,) = json.loads(row["outputs"])
        assert output == {
            "name": "Y",
            "datatype": "FP32",
            "shape": [1, 4],
            "bytes": 16,
            "data": [x + 300 for x in X],
        }
    # The copies ran on version 3, and count there.
    assert _successes(stack.a, 3) - before == len(ids)


def _grpc_input() -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.array([X], np.float32))
    return [x]


def _grpc_version(result: grpcclient.InferResult) -> int:
    """The version that answered a gRPC call, checked against the answer itself."""
    answered = int(result.get_response().model_version)
    assert result.as_numpy("Y").tolist() == [[x + 100 * answered for x in X]]
    return answered


def test_a_split_routes_grpc_calls_and_streams(stack: Stack) -> None:
    """Set over HTTP, the split routes the gRPC server's calls (ModelInfer) and the
    requests of a stream (ModelStreamInfer) that name no version; one that names a
    version is untouched; each of them gets its shadow copy, recorded, never returned."""
    split = {"weights": {"1": 80, "2": 20}, "shadow": {"version": 3, "share": 1.0}}
    assert _set(stack.a, split).json() == split
    time.sleep(SETTLE_S)
    before = {v: _successes(stack.a, v) for v in (1, 2, 3)}
    ids = [f"grpc-{uuid.uuid4().hex[:8]}-{i}" for i in range(100)]

    def call(rid: str) -> int:
        client = grpcclient.InferenceServerClient(stack.grpc)
        try:
            return _grpc_version(client.infer(MODEL, _grpc_input(), request_id=rid))
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        answered = dict(zip(ids, pool.map(call, ids), strict=True))
    streamed: dict[str, int] = {}
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(stack.grpc)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        stream_ids = [f"stream-{uuid.uuid4().hex[:8]}-{i}" for i in range(60)]
        for rid in stream_ids:
            client.async_stream_infer(MODEL, _grpc_input(), request_id=rid)
        for _ in stream_ids:
            result, error = results.get(timeout=30)
            assert error is None, error
            streamed[result.get_response().id] = _grpc_version(result)
        client.async_stream_infer(MODEL, _grpc_input(), request_id="named", model_version="3")
        result, error = results.get(timeout=30)
        assert error is None and _grpc_version(result) == 3  # a version named: untouched
    finally:
        client.stop_stream()
        client.close()
    assert call("") in (1, 2)
    seen = [*answered.values(), *streamed.values()]
    assert set(seen) <= {1, 2}
    share = seen.count(2) / len(seen)
    assert 0.07 <= share <= 0.33, share  # 20% +- 13 points (4 standard deviations)
    client_seen = {**answered, **streamed}
    _shadow_records(stack, client_seen)
    after = {v: _successes(stack.a, v) for v in (1, 2, 3)}
    # Every copy ran on version 3, beside the one request that named it.
    wait_until(
        lambda: _successes(stack.a, 3) - before[3] == len(client_seen) + 1 + 1,
        10,
        "every shadow copy counted",
    )
    assert after[1] - before[1] + after[2] - before[2] == len(seen) + 1


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"weights": {"1": -10, "2": 20}}, "the weight of version 1 must be a number >= 0"),
        ({"weights": {"1": "ten"}}, "the weight of version 1 must be a number, not 'ten'"),
        ({"weights": {"1": True}}, "must be a number, not True"),
        ({"weights": {"1": 0}}, "at least one weight must be above 0"),
        ({"weights": {"one": 1}}, "'one' is not a version"),
        ({"weights": {"4": 1}}, "version 4 is not one it serves (its versions: [1, 2, 3])"),
        ({"weights": {"1": 1}, "shadow": {"version": 9, "share": 1}}, "version 9 is not one"),
        ({"shadow": {"version": 3, "share": 2}}, "the shadow's 'share' must be a number from 0"),
        ({"weights": {"1": 1}, "mirror": {}}, "unknown field 'mirror'"),
        ([80, 20], "the body must be a JSON object"),
    ],
)
def test_a_wrong_split_is_a_400_and_changes_nothing(stack: Stack, body: object, words: str) -> None:
    good = {"weights": {"2": 1}}
    assert _set(stack.a, good).status_code == 200
    r = _set(stack.a, body)
    assert r.status_code == 400 and r.headers["Content-Type"] == "application/json"
    assert words in r.json()["error"], r.json()
    assert requests.get(_traffic_url(stack.a, MODEL), timeout=10).json() == good
    assert _infer(stack.a) == 2


def test_what_the_api_refuses_besides(stack: Stack) -> None:
    url = stack.a
    # Not JSON, or no body.
    for data in (b"{weights", b""):
        r = requests.post(_traffic_url(url, MODEL), data=data, timeout=10)
        assert r.status_code == 400 and "error" in r.json(), r.text
    # A version that no worker serves is not ready.
    r = _set(url, {"weights": {"1": 1}}, model="idle")
    assert r.status_code == 400
    assert r.json()["error"] == ("invalid traffic split for model 'idle': version 1 is not ready")
    # An unknown model, whatever the method (Triton's 400 for a model it does not know).
    for method in ("get", "post", "delete"):
        r = requests.request(
            method, _traffic_url(url, "nope"), data=json.dumps({"weights": {"1": 1}}), timeout=10
        )
        assert r.status_code == 400 and "unknown model" in r.json()["error"], (method, r.text)
    assert requests.put(_traffic_url(url, MODEL), timeout=10).status_code == 405


def test_clearing_sends_requests_to_the_latest_again(stack: Stack) -> None:
    assert _set(stack.a, {"weights": {"1": 1}}).status_code == 200
    time.sleep(SETTLE_S)
    assert _infer(stack.a) == _infer(stack.b) == 1
    r = requests.delete(_traffic_url(stack.a, MODEL), timeout=10)
    assert r.status_code == 200 and r.json() == {"weights": {}}
    assert _infer(stack.a) == 3  # at once where it was cleared
    wait_until(lambda: _infer(stack.b) == 3, 10, "the other gateway to clear it too")
    # An empty split clears it too, through the restricted gateway with its header.
    assert _set(stack.a, {"weights": {"2": 1}}).status_code == 200
    r = _set(stack.b, {"weights": {}}, headers=HEADER)
    assert r.status_code == 200 and r.json() == {"weights": {}}
    assert requests.get(_traffic_url(stack.a, MODEL), timeout=10).json() == {"weights": {}}
    wait_until(lambda: _infer(stack.a) == 3, 10, "the split cleared through B to hold on A")
