"""TorchScript models with TYPE_STRING tensors, through the real path (issue 29, point 2).

Triton's pytorch backend hands a BYTES input to ``forward()`` as one ``List[str]`` (every
element of the batch) and takes ``List[str]`` results back as 1-D BYTES outputs. A private
redis-server, a worker, the gateway and ``conch grpc`` serve a repository of such models,
built here; stock tritonclient (HTTP and gRPC) drives them. The repository holds string
models only, like Triton's qa model repository's ``libtorch_nobatch_object_*`` (what
L0_server_status loads), so strict readiness says ready only if every one of them loads.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from torch_string_models import Label, Mixed, Upper

from harness import (
    Service,
    start_gateway,
    start_grpc,
    start_worker,
    wait_grpc_model_ready,
    wait_model_ready,
    wait_until,
)

# -- the models -------------------------------------------------------------------------


class AddSubStrings(torch.nn.Module):
    """Triton's qa addsub on strings (gen_qa_models.py, libtorch_nobatch_object_object_object)."""

    def forward(self, INPUT0: list[str], INPUT1: list[str]) -> tuple[list[str], list[str]]:
        a = torch.tensor([int(i) for i in INPUT0])
        b = torch.tensor([int(i) for i in INPUT1])
        return [str(int(i)) for i in a + b], [str(int(i)) for i in a - b]


HEAD = 'platform: "pytorch_libtorch"\n'
ONE_PER_ROW = "dims: [ 1 ] reshape: { shape: [ ] }"  # Triton's form for batched strings

MODELS: dict[str, tuple[torch.nn.Module, str]] = {
    "libtorch_nobatch_object_object_object": (
        AddSubStrings(),
        HEAD + "max_batch_size: 0\n"
        'input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] },'
        ' { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ 16 ] },'
        ' { name: "OUTPUT__1" data_type: TYPE_STRING dims: [ 16 ] } ]\n',
    ),
    "pt_upper": (
        Upper(),
        HEAD + "max_batch_size: 0\n"
        'input [ { name: "TEXT__0" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'output [ { name: "OUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]\n',
    ),
    # Batched, with a long queue delay so that concurrent requests run as one batch.
    "pt_upper_batched": (
        Upper(),
        HEAD + "max_batch_size: 8\n"
        f'input [ {{ name: "TEXT__0" data_type: TYPE_STRING {ONE_PER_ROW} }} ]\n'
        f'output [ {{ name: "OUT__0" data_type: TYPE_STRING {ONE_PER_ROW} }} ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 300000 }\n",
    ),
    "pt_mixed": (
        Mixed(),
        HEAD + "max_batch_size: 0\n"
        'input [ { name: "words" data_type: TYPE_STRING dims: [ -1 ] },'
        ' { name: "scale" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] },'
        ' { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ -1 ] } ]\n',
    ),
    "pt_label": (
        Label(),
        HEAD + "max_batch_size: 8\n"
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        f'output [ {{ name: "OUTPUT__0" data_type: TYPE_INT64 {ONE_PER_ROW} }},'
        f' {{ name: "OUTPUT__1" data_type: TYPE_STRING {ONE_PER_ROW} }} ]\n',
    ),
}


def build_repo(root: Path) -> Path:
    for name, (module, config) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(torch.jit.script(module), str(root / name / "1" / "model.pt"))
        (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[tuple[str, str]]:
    repo = build_repo(tmp_path_factory.mktemp("torch_strings") / "models")
    services: list[Service] = [start_worker(repo, redis_url, log_dir)]
    try:
        gateway, url = start_gateway(repo, redis_url, log_dir)
        services.append(gateway)
        grpc_server, grpc_url = start_grpc(repo, redis_url, log_dir)
        services.append(grpc_server)
        for name in MODELS:
            wait_model_ready(url, name, 120, *services)
        yield url, grpc_url
    finally:
        for s in reversed(services):
            s.stop()


@pytest.fixture()
def client(stack: tuple[str, str]) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(stack[0])


def _strings(name: str, values: np.ndarray, *, binary: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(values.shape), "BYTES")
    tensor.set_data_from_numpy(values, binary_data=binary)
    return tensor


def _objects(items: list[bytes], shape: tuple[int, ...] | None = None) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape or (len(items),))


def _as_bytes(item: bytes | str) -> bytes:
    return item.encode() if isinstance(item, str) else item


# -- the tests --------------------------------------------------------------------------


def test_strict_readiness_with_only_string_models(stack: tuple[str, str], client) -> None:
    # L0_server_status's symptom: one refused model keeps a strict server not ready.
    status = requests.get(f"http://{stack[0]}/v2/health/ready", timeout=30).status_code
    assert status == 200
    assert client.is_server_ready()
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert {n: index[n]["state"] for n in MODELS} == dict.fromkeys(MODELS, "READY")


def test_metadata_says_bytes(client) -> None:
    meta = client.get_model_metadata("pt_upper_batched")
    assert meta["inputs"] == [{"name": "TEXT__0", "datatype": "BYTES", "shape": [-1, 1]}]
    assert meta["outputs"] == [{"name": "OUT__0", "datatype": "BYTES", "shape": [-1, 1]}]


@pytest.mark.parametrize("binary", [True, False])
def test_triton_qa_string_addsub(client, binary: bool) -> None:
    a = _objects([str(i).encode() for i in range(16)])
    b = _objects([b"3"] * 16)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT__0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT__1", binary_data=binary),
    ]
    result = client.infer(
        "libtorch_nobatch_object_object_object",
        [_strings("INPUT0", a, binary=binary), _strings("INPUT1", b, binary=binary)],
        outputs=outputs,
    )
    sums, diffs = result.as_numpy("OUTPUT__0"), result.as_numpy("OUTPUT__1")
    assert sums.shape == (16,) and diffs.shape == (16,)
    # (tritonclient gives JSON strings back as str, binary ones as bytes)
    assert [_as_bytes(s) for s in sums] == [str(i + 3).encode() for i in range(16)]
    assert [_as_bytes(s) for s in diffs] == [str(i - 3).encode() for i in range(16)]


def test_list_str_in_list_str_out_utf8(client) -> None:
    text = _objects([b"abc", "caf\u00e9".encode(), b""])
    result = client.infer("pt_upper", [_strings("TEXT__0", text)])
    out = result.as_numpy("OUT__0")
    assert out.shape == (3,)  # one string per element of the list, 1-D
    assert out.tolist() == [b"ABC:3", "CAF\u00e9:5".encode(), b":0"]
    assert result.get_output("OUT__0")["datatype"] == "BYTES"


def test_batched_strings_come_back_to_their_own_requests(client, stack) -> None:
    # Concurrent requests share one execution (the queue delay), one List[str] for all of
    # them; each gets its own rows back, in the config's shape [rows, 1].
    def call(i: int) -> tuple[int, np.ndarray]:
        c = httpclient.InferenceServerClient(stack[0])
        rows = [f"r{i}-{k}".encode() for k in range(i % 3 + 1)]
        result = c.infer("pt_upper_batched", [_strings("TEXT__0", _objects(rows, (len(rows), 1)))])
        return i, result.as_numpy("OUT__0")

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(call, range(6)))
    for i, out in answers:
        want = [f"R{i}-{k}:{len(f'r{i}-{k}')}".encode() for k in range(i % 3 + 1)]
        assert out.shape == (len(want), 1)
        assert out.ravel().tolist() == want
    stats = client.get_inference_statistics("pt_upper_batched")["model_stats"][0]
    assert stats["inference_count"] == sum(i % 3 + 1 for i in range(6))
    assert stats["execution_count"] < 6  # some of them ran together


def test_mixed_string_and_numeric(client) -> None:
    words = _strings("words", _objects([b"hi", b"there"]))
    scale = httpclient.InferInput("scale", [1], "FP32")
    scale.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    result = client.infer("pt_mixed", [words, scale])
    assert result.as_numpy("OUTPUT__0").tolist() == [b"hi!", b"there!"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), np.array([4.0, 10.0], np.float32))


def test_numeric_in_string_out_batched(client) -> None:
    x = httpclient.InferInput("INPUT__0", [2, 3], "FP32")
    x.set_data_from_numpy(np.array([[0, 5, 1], [9, 0, 0]], dtype=np.float32))
    result = client.infer("pt_label", [x])
    labels = result.as_numpy("OUTPUT__1")
    assert labels.shape == (2, 1)
    assert labels.ravel().tolist() == [b"label1", b"label0"]
    assert result.as_numpy("OUTPUT__0").ravel().tolist() == [1, 0]


def test_grpc(stack: tuple[str, str]) -> None:
    grpc_url = stack[1]
    wait_grpc_model_ready(grpc_url, "pt_upper", 60)
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        text = _objects([b"grpc", b"ok"])
        tensor = grpcclient.InferInput("TEXT__0", [2], "BYTES")
        tensor.set_data_from_numpy(text)
        out = client.infer("pt_upper", [tensor]).as_numpy("OUT__0")
        assert out.tolist() == [b"GRPC:4", b"OK:2"]
        wait_until(lambda: client.is_server_ready(), 30, "gRPC server ready")
    finally:
        client.close()
