"""Empty tensors, a 0 in the shape, on every path (issue 40, point 2), and Triton's
L0_infer_zero cases, through the real path.

One stack serves a repository built here: a worker (batch jobs on, with a real S3 server),
a gateway and a gRPC server, both with shared memory on. Identity models for ONNX,
PyTorch and Python, dynamically batched, and an ensemble of the three answer an empty
input with the same empty output over HTTP (JSON and binary), gRPC (calls and streams),
an async job, a batch job, in a bundle beside non-empty requests, in shared memory, and
in process (``conch.Server``, embedded and connected). Triton's own identity models
(``onnx_zero_*``, ``libtorch_zero_*``, batching and not) answer L0_infer_zero's cases.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import uuid
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
import pytest
import redis
import requests
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import helper

import conch
from conch.wire import broker
from conch.wire.work_owed import work_owed

from harness import (
    Service,
    fresh_db,
    start_gateway,
    start_grpc,
    start_worker,
    wait_model_ready,
    wait_until,
)
from integration.jobs.test_jobs import result, submit, wait_done
from models import IDENTITY_TYPES, ensemble, ensemble_step, python_model

# -- the models ---------------------------------------------------------------------------

_NUMPY = {"FP32": np.float32, "FP16": np.float16, "BOOL": np.bool_, "BYTES": np.object_}


class Pair(NamedTuple):
    """An identity model's input, the output it comes back as, and their datatype."""

    input: str
    output: str
    datatype: str


def _io(io: list[Pair], dims: list[int]) -> str:
    """A config's input and output lines, each tensor of ``dims``."""
    shape = ", ".join(map(str, dims))

    def entry(name: str, datatype: str) -> str:
        kind = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
        return f'{{ name: "{name}" data_type: {kind} dims: [ {shape} ] }}'

    ins = ", ".join(entry(p.input, p.datatype) for p in io)
    outs = ", ".join(entry(p.output, p.datatype) for p in io)
    return f"input [ {ins} ]\noutput [ {outs} ]"


def _config(platform: str, max_batch_size: int, io: list[Pair], dims: list[int], extra: str) -> str:
    return f"{platform}\nmax_batch_size: {max_batch_size}\n{_io(io, dims)}\n{extra}\n"


def onnx_identity(
    path: Path, datatype: str, dims: list[int], count: int, max_batch_size: int, extra: str = ""
) -> None:
    """INPUT<k> -> OUTPUT<k> for k below ``count``, as Triton's gen_qa_identity_models."""
    io = [Pair(f"INPUT{k}", f"OUTPUT{k}", datatype) for k in range(count)]
    axes = (["batch"] if max_batch_size else []) + [f"d{k}" for k in range(len(dims))]
    t = IDENTITY_TYPES[datatype]
    graph = helper.make_graph(
        [helper.make_node("Identity", [p.input], [p.output]) for p in io],
        "identity",
        [helper.make_tensor_value_info(p.input, t, axes) for p in io],
        [helper.make_tensor_value_info(p.output, t, axes) for p in io],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (path / "1").mkdir(parents=True)
    onnx.save(model, str(path / "1" / "model.onnx"))
    platform = 'platform: "onnxruntime_onnx"'
    (path / "config.pbtxt").write_text(_config(platform, max_batch_size, io, dims, extra))


class _One(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Three(torch.nn.Module):
    def forward(
        self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return a, b, c


def torch_identity(
    path: Path, datatype: str, dims: list[int], count: int, max_batch_size: int, extra: str = ""
) -> None:
    """INPUT__<k> -> OUTPUT__<k>, a TorchScript module that returns what it is given."""
    io = [Pair(f"INPUT__{k}", f"OUTPUT__{k}", datatype) for k in range(count)]
    (path / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.script(_One() if count == 1 else _Three())
        torch.jit.save(module, str(path / "1" / "model.pt"))
    platform = 'platform: "pytorch_libtorch"'
    (path / "config.pbtxt").write_text(_config(platform, max_batch_size, io, dims, extra))


PYTHON_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor(out, pb_utils.get_input_tensor_by_name(r, name).as_numpy())
                for name, out in (("INPUT0", "OUTPUT0"), ("INPUT1", "OUTPUT1"))
            ])
            for r in requests
        ]
"""

BATCHING = "dynamic_batching { max_queue_delay_microseconds: 20000 }"


@dataclass(frozen=True)
class Served:
    """A model of the path tests: its inputs' datatypes, and the output each comes back as."""

    datatypes: dict[str, str]
    outputs: dict[str, str]


PATH_MODELS = {
    "onnx_empty": Served({"INPUT0": "FP32"}, {"INPUT0": "OUTPUT0"}),
    "torch_empty": Served({"INPUT__0": "FP32"}, {"INPUT__0": "OUTPUT__0"}),
    "python_empty": Served(
        {"INPUT0": "FP32", "INPUT1": "BYTES"}, {"INPUT0": "OUTPUT0", "INPUT1": "OUTPUT1"}
    ),
    "ensemble_empty": Served({"X": "FP32", "S": "BYTES"}, {"X": "Y", "S": "T"}),
}
BATCHED = ("onnx_empty", "torch_empty", "python_empty")  # the dynamically batched ones


def path_models(root: Path) -> None:
    onnx_identity(root / "onnx_empty", "FP32", [-1], 1, 8, BATCHING)
    torch_identity(root / "torch_empty", "FP32", [-1], 1, 8, BATCHING)
    io = [Pair("INPUT0", "OUTPUT0", "FP32"), Pair("INPUT1", "OUTPUT1", "BYTES")]
    config = _config('backend: "python"', 8, io, [-1], BATCHING)
    python_model(root / "python_empty", config, PYTHON_IDENTITY)
    io_text = _io([Pair("X", "Y", "FP32"), Pair("S", "T", "BYTES")], [-1])
    ensemble(
        root,
        "ensemble_empty",
        io_text,
        [
            ensemble_step("onnx_empty", {"INPUT0": "X"}, {"OUTPUT0": "a"}),
            ensemble_step("torch_empty", {"INPUT__0": "a"}, {"OUTPUT__0": "b"}),
            ensemble_step(
                "python_empty", {"INPUT0": "b", "INPUT1": "S"}, {"OUTPUT0": "Y", "OUTPUT1": "T"}
            ),
        ],
    )


class ZeroType(NamedTuple):
    """One datatype of Triton's L0_infer_zero models: its dims, and the backends that
    have models of it."""

    datatype: str
    dims: list[int]
    backends: tuple[str, ...]


# Triton's L0_infer_zero models (gen_qa_identity_models.py), by the name's datatype
# suffix; PyTorch has no FP16 or BYTES ones.
ZERO_TYPES = {
    "float32": ZeroType("FP32", [-1], ("onnx", "libtorch")),
    "float16": ZeroType("FP16", [-1, -1], ("onnx",)),
    "bool": ZeroType("BOOL", [-1], ("onnx", "libtorch")),
    "object": ZeroType("BYTES", [-1], ("onnx",)),
}


def zero_models(root: Path) -> None:
    """``<backend>_zero_<n>_<suffix>`` (batching) and ``<backend>_nobatch_zero_...``."""
    for suffix, kind in ZERO_TYPES.items():
        for backend in kind.backends:
            build = onnx_identity if backend == "onnx" else torch_identity
            for count in (1, 3):
                if count == 3 and kind.datatype == "BOOL":
                    continue
                # The three-input BYTES model has two variable dims, as Triton's.
                dims = [-1, -1] if (count == 3 and kind.datatype == "BYTES") else kind.dims
                for batch, infix in ((8, "zero"), (0, "nobatch_zero")):
                    name = f"{backend}_{infix}_{count}_{suffix}"
                    build(root / name, kind.datatype, dims, count, batch)


# -- the stack ----------------------------------------------------------------------------


@dataclass
class Stack:
    http: str
    grpc: str
    db: str
    repo: Path
    worker: Service


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path, s3_endpoint: str
) -> Iterator[Stack]:
    repo = tmp_path_factory.mktemp("empty") / "models"
    repo.mkdir()
    path_models(repo)
    zero_models(repo)
    db = fresh_db(redis_url, 15)
    worker = start_worker(repo, db, log_dir, env={"AWS_ENDPOINT_URL": s3_endpoint})
    gateway, url = start_gateway(repo, db, log_dir, "--allow-client-shm")
    server, grpc_url = start_grpc(repo, db, log_dir, "--allow-client-shm=true")
    try:
        for model in sorted(os.listdir(repo)):
            wait_model_ready(url, model, 120, worker, gateway)
        yield Stack(url, grpc_url, db, repo, worker)
    finally:
        server.stop()
        gateway.stop()
        worker.stop()


# -- tensors ------------------------------------------------------------------------------


def tensor(datatype: str, shape: list[int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if datatype == "BYTES":
        words = [f"w{k}".encode() for k in rng.integers(0, 100, size=shape).ravel()]
        return np.array(words, dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.standard_normal(shape).astype(_NUMPY[datatype])


def given(model: str, shape: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of ``shape`` for a path model."""
    return {n: tensor(t, shape, seed) for n, t in PATH_MODELS[model].datatypes.items()}


def same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.dtype == np.object_:
        assert got.dtype == np.object_, what
        # (tritonclient gives str elements for BYTES read from JSON, bytes otherwise)
        text = [x.encode() if isinstance(x, str) else bytes(x) for x in got.ravel()]
        assert text == list(want.ravel()), what
    else:
        assert got.dtype == want.dtype, (what, got.dtype)
        np.testing.assert_array_equal(got, want, err_msg=what)


def answered(model: str, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
    """Each output of ``model`` is its input, shape and all."""
    for name, out in PATH_MODELS[model].outputs.items():
        same(outputs[out], inputs[name], f"{model} {out}")


def http_inputs(inputs: dict[str, np.ndarray], binary: bool) -> list[httpclient.InferInput]:
    out = []
    for name, arr in inputs.items():
        t = httpclient.InferInput(name, list(arr.shape), _datatype(arr))
        t.set_data_from_numpy(arr, binary_data=binary)
        out.append(t)
    return out


def grpc_inputs(inputs: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    out = []
    for name, arr in inputs.items():
        t = grpcclient.InferInput(name, list(arr.shape), _datatype(arr))
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def _datatype(arr: np.ndarray) -> str:
    return next(t for t, d in _NUMPY.items() if np.dtype(d) == arr.dtype)


def http_call(
    url: str, model: str, inputs: dict[str, np.ndarray], outputs: Iterable[str], binary: bool
) -> dict[str, np.ndarray]:
    """``model``'s ``outputs`` for ``inputs``, over HTTP (``binary``, else JSON both ways)."""
    client = httpclient.InferenceServerClient(url)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in outputs]
    got = client.infer(model, http_inputs(inputs, binary), outputs=wanted)
    return {o.name(): got.as_numpy(o.name()) for o in wanted}


def grpc_call(
    url: str, model: str, inputs: dict[str, np.ndarray], outputs: Iterable[str], stream: bool
) -> dict[str, np.ndarray]:
    """``model``'s ``outputs`` for ``inputs``, over gRPC (a call, or a stream's request)."""
    client = grpcclient.InferenceServerClient(url)
    wanted = [grpcclient.InferRequestedOutput(n) for n in outputs]
    try:
        if not stream:
            got = client.infer(model, grpc_inputs(inputs), outputs=wanted)
        else:
            results: queue.Queue = queue.Queue()
            client.start_stream(callback=lambda result, error: results.put((result, error)))
            try:
                client.async_stream_infer(model, grpc_inputs(inputs), outputs=wanted)
                got, error = results.get(timeout=30)
            finally:
                client.stop_stream()
            assert error is None, error
    finally:
        client.close()
    return {o.name(): got.as_numpy(o.name()) for o in wanted}


def http_infer(url: str, model: str, inputs: dict[str, np.ndarray], binary: bool) -> dict:
    return http_call(url, model, inputs, PATH_MODELS[model].outputs.values(), binary)


# -- every path, every backend ------------------------------------------------------------

EMPTY = [1, 0]  # a batch of one, of no elements


@pytest.mark.parametrize("model", PATH_MODELS)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http(stack: Stack, model: str, binary: bool) -> None:
    inputs = given(model, EMPTY)
    answered(model, inputs, http_infer(stack.http, model, inputs, binary))
    # And one with data after it: the empty one changed nothing.
    inputs = given(model, [2, 3], seed=1)
    answered(model, inputs, http_infer(stack.http, model, inputs, binary))


@pytest.mark.parametrize("model", ["onnx_empty", "torch_empty"])
def test_a_raw_binary_body_of_no_bytes(stack: Stack, model: str) -> None:
    """``Inference-Header-Content-Length: 0`` and no body: the one input, of no elements
    (its variable dim deduced as 0), and its output as empty."""
    r = requests.post(
        f"http://{stack.http}/v2/models/{model}/infer",
        data=b"",
        headers={"Inference-Header-Content-Length": "0"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    size = int(r.headers["Inference-Header-Content-Length"])
    (output,) = json.loads(r.content[:size])["outputs"]
    assert output["shape"] == [1, 0] and output["parameters"] == {"binary_data_size": 0}
    assert r.content[size:] == b""


@pytest.mark.parametrize("model", PATH_MODELS)
@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_grpc(stack: Stack, model: str, stream: bool) -> None:
    inputs = given(model, EMPTY)
    outputs = PATH_MODELS[model].outputs.values()
    answered(model, inputs, grpc_call(stack.grpc, model, inputs, outputs, stream))


@pytest.mark.parametrize("model", PATH_MODELS)
def test_async_job(stack: Stack, model: str) -> None:
    inputs = given(model, EMPTY)
    names = PATH_MODELS[model].outputs.values()
    outs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in names]
    job = submit(stack.http, model, http_inputs(inputs, True), outs)
    status = wait_done(stack.http, job, timeout=60)
    assert status["status"] == "SUCCESS", status
    got = result(stack.http, job)
    answered(model, inputs, {n: got.as_numpy(n) for n in names})


def _line(model: str, key: str, inputs: dict[str, np.ndarray]) -> str:
    def data(arr: np.ndarray) -> list:
        return (
            [x.decode() for x in arr.ravel()] if arr.dtype == np.object_ else arr.ravel().tolist()
        )

    entries = [
        {"name": n, "datatype": _datatype(a), "shape": list(a.shape), "data": data(a)}
        for n, a in inputs.items()
    ]
    return json.dumps({"id": key, "inputs": entries})


def _from_json(doc: dict) -> np.ndarray:
    dtype = _NUMPY[doc["datatype"]]
    values = [v.encode() for v in doc["data"]] if doc["datatype"] == "BYTES" else doc["data"]
    return np.array(values, dtype=dtype).reshape(doc["shape"])


@pytest.mark.parametrize("model", PATH_MODELS)
def test_batch_job(stack: Stack, model: str, s3) -> None:
    """Empty lines among lines with data: every line answered, in order (packed lines of
    one shape run as one request, so empty ones meet each other there)."""
    bucket = f"empty-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    lines = {f"r{k}": given(model, [1, 0] if k % 3 else [1, 2], seed=k) for k in range(9)}
    body = "\n".join(_line(model, k, v) for k, v in lines.items()) + "\n"
    s3.put_object(Bucket=bucket, Key="in.jsonl", Body=body.encode())
    spec = {"input": f"s3://{bucket}/in.jsonl", "output": f"s3://{bucket}/out.jsonl"}
    r = requests.post(f"http://{stack.http}/v2/models/{model}/batch", json=spec, timeout=30)
    assert r.status_code == 202, r.text
    status = wait_done(stack.http, r.json()["id"], timeout=90)
    assert status["status"] == "SUCCESS" and status["progress"]["failed"] == 0, status
    text = s3.get_object(Bucket=bucket, Key="out.jsonl")["Body"].read().decode()
    out = [json.loads(line) for line in text.splitlines()]
    assert [o["id"] for o in out] == list(lines)
    for o in out:
        answered(model, lines[o["id"]], {d["name"]: _from_json(d) for d in o["outputs"]})


# Requests sent at once: empty ones beside ones with data (a batch the worker groups by
# shape), and empty ones alone (a batch it stacks from their bytes, and splits back).
BUNDLES = {
    "beside-data": [[1, 0], [1, 3], [2, 0], [1, 3], [1, 0], [2, 3]],
    "empty-only": [[1, 0], [2, 0], [1, 0], [3, 0]],
}


@pytest.mark.parametrize("model", BATCHED)
@pytest.mark.parametrize("bundle", BUNDLES)
def test_a_bundle(stack: Stack, model: str, bundle: str) -> None:
    """Requests sent at once meet in the gateway's publish and go to the queue as
    bundles (the worker held still meanwhile); the worker then runs them together and
    each gets its own answer back."""
    shapes = BUNDLES[bundle]
    sent = [given(model, s, seed=k) for k, s in enumerate(shapes)]
    client = redis.Redis.from_url(stack.db)
    before = _executions(stack.http, model)
    stack.worker.send(signal.SIGSTOP)
    try:
        client.client_pause(1000)  # the requests come while the first publish waits
        with ThreadPoolExecutor(len(sent)) as pool:
            calls = [pool.submit(http_infer, stack.http, model, x, True) for x in sent]

            def queued() -> bool:
                return work_owed(client, [model])[model].waiting == len(sent)

            wait_until(queued, 30, f"{len(sent)} requests queued for {model}")
            assert client.hlen(broker.bundled_key(broker.queue_name(model))) > 0
            stack.worker.send(signal.SIGCONT)
            for x, call in zip(sent, calls, strict=True):
                answered(model, x, call.result(timeout=60))
    finally:
        stack.worker.send(signal.SIGCONT)
    # Requests of one shape ran together, the empty ones too.
    assert _executions(stack.http, model) - before < len(sent)


def _executions(url: str, model: str) -> int:
    stats = httpclient.InferenceServerClient(url).get_inference_statistics(model)
    return int(stats["model_stats"][0]["execution_count"])


def _region(name: str, size: int) -> Any:
    return shm.create_shared_memory_region(name, f"/conch_{name}_{os.getpid()}", size)


@pytest.mark.parametrize("model", PATH_MODELS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory(stack: Stack, model: str, protocol: str) -> None:
    """Empty inputs read from a region (no bytes, at an offset) and empty outputs written
    to one: the answer names each output's shape and writes no byte."""
    inputs = given(model, EMPTY)
    names = list(PATH_MODELS[model].outputs.values())
    tag = uuid.uuid4().hex[:8]
    ins, outs = _region(f"in{tag}", 64), _region(f"out{tag}", 64)
    shm.set_shared_memory_region(ins, [np.full(16, 7, np.float32)])
    shm.set_shared_memory_region(outs, [np.full(16, 9, np.float32)])
    lib: Any = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(stack.http if protocol == "http" else stack.grpc)
    try:
        client.register_system_shared_memory(f"in{tag}", ins._shm_key, 64)
        client.register_system_shared_memory(f"out{tag}", outs._shm_key, 64)
        tensors = []
        for name, arr in inputs.items():
            t = lib.InferInput(name, list(arr.shape), _datatype(arr))
            t.set_shared_memory(f"in{tag}", 0, offset=8)
            tensors.append(t)
        wanted = []
        for k, name in enumerate(names):
            o = lib.InferRequestedOutput(name)
            o.set_shared_memory(f"out{tag}", 16, offset=16 * k)
            wanted.append(o)
        got = client.infer(model, tensors, outputs=wanted)
        for name, out in PATH_MODELS[model].outputs.items():
            entry = got.get_output(out)
            shape = entry["shape"] if protocol == "http" else list(entry.shape)
            assert shape == list(inputs[name].shape)
        # Nothing was written: the output region holds what it held.
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(outs, np.float32, [16]), np.full(16, 9, np.float32)
        )
    finally:
        client.unregister_system_shared_memory(f"in{tag}")
        client.unregister_system_shared_memory(f"out{tag}")
        shm.destroy_shared_memory_region(ins)
        shm.destroy_shared_memory_region(outs)


def _in_process(server: conch.Server, model: str) -> None:
    inputs = given(model, EMPTY)
    (response,) = list(server.model(model).infer(inputs))
    answered(model, inputs, response.outputs)


def test_in_process_embedded(stack: Stack) -> None:
    models = list(PATH_MODELS)
    with conch.Server(stack.repo, model_control_mode="explicit", startup_models=models) as server:
        for model in models:
            _in_process(server, model)


def test_in_process_connected(stack: Stack) -> None:
    with conch.Server(stack.repo, redis_url=stack.db).start(wait_until_ready=True) as server:
        for model in PATH_MODELS:
            _in_process(server, model)


# -- Triton's L0_infer_zero, in conch's words ---------------------------------------------


class ZeroCase(NamedTuple):
    """A case of qa/L0_infer_zero/infer_zero_test.py: its models' datatype suffix, and
    each input's shape (with no batch dimension)."""

    suffix: str
    shapes: list[list[int]]


L0_INFER_ZERO = {
    "ff1_sanity": ZeroCase("float32", [[1]]),
    "ff1": ZeroCase("float32", [[0]]),
    "ff3_sanity": ZeroCase("float32", [[1], [2], [1]]),
    "ff3_0": ZeroCase("float32", [[0], [0], [0]]),
    "ff3_1": ZeroCase("float32", [[0], [0], [1]]),
    "ff3_2": ZeroCase("float32", [[0], [1], [0]]),
    "ff3_3": ZeroCase("float32", [[1], [0], [0]]),
    "ff3_4": ZeroCase("float32", [[1], [0], [1]]),
    "hh1_sanity": ZeroCase("float16", [[2, 2]]),
    "hh1_0": ZeroCase("float16", [[1, 0]]),
    "hh1_1": ZeroCase("float16", [[0, 1]]),
    "hh1_2": ZeroCase("float16", [[0, 0]]),
    "hh3_sanity": ZeroCase("float16", [[2, 2], [2, 2], [1, 1]]),
    "hh3_0": ZeroCase("float16", [[0, 0], [0, 0], [0, 0]]),
    "hh3_1": ZeroCase("float16", [[0, 1], [0, 1], [2, 3]]),
    "hh3_2": ZeroCase("float16", [[1, 0], [1, 3], [0, 1]]),
    "hh3_3": ZeroCase("float16", [[1, 1], [3, 0], [0, 0]]),
    "hh3_4": ZeroCase("float16", [[1, 1], [0, 6], [2, 2]]),
    "oo1_sanity": ZeroCase("object", [[2]]),
    "oo1": ZeroCase("object", [[0]]),
    "oo3_sanity": ZeroCase("object", [[2, 2], [2, 2], [1, 1]]),
    "oo3_0": ZeroCase("object", [[0, 0], [0, 0], [0, 0]]),
    "oo3_1": ZeroCase("object", [[0, 1], [0, 1], [2, 3]]),
    "oo3_2": ZeroCase("object", [[1, 0], [1, 3], [0, 1]]),
    "oo3_3": ZeroCase("object", [[1, 1], [3, 0], [0, 0]]),
    "oo3_4": ZeroCase("object", [[1, 1], [0, 6], [2, 2]]),
    "bb1_sanity": ZeroCase("bool", [[10]]),
    "bb1_0": ZeroCase("bool", [[0]]),
}


def _zero_call(stack: Stack, way: str, model: str, inputs: dict, outputs: list[str]) -> dict:
    """``inputs`` sent to ``model`` one ``way`` (HTTP binary or JSON, gRPC, a stream)."""
    if way.startswith("http"):
        return http_call(stack.http, model, inputs, outputs, binary=way == "http-binary")
    return grpc_call(stack.grpc, model, inputs, outputs, stream=way == "stream")


@pytest.mark.parametrize("case", L0_INFER_ZERO)
def test_l0_infer_zero(stack: Stack, case: str) -> None:
    """As L0_infer_zero's ``test_<case>``: every backend's identity model with that
    datatype, batching (batch sizes 1 and 8) and not, answers over HTTP (binary, and
    JSON but for FP16), gRPC and a gRPC stream with its inputs, empty ones included."""
    suffix, shapes = L0_INFER_ZERO[case]
    datatype = ZERO_TYPES[suffix].datatype
    ways = ["http-binary", "grpc", "stream"] + ([] if datatype == "FP16" else ["http-json"])
    for backend in ZERO_TYPES[suffix].backends:
        io = "__" if backend == "libtorch" else ""
        pairs = [Pair(f"INPUT{io}{k}", f"OUTPUT{io}{k}", datatype) for k in range(len(shapes))]
        outputs = [p.output for p in pairs]
        runs = [
            (f"{backend}_zero_{len(shapes)}_{suffix}", [[b, *s] for s in shapes]) for b in (1, 8)
        ]
        runs.append((f"{backend}_nobatch_zero_{len(shapes)}_{suffix}", shapes))
        for model, batch_shapes in runs:
            inputs = {
                p.input: tensor(datatype, s, seed=k)
                for k, (p, s) in enumerate(zip(pairs, batch_shapes, strict=True))
            }
            for way in ways:
                got = _zero_call(stack, way, model, inputs, outputs)
                for p in pairs:
                    same(got[p.output], inputs[p.input], f"{model} {p.output} over {way}")
