"""The gRPC frontend through the real path: ``conch grpc`` over a real worker and Redis,
driven by stock ``tritonclient.grpc`` (sync, async_infer and streams)."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import grpc
import ml_dtypes
import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from conch.wire import statistics

from harness import (
    Service,
    conch,
    fresh_db,
    start_grpc,
    start_worker,
    wait_grpc_model_ready,
    wait_until,
    waiting,
)
from integration.grpc.certificates import Pki, make_pki
from models import (
    IDENTITY_TYPES,
    add_model,
    cancel_watcher_model,
    ensemble,
    ensemble_step,
    identity_array,
    identity_model,
    python_model,
    slow_model,
    watched,
    with_config,
)

ECHO = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            if "fail" in json.loads(r.parameters()):
                raise RuntimeError("the echo was asked to fail")
            # BF16 has no numpy type: through DLPack, as Triton's own bf16 example does.
            x = pb_utils.get_input_tensor_by_name(r, "IN").to_dlpack()
            params = np.array([r.parameters().encode()], dtype=object)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor.from_dlpack("OUT", x), pb_utils.Tensor("PARAMS", params)]))
        return out
"""
# Y = X + 1 after sleeping NAP_S: its time per request is a floor, however busy the host.
NAP_S = 0.3
NAP = f"""
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({NAP_S})
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]) for r in requests]
"""
SERVED = (
    "identity",
    "add",
    "echo",
    "step",
    "step_bounded",
    "slow",
    "nap",
    "watcher",
)  # by the worker
MODELS = (*SERVED, "twice")


def _repo(root: Path) -> Path:
    identity_model(root / "identity")
    add_model(root / "add")
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(ECHO)
    (root / "echo" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_BF16 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_BF16 dims: [ -1 ] },\n'
        '         { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
    )
    python_model(
        root / "nap",
        'backend: "python"\nmax_batch_size: 1\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
        NAP,
    )
    slow_model(root / "step", seconds=0.3, max_batch_size=1, delay_us=1)
    with_config(root / "step", root / "step_bounded", "default_queue_policy { max_queue_size: 1 }")
    slow_model(root / "slow", seconds=1.0)
    cancel_watcher_model(root / "watcher", root.parent / "marks")
    ensemble(  # step, then step again: 0.6 s, queued twice
        root,
        "twice",
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        [
            ensemble_step("step", {"X": "X"}, {"Y": "once"}),
            ensemble_step("step", {"X": "once"}, {"Y": "Y"}),
        ],
        max_batch_size=1,
    )
    return root


@pytest.fixture(scope="module", params=["h2", "grpcio"])
def stack(
    tmp_path_factory, redis_url: str, log_dir: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[str, Service, str]]:
    """(the gRPC server's URL, its process, the Redis URL of its queues), on each transport
    (``--grpc-transport``): h2, the default, and grpcio, which conch still ships."""
    repo = _repo(tmp_path_factory.mktemp("grpc") / "models")
    db = fresh_db(redis_url, 11)
    worker = start_worker(repo, db, log_dir, "--models", ",".join(SERVED))
    server, url = start_grpc(repo, db, log_dir, "--grpc-transport", request.param)
    try:
        for m in MODELS:
            wait_grpc_model_ready(url, m, 120, worker, server)
        yield url, server, db
    finally:
        server.stop()
        worker.stop()


@pytest.fixture()
def client(stack) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(stack[0])
    yield c
    c.close()


def _stub(url: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(url))


def _code(exc: InferenceServerException) -> str:
    return str(exc.status())


def _add_inputs(a: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = []
    for name in ("A", "B"):
        inp = grpcclient.InferInput(name, list(a.shape), "FP32")
        inp.set_data_from_numpy(a)
        inputs.append(inp)
    return inputs


# -- health, metadata, config, statistics, repository ------------------------------------


def test_health_and_server_metadata(client) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add")
    # As Triton answers: an unknown model or version is not ready, not an error.
    assert not client.is_model_ready("nope")
    assert not client.is_model_ready("add", model_version="9")
    meta = client.get_server_metadata()
    assert meta.name == "conch" and "classification" in meta.extensions


def test_model_metadata_and_config(client) -> None:
    meta = client.get_model_metadata("add")
    assert meta.name == "add" and list(meta.versions) == ["1"]
    assert [(i.name, i.datatype, list(i.shape)) for i in meta.inputs] == [
        ("A", "FP32", [-1, 4]),
        ("B", "FP32", [-1, 4]),
    ]
    config = client.get_model_config("add").config
    assert config.name == "add" and config.max_batch_size == 8
    assert [i.name for i in config.input] == ["A", "B"]
    as_json = client.get_model_config("add", as_json=True)
    assert as_json["config"]["max_batch_size"] == 8


def test_statistics_count_grpc_calls(client) -> None:
    before = client.get_inference_statistics("add").model_stats[0].inference_stats.success.count
    client.infer("add", _add_inputs(np.ones((1, 4), np.float32)))
    after = client.get_inference_statistics("add").model_stats[0]
    assert after.name == "add" and after.version == "1"
    assert after.inference_stats.success.count == before + 1
    every = client.get_inference_statistics()
    assert {s.name for s in every.model_stats} >= set(MODELS)


def test_repository_index(client) -> None:
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert set(MODELS) <= set(index)
    assert index["add"].state == "READY" and index["add"].version == "1"


def test_load_and_unload_need_explicit_mode(client) -> None:
    """This server is in mode none, where Triton refuses both; the answer's code is the
    data plane's error mapped once."""
    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as err:
            call("add")
        assert _code(err.value) == "StatusCode.INVALID_ARGUMENT"
        assert "explicit" in err.value.message()


def test_explicit_load_and_unload(stack, tmp_path_factory, redis_url: str, log_dir: Path) -> None:
    """In explicit mode: RepositoryModelLoad, with a config override too, and
    RepositoryModelUnload; a call to a model not loaded is refused as Triton refuses it."""
    repo = tmp_path_factory.mktemp("grpc-explicit") / "models"
    add_model(repo / "add")
    db = fresh_db(redis_url, 12)
    flags = ("--model-control-mode", "explicit")
    worker = start_worker(repo, db, log_dir, *flags)
    server, url = start_grpc(repo, db, log_dir, *flags)
    client = grpcclient.InferenceServerClient(url)
    a = np.ones((1, 4), np.float32)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer("add", _add_inputs(a))
        assert _code(err.value) == "StatusCode.INVALID_ARGUMENT"
        assert "'add' has no available versions" in err.value.message()
        client.load_model("add")  # returns once a worker has it loaded
        assert client.is_model_ready("add")
        np.testing.assert_array_equal(client.infer("add", _add_inputs(a)).as_numpy("OUT"), a + a)
        config = client.get_model_config("add", as_json=True)["config"]
        assert config["max_batch_size"] == 8
        client.load_model("add", config=json.dumps({**config, "max_batch_size": 2}))
        assert client.get_model_config("add").config.max_batch_size == 2
        with pytest.raises(InferenceServerException) as err:
            client.infer("add", _add_inputs(np.ones((3, 4), np.float32)))
        assert _code(err.value) == "StatusCode.INVALID_ARGUMENT"  # 3 rows past the new limit
        client.unload_model("add")
        assert not client.is_model_ready("add")
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["add"].state == "UNAVAILABLE"
    finally:
        client.close()
        server.stop()
        worker.stop()


def test_repository_name_is_refused(stack) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _stub(stack[0]).RepositoryIndex(pb.RepositoryIndexRequest(repository_name="other"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'repository_name' specification is not supported" in err.value.details()


# -- inference: every datatype, both data forms, parameters, outputs ------------------------


def test_every_datatype_round_trips_raw(client) -> None:
    arrays = {name: identity_array(name, (2, 5), seed=len(name)) for name in IDENTITY_TYPES}
    inputs = []
    for name, arr in arrays.items():
        inp = grpcclient.InferInput(f"IN_{name}", list(arr.shape), np_to_triton_dtype(arr.dtype))
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    outputs = [grpcclient.InferRequestedOutput(f"OUT_{n}") for n in arrays]
    result = client.infer("identity", inputs, outputs=outputs, request_id="r-1")
    assert result.get_response().id == "r-1"
    assert [o.name for o in result.get_response().outputs] == [f"OUT_{n}" for n in arrays]
    for name, arr in arrays.items():
        got = result.as_numpy(f"OUT_{name}")
        assert got.shape == arr.shape, name
        if name == "BYTES":
            assert got.tolist() == arr.tolist()
        else:
            assert got.dtype == arr.dtype, name
            np.testing.assert_array_equal(got, arr)


_TYPED = {  # datatype -> the contents field and values a client may send instead of raw
    "BOOL": ("bool_contents", [True, False]),
    "INT8": ("int_contents", [-128, 127]),
    "INT16": ("int_contents", [-3, 300]),
    "INT32": ("int_contents", [-(2**31), 2**31 - 1]),
    "INT64": ("int64_contents", [-(2**63), 2**63 - 1]),
    "UINT8": ("uint_contents", [0, 255]),
    "UINT16": ("uint_contents", [1, 65535]),
    "UINT32": ("uint_contents", [0, 2**32 - 1]),
    "UINT64": ("uint64_contents", [0, 2**64 - 1]),
    "FP32": ("fp32_contents", [1.5, -2.25]),
    "FP64": ("fp64_contents", [1e300, -0.5]),
    "BYTES": ("bytes_contents", [b"a\x00b", b""]),
}


@pytest.mark.parametrize("datatype", sorted(_TYPED))
def test_typed_contents_round_trip(stack, datatype: str) -> None:
    field, values = _TYPED[datatype]
    request = pb.ModelInferRequest(model_name="identity", id="typed")
    tensor = request.inputs.add(name=f"IN_{datatype}", datatype=datatype, shape=[1, 2])
    getattr(tensor.contents, field).extend(values)
    for other in IDENTITY_TYPES:
        if other != datatype:  # the other inputs, empty: contents with no elements
            request.inputs.add(name=f"IN_{other}", datatype=other, shape=[1, 0])
            request.inputs[-1].contents.SetInParent()
    request.outputs.add(name=f"OUT_{datatype}")
    response = _stub(stack[0]).ModelInfer(request)
    result = grpcclient.InferResult(response)
    got = result.as_numpy(f"OUT_{datatype}")
    assert got.ravel().tolist() == values


def test_bf16_and_custom_parameters_reach_a_python_model(client) -> None:
    x = np.array([1.0, -2.5, 3.0e5], dtype=ml_dtypes.bfloat16)
    inp = grpcclient.InferInput("IN", [3], "BF16")
    inp.set_data_from_numpy(x)
    result = client.infer(
        "echo",
        [inp],
        parameters={"flavour": "mint", "n": 7, "on": True, "ratio": 0.5},
        priority=0,
        timeout=5_000_000,
    )
    response = result.get_response()
    assert response.outputs[0].datatype == "BF16"
    np.testing.assert_array_equal(result.as_numpy("OUT"), x)
    params = json.loads(result.as_numpy("PARAMS")[0])
    assert params == {"flavour": "mint", "n": 7, "on": True, "ratio": 0.5}


def test_classification(client) -> None:
    a = np.array([[1.0, 4.0, 2.0, 3.0]], np.float32)
    out = grpcclient.InferRequestedOutput("OUT", class_count=2)
    result = client.infer("add", _add_inputs(a), outputs=[out])
    assert result.as_numpy("OUT").tolist() == [[b"8.000000:1", b"6.000000:3"]]


def test_async_infer(client) -> None:
    done: queue.Queue = queue.Queue()
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    client.async_infer("add", _add_inputs(a), lambda result, error: done.put((result, error)))
    result, error = done.get(timeout=60)
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("OUT"), a + a)


def test_the_asyncio_client(stack) -> None:
    """tritonclient.grpc.aio (the client of asyncio code): unary calls, an error's code,
    and a stream whose answers carry their ids, ended when its requests are."""
    a = np.ones((1, 4), np.float32)

    async def calls() -> None:
        client = aioclient.InferenceServerClient(stack[0])
        try:
            assert await client.is_server_ready() and await client.is_model_ready("add")
            assert (await client.get_model_metadata("add")).name == "add"
            result = await client.infer("add", _add_inputs(a), request_id="aio")
            assert result.get_response().id == "aio"
            np.testing.assert_array_equal(result.as_numpy("OUT"), a + a)
            with pytest.raises(InferenceServerException) as err:
                await client.get_model_metadata("add", model_version="9")
            assert _code(err.value) == "StatusCode.NOT_FOUND"

            async def requests() -> AsyncIterator[dict]:
                for k in range(3):
                    yield {"model_name": "add", "inputs": _add_inputs(a * k), "request_id": f"q{k}"}

            got = {}
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                got[result.get_response().id] = result.as_numpy("OUT")
            assert sorted(got) == ["q0", "q1", "q2"]
            np.testing.assert_array_equal(got["q2"], a * 4)
        finally:
            await client.close()

    asyncio.run(calls())


# -- bad requests: INVALID_ARGUMENT with the shared message, never queued ----------------


def _outcomes(client, model: str) -> tuple[int, int]:
    """(successes, failures) the statistics count for ``model``."""
    stats = client.get_inference_statistics(model).model_stats[0].inference_stats
    return stats.success.count, stats.fail.count


def _worker_jobs(stack_client, model: str) -> int:
    return sum(_outcomes(stack_client, model))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda r: r.inputs.add(name="A", datatype="FP32", shape=[1, 4]), "unable to find data"),
        (lambda r: r.inputs.add(name="A", datatype="FP99", shape=[1, 4]), "invalid datatype"),
        (
            lambda r: (
                r.inputs.add(name="A", datatype="FP32", shape=[1, 4]),
                r.raw_input_contents.append(b"\0" * 12),
            ),
            "unexpected size for input 'A'",
        ),
        (
            lambda r: r.inputs.add(
                name="A", datatype="FP32", shape=[1, 4]
            ).contents.int_contents.extend([1, 2, 3, 4]),
            "of type 'INT32', expected datatype 'FP32'",
        ),
    ],
)
def test_malformed_request_is_invalid_argument(stack, client, build, message: str) -> None:
    request = pb.ModelInferRequest(model_name="add")
    build(request)
    before = _worker_jobs(client, "add")
    with pytest.raises(grpc.RpcError) as err:
        _stub(stack[0]).ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert _worker_jobs(client, "add") == before  # it never reached a worker


def test_config_mismatch_is_invalid_argument_and_never_queued(client) -> None:
    inp = grpcclient.InferInput("A", [1, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3), np.float32))
    other = grpcclient.InferInput("B", [1, 3], "FP32")
    other.set_data_from_numpy(np.zeros((1, 3), np.float32))
    before = _worker_jobs(client, "add")
    with pytest.raises(InferenceServerException) as err:
        client.infer("add", [inp, other])
    assert _code(err.value) == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected shape for input 'A' for model 'add'" in err.value.message()
    assert _worker_jobs(client, "add") == before


def test_reserved_parameter_of_wrong_type(stack) -> None:
    request = pb.ModelInferRequest(model_name="add")
    request.parameters["priority"].string_param = "high"
    with pytest.raises(grpc.RpcError) as err:
        _stub(stack[0]).ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid value type for 'priority' parameter" in err.value.details()


def test_triton_parameter_is_refused(stack) -> None:
    request = pb.ModelInferRequest(model_name="add")
    request.parameters["triton_x"].int64_param = 1
    with pytest.raises(grpc.RpcError) as err:
        _stub(stack[0]).ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reserved for Triton usage" in err.value.details()


# -- status codes as Triton maps them ------------------------------------------------------


def test_unknown_model(client) -> None:
    """conch answers an unknown model as Triton's HTTP does (400, INVALID_ARG), so its
    gRPC code is INVALID_ARGUMENT, Triton's mapping of that error."""
    with pytest.raises(InferenceServerException) as err:
        client.infer("nope", _add_inputs(np.ones((1, 4), np.float32)))
    assert _code(err.value) == "StatusCode.INVALID_ARGUMENT"
    assert "Request for unknown model: 'nope' is not found" in err.value.message()


def test_unknown_version_is_not_found(client) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("add", model_version="9")
    assert _code(err.value) == "StatusCode.NOT_FOUND"


def test_queue_full_is_unavailable(client) -> None:
    x = np.zeros((1, 4), np.float32)
    inp = grpcclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    results: queue.Queue = queue.Queue()
    for _ in range(6):
        client.async_infer("step_bounded", [inp], lambda result, error: results.put(error))
    errors = [results.get(timeout=60) for _ in range(6)]
    refused = [e for e in errors if e is not None]
    assert refused, "a queue of one took six requests"
    assert all(_code(e) == "StatusCode.UNAVAILABLE" for e in refused)
    assert "Exceeds maximum queue size" in refused[0].message()


def test_a_model_failure_is_internal(client) -> None:
    """A model that raises fails its request with INTERNAL, as Triton's python backend."""
    inp = grpcclient.InferInput("IN", [1], "BF16")
    inp.set_data_from_numpy(np.ones(1, dtype=ml_dtypes.bfloat16))
    with pytest.raises(InferenceServerException) as err:
        client.infer("echo", [inp], parameters={"fail": True})
    assert _code(err.value) == "StatusCode.INTERNAL"
    assert "the echo was asked to fail" in err.value.message()


def test_deadline_passed_is_unavailable(client) -> None:
    inp = grpcclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("slow", [inp], timeout=100_000)  # 0.1 s for a 1 s model
    assert _code(err.value) == "StatusCode.UNAVAILABLE"
    assert "Request timeout expired" in err.value.message()


def _successes(client, model: str) -> int:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats["inference_stats"]["success"].get("count", 0))


def test_a_grpc_deadline_is_the_requests_deadline_in_the_queue(client) -> None:
    """A call whose deadline passes while it waits behind another is never run."""
    x = np.zeros((1, 4), np.float32)
    inp = grpcclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    before = _successes(client, "step")
    ahead = []
    client.async_infer("step", [inp], callback=lambda result, error: ahead.append(error))
    time.sleep(0.05)  # the first is taken; the next waits 0.3 s behind it
    with pytest.raises(InferenceServerException) as err:
        client.infer("step", [inp], client_timeout=0.1)
    # The client's own timer, or the server's answer at the same deadline, whichever
    # comes first.
    assert _code(err.value) in ("StatusCode.DEADLINE_EXCEEDED", "StatusCode.UNAVAILABLE")
    wait_until(lambda: bool(ahead), 10, "the first call's answer")
    assert ahead == [None], [str(e) for e in ahead]
    time.sleep(0.8)  # the worker has long since popped the late one
    assert _successes(client, "step") == before + 1


def test_a_cancelled_call_never_runs_its_queued_request(client) -> None:
    x = np.zeros((1, 4), np.float32)
    inp = grpcclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    before = _successes(client, "step")
    answers: dict[str, object] = {}
    client.async_infer(
        "step", [inp], callback=lambda result, error: answers.setdefault("ahead", error)
    )
    time.sleep(0.05)  # the first is taken; the next waits 0.3 s behind it
    late = client.async_infer(
        "step", [inp], callback=lambda result, error: answers.setdefault("late", error)
    )
    time.sleep(0.05)
    late.cancel()
    wait_until(
        lambda: "ahead" in answers and "late" in answers, 10, f"both calls to end: {answers}"
    )
    assert answers["ahead"] is None
    assert "CANCELLED" in str(answers["late"])
    time.sleep(0.8)  # a worker would have run it by now, had it stayed queued
    assert _successes(client, "step") == before + 1


def _watched(client, request_id: str) -> tuple[bool, float]:
    marks = client.get_model_config("watcher").config.parameters["marks"].string_value
    return watched(Path(marks), request_id)


def test_a_call_cancelled_while_it_runs_is_cancelled_for_its_model(client) -> None:
    """Triton's request.is_cancelled() (L0_backend_python/lifecycle's test_execute_cancel):
    a unary call whose client cancels it while a Python model runs it turns true for the
    model, which can stop early; a call that stays is never seen as cancelled."""
    x = np.zeros(4, np.float32)
    inp = grpcclient.InferInput("X", [4], "FP32")
    inp.set_data_from_numpy(x)
    ids = {"gone": uuid.uuid4().hex, "stays": uuid.uuid4().hex}
    answers: dict[str, object] = {}
    gone = client.async_infer(
        "watcher",
        [inp],
        callback=lambda result, error: answers.setdefault("gone", error),
        request_id=ids["gone"],
    )
    client.async_infer(
        "watcher",
        [inp],
        callback=lambda result, error: answers.setdefault("stays", error),
        request_id=ids["stays"],
    )
    time.sleep(0.5)  # both are running, on the model's two instances
    gone.cancel()
    cancelled, took = _watched(client, ids["gone"])
    assert cancelled and took < 1.5  # noticed within the check's half second
    assert _watched(client, ids["stays"]) == (False, pytest.approx(2, abs=0.3))
    wait_until(lambda: "stays" in answers, 10, "the call that stayed to be answered")
    assert answers["stays"] is None and "CANCELLED" in str(answers["gone"])


def _step_input() -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    return [inp]


def _cancelled(db: str, model: str) -> int:
    """Requests of ``model`` counted as failed for Triton's reason CANCELED."""
    counters = statistics.read(redis.Redis.from_url(db), model)
    field = statistics.failure_field(statistics.CANCELED)
    return sum(c.get(field, 0) for c in counters.values())


def test_a_cancelled_call_stops_an_ensemble_between_steps(client) -> None:
    """As Triton checks between an ensemble's steps: a call cancelled while its first
    step is under way never sends the second."""
    before = _outcomes(client, "step")[0]
    errors: queue.Queue = queue.Queue()
    call = client.async_infer(
        "twice", _step_input(), callback=lambda result, error: errors.put(error)
    )
    time.sleep(0.1)  # the first step runs (0.3 s); the second would be queued after it
    call.cancel()
    assert "CANCELLED" in str(errors.get(timeout=10))
    time.sleep(1.0)  # both steps would have run by now
    assert _outcomes(client, "step")[0] - before <= 1


def test_unimplemented_rpcs_say_so(client) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.get_trace_settings()
    assert _code(err.value) == "StatusCode.UNIMPLEMENTED"
    assert "conch does not support trace settings" in err.value.message()
    # Shared memory is off unless --allow-client-shm (tests/integration/http/test_shared_memory.py).
    for call in (client.get_system_shared_memory_status, client.get_cuda_shared_memory_status):
        with pytest.raises(InferenceServerException) as err:
            call()
        assert _code(err.value) == "StatusCode.UNAVAILABLE"
        assert "--allow-client-shm=true" in err.value.message()


# -- streaming -----------------------------------------------------------------------------


def test_stream_answers_each_request_and_survives_an_error(client) -> None:
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        a = np.ones((1, 4), np.float32)
        client.async_stream_infer("add", _add_inputs(a), request_id="one")
        bad = grpcclient.InferInput("A", [1, 3], "FP32")
        bad.set_data_from_numpy(np.ones((1, 3), np.float32))
        client.async_stream_infer("add", [bad], request_id="two")
        client.async_stream_infer("add", _add_inputs(a * 2), request_id="three")
        got = [answers.get(timeout=60) for _ in range(3)]
    finally:
        client.stop_stream()
    ok = {r.get_response().id: r for r, e in got if e is None}
    errors = [e for _, e in got if e is not None]
    assert set(ok) == {"one", "three"}
    np.testing.assert_array_equal(ok["three"].as_numpy("OUT"), a * 4)
    assert len(errors) == 1 and "expected 2 inputs" in errors[0].message()


def test_stream_error_carries_the_request_id(stack) -> None:
    def requests() -> Iterator[pb.ModelInferRequest]:
        yield pb.ModelInferRequest(model_name="nope", id="lost")
        yield pb.ModelInferRequest(model_name="add", id="also-bad")

    answers = list(_stub(stack[0]).ModelStreamInfer(requests(), timeout=60))
    assert sorted(a.infer_response.id for a in answers) == ["also-bad", "lost"]
    by_id = {a.infer_response.id: a.error_message for a in answers}
    assert "unknown model: 'nope'" in by_id["lost"]
    assert "missing required input" in by_id["also-bad"]


def test_a_cancelled_stream_never_runs_its_queued_requests(stack, client) -> None:
    """Five requests on a stream to a model that runs one at a time; the stream is
    cancelled while the first runs: the four queued behind it are withdrawn, counted as
    CANCELED, and never run. The server serves on."""
    db = stack[2]
    success, fail = _outcomes(client, "step")
    cancelled = _cancelled(db, "step")
    client.start_stream(callback=lambda result, error: None)
    for k in range(5):
        client.async_stream_infer("step", _step_input(), request_id=f"s{k}")
    wait_until(lambda: waiting(db, "step") == 4, 10, "four requests behind a running one")
    client.stop_stream(cancel_requests=True)
    wait_until(lambda: _cancelled(db, "step") == cancelled + 4, 10, "four requests withdrawn")
    assert waiting(db, "step") == 0
    time.sleep(1.0)  # the first has finished; the others would be running by now
    assert _outcomes(client, "step") == (success + 1, fail + 4)

    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("add", _add_inputs(np.ones((1, 4), np.float32)), request_id="on")
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None and result.get_response().id == "on"


@pytest.mark.parametrize("ends_at_error", [True, False])
def test_triton_grpc_error_ends_a_stream_at_its_first_error(client, ends_at_error) -> None:
    """Triton's ``triton_grpc_error: true`` stream metadata (L0_backend_python/lifecycle's
    test_triton_grpc_error_*): the first error ends the stream with its gRPC status and
    message, and a request sent after it is never answered. Without it, the error comes
    in band (no status) and the stream goes on."""
    answers: queue.Queue = queue.Queue()
    headers = {"triton_grpc_error": "true"} if ends_at_error else None
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)), headers=headers
    )
    inp = grpcclient.InferInput("IN", [1], "BF16")
    inp.set_data_from_numpy(np.ones(1, dtype=ml_dtypes.bfloat16))
    try:
        client.async_stream_infer("echo", [inp], request_id="first")
        assert answers.get(timeout=30)[1] is None
        client.async_stream_infer("echo", [inp], request_id="fails", parameters={"fail": True})
        _, error = answers.get(timeout=30)
        assert "the echo was asked to fail" in error.message()
        assert _code(error) == ("StatusCode.INTERNAL" if ends_at_error else "None")
        with suppress(InferenceServerException):  # the client may see the stream is over
            client.async_stream_infer("echo", [inp], request_id="after")
        if ends_at_error:
            with pytest.raises(queue.Empty):
                answers.get(timeout=1)
        else:
            result, error = answers.get(timeout=30)
            assert error is None and result.get_response().id == "after"
    finally:
        client.stop_stream()


def test_a_half_closed_stream_answers_every_request(client) -> None:
    """stop_stream() without cancelling closes the sending side only: every request
    sent still runs and is answered."""
    answers: list = []
    client.start_stream(callback=lambda result, error: answers.append((result, error)))
    for k in range(3):
        client.async_stream_infer("step", _step_input(), request_id=f"h{k}")
    client.stop_stream()  # returns once the server has answered all three
    assert [e for _, e in answers if e is not None] == []
    assert sorted(r.get_response().id for r, _ in answers) == ["h0", "h1", "h2"]


def test_a_streams_deadline_is_its_requests_deadline(stack, client) -> None:
    """Five requests on a stream that has 0.45 s, to a model that takes at least NAP_S
    (0.3 s) each, one at a time: the stream ends DEADLINE_EXCEEDED, and what was still
    queued then never runs. The first starts at once and the second, if at all, after
    the first's 0.3 s; the third could start no sooner than 0.6 s, past the deadline,
    however busy the host is (a busy host only makes each request take longer)."""
    success, fail = _outcomes(client, "nap")
    answers: queue.Queue = queue.Queue()
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)), stream_timeout=0.45
    )
    try:
        for k in range(5):
            client.async_stream_infer("nap", _step_input(), request_id=f"d{k}")
        ended = None
        while ended is None:
            _, error = answers.get(timeout=10)
            if error is not None and "DEADLINE_EXCEEDED" in str(error.status()):
                ended = error
    finally:
        client.stop_stream()

    def settled() -> bool:
        now = _outcomes(client, "nap")
        return now[0] + now[1] == success + fail + 5

    wait_until(settled, 10, "every request counted")
    time.sleep(2 * NAP_S)  # one still running when the deadline passed has finished
    ran = _outcomes(client, "nap")[0] - success
    assert 1 <= ran <= 1 + int(0.45 / NAP_S), ran
    assert _outcomes(client, "nap")[1] - fail == 5 - ran


# -- the standard health service ----------------------------------------------------------


def test_health_service_for_server_and_models(stack) -> None:
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(stack[0]))
    serving = health_pb2.HealthCheckResponse.SERVING
    assert stub.Check(health_pb2.HealthCheckRequest()).status == serving
    assert stub.Check(health_pb2.HealthCheckRequest(service="add")).status == serving
    with pytest.raises(grpc.RpcError) as err:
        stub.Check(health_pb2.HealthCheckRequest(service="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


# -- --grpc-restricted-protocol --------------------------------------------------------------


def test_restricted_protocol(stack, tmp_path_factory, redis_url: str, log_dir: Path) -> None:
    repo = _repo(tmp_path_factory.mktemp("grpc-restricted") / "models")
    server, url = start_grpc(
        repo,
        fresh_db(redis_url, 11),
        log_dir,
        env={"CONCH_GRPC_RESTRICTED_PROTOCOL": "inference,model-config:infer-key=s3cret"},
    )
    client = grpcclient.InferenceServerClient(url)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.get_model_config("add")
        assert _code(err.value) == "StatusCode.UNAVAILABLE"
        assert (
            "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
            in err.value.message()
        )
        with pytest.raises(InferenceServerException):
            client.get_model_config("add", headers={"triton-grpc-protocol-infer-key": "wrong"})
        key = {"triton-grpc-protocol-infer-key": "s3cret"}
        assert client.get_model_config("add", headers=key).config.name == "add"
        assert client.get_model_metadata("add").name == "add"  # metadata is not restricted
    finally:
        client.close()
        server.stop()


def test_message_size_limit(stack, tmp_path_factory, redis_url: str, log_dir: Path) -> None:
    repo = _repo(tmp_path_factory.mktemp("grpc-small") / "models")
    server, url = start_grpc(
        repo, fresh_db(redis_url, 11), log_dir, "--http-max-input-size", "4096"
    )
    client = grpcclient.InferenceServerClient(url)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer("add", _add_inputs(np.ones((400, 4), np.float32)))
        assert _code(err.value) == "StatusCode.RESOURCE_EXHAUSTED"
    finally:
        client.close()
        server.stop()


# -- TLS (--grpc-use-ssl, --grpc-use-ssl-mutual) -------------------------------------------


def _tls_flags(pki: Pki, *, mutual: bool) -> list[str]:
    return [
        "--grpc-use-ssl-mutual=true" if mutual else "--grpc-use-ssl=true",
        "--grpc-server-cert",
        str(pki.server_cert),
        "--grpc-server-key",
        str(pki.server_key),
        "--grpc-root-cert",
        str(pki.ca),
    ]


def _refused(url: str, **options: object) -> InferenceServerException:
    client = grpcclient.InferenceServerClient(url, **options)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.is_server_live(client_timeout=5)
        return err.value
    finally:
        client.close()


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_tls(stack, tmp_path_factory, redis_url: str, log_dir: Path, mutual: bool) -> None:
    tmp = tmp_path_factory.mktemp("grpc-tls")
    pki = make_pki(tmp / "pki")
    trusted: dict[str, object] = {"ssl": True, "root_certificates": str(pki.ca)}
    if mutual:
        trusted.update(private_key=str(pki.client_key), certificate_chain=str(pki.client_cert))
    server, url = start_grpc(
        _repo(tmp / "models"),
        fresh_db(redis_url, 11),
        log_dir,
        *_tls_flags(pki, mutual=mutual),
        client_options=trusted,
    )
    client = grpcclient.InferenceServerClient(url, **trusted)
    try:
        # ready once this server has seen the worker's models, over TLS like any call
        wait_until(client.is_server_ready, 60, "TLS server ready", server)
        result = client.infer("add", _add_inputs(np.ones((2, 4), np.float32)))
        np.testing.assert_array_equal(result.as_numpy("OUT"), np.full((2, 4), 2, np.float32))
        assert "UNAVAILABLE" in _code(_refused(url))  # plaintext to a TLS port
        stranger = make_pki(tmp / "other")  # a CA the client does not trust
        assert "UNAVAILABLE" in _code(_refused(url, ssl=True, root_certificates=str(stranger.ca)))
        if mutual:  # no client certificate, or one from another CA
            assert "UNAVAILABLE" in _code(_refused(url, ssl=True, root_certificates=str(pki.ca)))
            assert "UNAVAILABLE" in _code(
                _refused(
                    url,
                    ssl=True,
                    root_certificates=str(pki.ca),
                    private_key=str(stranger.client_key),
                    certificate_chain=str(stranger.client_cert),
                )
            )
    finally:
        client.close()
        server.stop()


def test_tls_without_a_key_file_stops_the_start(tmp_path: Path, redis_url: str) -> None:
    done = subprocess.run(
        conch(
            "grpc",
            "--model-repository",
            str(tmp_path),
            "--redis-url",
            redis_url,
            "--grpc-port",
            "0",
            "--grpc-use-ssl=true",
            "--grpc-server-cert",
            str(tmp_path / "missing.pem"),
            "--grpc-server-key",
            str(tmp_path / "missing.key"),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "--grpc-server-key" in done.stderr and "No such file" in done.stderr


# -- --grpc-infer-response-compression-level -----------------------------------------------


@contextmanager
def _counting_proxy(upstream: str) -> Iterator[tuple[str, list[int]]]:
    """A TCP proxy to ``upstream``: its URL, and the count of bytes the server sent back
    through it (what went on the wire, compressed or not)."""
    host, port = upstream.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    received = [0]
    lock = threading.Lock()

    def pump(src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(65536):
                if count:
                    with lock:
                        received[0] += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        with suppress(OSError):
            while True:
                conn, _ = listener.accept()
                server = socket.create_connection((host, int(port)))
                for args in ((conn, server, False), (server, conn, True)):
                    threading.Thread(target=pump, args=args, daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", received
    finally:
        listener.close()


def _bytes_back(url: str, x: np.ndarray) -> int:
    """Bytes on the wire from the server for one echo of ``x`` (checked to round-trip)."""
    inp = grpcclient.InferInput("IN", list(x.shape), "BF16")
    inp.set_data_from_numpy(x)
    with _counting_proxy(url) as (proxied, received):
        client = grpcclient.InferenceServerClient(proxied)
        try:
            client.is_server_live()
            before = received[0]
            result = client.infer("echo", [inp])
            np.testing.assert_array_equal(result.as_numpy("OUT"), x)
            return received[0] - before
        finally:
            client.close()


def test_infer_response_compression(stack, tmp_path_factory, redis_url: str, log_dir: Path) -> None:
    x = np.zeros(200_000, dtype=ml_dtypes.bfloat16)  # 400 kB that compress to almost nothing
    assert _bytes_back(stack[0], x) > x.nbytes  # the default: none
    server, url = start_grpc(
        _repo(tmp_path_factory.mktemp("grpc-gzip") / "models"),
        fresh_db(redis_url, 11),
        log_dir,
        "--grpc-infer-response-compression-level",
        "high",
    )
    try:
        assert _bytes_back(url, x) < x.nbytes // 20
    finally:
        server.stop()
