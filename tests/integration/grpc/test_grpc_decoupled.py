"""A decoupled model through ``ModelStreamInfer``, driven by stock ``tritonclient.grpc``:
Triton's ``repeat`` example's idea, one request answered by one response per element of
its input, then the final flag alone (empty). ``ModelInfer`` refuses it, in Triton's
words."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from harness import Service, fresh_db, start_grpc, start_worker, wait_grpc_model_ready

REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for index, value in enumerate(values):
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("grpc-decoupled") / "models"
    (repo / "repeat" / "1").mkdir(parents=True)
    (repo / "repeat" / "1" / "model.py").write_text(REPEAT)
    (repo / "repeat" / "config.pbtxt").write_text(CONFIG)
    db = fresh_db(redis_url, 13)
    worker: Service = start_worker(repo, db, log_dir, "--models", "repeat")
    server, url = start_grpc(repo, db, log_dir)
    try:
        wait_grpc_model_ready(url, "repeat", 120, worker, server)
        yield url
    finally:
        server.stop()
        worker.stop()


@pytest.fixture()
def client(url: str) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(url)
    yield c
    c.close()


def _input(values: list[int]) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("IN", [len(values)], "INT32")
    inp.set_data_from_numpy(np.array(values, np.int32))
    return [inp]


def _final(result: grpcclient.InferResult) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def _collect(client, requests: dict[str, list[int]], **kw) -> dict[str, list]:
    """Each request's answers, in the order they came, until every request's final one
    (with ``enable_empty_final_response``) came."""
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    got: dict[str, list] = {rid: [] for rid in requests}
    try:
        for rid, values in requests.items():
            client.async_stream_infer(
                "repeat", _input(values), request_id=rid, enable_empty_final_response=True, **kw
            )
        open_ = set(requests)
        while open_:
            result, error = answers.get(timeout=60)
            assert error is None, error
            rid = result.get_response().id
            got[rid].append(result)
            if _final(result):
                open_.discard(rid)
    finally:
        client.stop_stream()
    return got


def test_one_request_many_responses_then_an_empty_final_one(client) -> None:
    [answers] = _collect(client, {"r": [4, 5, 6]}).values()
    assert [_final(a) for a in answers] == [False, False, False, True]
    assert [int(a.as_numpy("OUT")[0]) for a in answers[:3]] == [4, 5, 6]
    assert [int(a.as_numpy("IDX")[0]) for a in answers[:3]] == [0, 1, 2]
    assert list(answers[3].get_response().outputs) == []


def test_requests_on_one_stream_each_get_their_own_responses_in_order(client) -> None:
    got = _collect(client, {"a": list(range(10)), "b": [7], "c": []})
    assert [int(a.as_numpy("IDX")[0]) for a in got["a"][:-1]] == list(range(10))
    assert [int(a.as_numpy("OUT")[0]) for a in got["b"][:-1]] == [7]
    assert len(got["c"]) == 1 and not got["c"][0].get_response().outputs  # the flag alone


def test_without_the_empty_final_response_only_the_responses_come(client) -> None:
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("repeat", _input([1, 2]), request_id="q")
        got = [answers.get(timeout=60) for _ in range(2)]
    finally:
        client.stop_stream()  # half-closed: returns once the request has ended
    assert [e for _, e in got] == [None, None]
    assert [_final(r) for r, _ in got] == [False, False]
    assert answers.empty()  # the final flag alone is not sent


def test_model_infer_refuses_a_decoupled_model(client) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.infer("repeat", _input([1]))
    assert str(err.value.status()) == "StatusCode.UNIMPLEMENTED"
    assert err.value.message() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )
