"""Triton's system shared-memory extension through the real path (issue 33, point 2):
stock tritonclient (``tritonclient.utils.shared_memory`` and each client's register,
status and unregister calls) and ``perf_analyzer --shared-memory system`` against a
worker, a gateway of two processes and a gRPC server, all with ``--allow-client-shm``.
A registration made through one process is used through the others (it is kept in
Redis). Bad regions are 400s (INVALID_ARGUMENT) and never a crash; without the flag
every part of it is refused, saying which flag turns it on; CUDA shared memory is
refused with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from harness import (
    Service,
    fresh_db,
    run_perf_analyzer,
    start_gateway,
    start_grpc,
    start_worker,
    wait_model_ready,
)
from models import add_model

A = np.arange(4, dtype=np.float32).reshape(1, 4)
B = np.full((1, 4), 10.0, dtype=np.float32)
NBYTES = A.nbytes  # 16
PLACES: dict[str, object] = {}  # the stack's repository and Redis database


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path
) -> Iterator[tuple[str, str, Service, Service, Service]]:
    """(HTTP URL, gRPC URL, worker, gateway, gRPC server), shared memory on."""
    repo = tmp_path_factory.mktemp("shm") / "models"
    add_model(repo / "add")
    db = fresh_db(redis_url, 14)
    PLACES.update(repo=repo, db=db)
    worker = start_worker(repo, db, log_dir, "--models", "add")
    gateway, url = start_gateway(repo, db, log_dir, "--allow-client-shm", workers=2)
    server, grpc_url = start_grpc(repo, db, log_dir, "--allow-client-shm=true")
    try:
        wait_model_ready(url, "add", 90, worker, gateway)
        yield url, grpc_url, worker, gateway, server
    finally:
        server.stop()
        gateway.stop()
        worker.stop()


@pytest.fixture()
def regions() -> Iterator[tuple[object, object]]:
    """An input region holding A then B, and an output region, as tritonclient makes them."""
    tag = f"{os.getpid()}_{os.urandom(3).hex()}"
    inputs = shm.create_shared_memory_region("in", f"/conch_in_{tag}", 2 * NBYTES)
    shm.set_shared_memory_region(inputs, [A, B])
    outputs = shm.create_shared_memory_region("out", f"/conch_out_{tag}", NBYTES)
    try:
        yield inputs, outputs
    finally:
        shm.destroy_shared_memory_region(inputs)
        shm.destroy_shared_memory_region(outputs)


def _key(handle: object) -> str:
    return handle._shm_key  # type: ignore[attr-defined]


def _http_infer(client: httpclient.InferenceServerClient) -> httpclient.InferResult:
    a = httpclient.InferInput("A", [1, 4], "FP32")
    a.set_shared_memory("in", NBYTES)
    b = httpclient.InferInput("B", [1, 4], "FP32")
    b.set_shared_memory("in", NBYTES, offset=NBYTES)
    out = httpclient.InferRequestedOutput("OUT", binary_data=True)
    out.set_shared_memory("out", NBYTES)
    return client.infer("add", [a, b], outputs=[out])


def _grpc_infer(client: grpcclient.InferenceServerClient) -> grpcclient.InferResult:
    a = grpcclient.InferInput("A", [1, 4], "FP32")
    a.set_shared_memory("in", NBYTES)
    b = grpcclient.InferInput("B", [1, 4], "FP32")
    b.set_shared_memory("in", NBYTES, offset=NBYTES)
    out = grpcclient.InferRequestedOutput("OUT")
    out.set_shared_memory("out", NBYTES)
    return client.infer("add", [a, b], outputs=[out])


def _plain(url: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    a = httpclient.InferInput("A", [1, 4], "FP32")
    a.set_data_from_numpy(A)
    b = httpclient.InferInput("B", [1, 4], "FP32")
    b.set_data_from_numpy(B)
    return client.infer("add", [a, b]).as_numpy("OUT")


def test_http_register_infer_status_unregister(stack, regions) -> None:
    url = stack[0]
    inputs, outputs = regions
    client = httpclient.InferenceServerClient(url)
    client.unregister_system_shared_memory()
    client.register_system_shared_memory("in", _key(inputs), 2 * NBYTES)
    client.register_system_shared_memory("out", _key(outputs), NBYTES)
    status = {r["name"]: r for r in client.get_system_shared_memory_status()}
    assert status["in"] == {"name": "in", "key": _key(inputs), "offset": 0, "byte_size": 32}
    assert client.get_system_shared_memory_status("out")[0]["byte_size"] == NBYTES
    # Several calls: the gateway's two processes each map the regions on first use.
    for _ in range(6):
        result = _http_infer(client)
        entry = result.get_output("OUT")
        assert entry == {"name": "OUT", "datatype": "FP32", "shape": [1, 4]}  # no data
        got = shm.get_contents_as_numpy(outputs, np.float32, [1, 4])
        np.testing.assert_array_equal(got, _plain(url))
        np.testing.assert_array_equal(got, A + B)
    # Re-registering a name is Triton's error.
    with pytest.raises(InferenceServerException, match="already in manager"):
        client.register_system_shared_memory("in", _key(inputs), NBYTES)
    client.unregister_system_shared_memory("out")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["in"]
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region"):
        _http_infer(client)
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


def test_grpc_uses_what_http_registered(stack, regions) -> None:
    url, grpc_url = stack[0], stack[1]
    inputs, outputs = regions
    http = httpclient.InferenceServerClient(url)
    http.unregister_system_shared_memory()
    http.register_system_shared_memory("in", _key(inputs), 2 * NBYTES)
    client = grpcclient.InferenceServerClient(grpc_url)
    client.register_system_shared_memory("out", _key(outputs), NBYTES)
    status = client.get_system_shared_memory_status(as_json=True)["regions"]
    assert set(status) == {"in", "out"} and status["in"]["key"] == _key(inputs)
    result = _grpc_infer(client)
    assert result.get_response().raw_output_contents == [b""]  # the data is in the region
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [1, 4]), A + B)
    with pytest.raises(InferenceServerException) as err:
        client.register_system_shared_memory("out", _key(outputs), NBYTES)
    assert "StatusCode.ALREADY_EXISTS" in str(err.value.status())
    client.unregister_system_shared_memory()
    assert http.get_system_shared_memory_status() == []


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"key": "../etc/passwd", "offset": 0, "byte_size": 8}, "invalid shared memory key"),
        ({"key": "/../etc", "offset": 0, "byte_size": 8}, "invalid shared memory key"),
        ({"key": "/..", "offset": 0, "byte_size": 8}, "invalid shared memory key"),
        ({"key": "/conch_no_such_object", "offset": 0, "byte_size": 8}, "Unable to open"),
        ({"key": "KEY", "offset": 0, "byte_size": 1 << 20}, "invalid args"),
        ({"key": "KEY", "offset": 32, "byte_size": 1}, "invalid args"),
        ({"key": "KEY", "offset": -1, "byte_size": 1}, "'offset' must be"),
        ({"key": "KEY", "offset": 0}, "no 'byte_size' field"),
    ],
)
def test_bad_registrations_are_400s(stack, regions, body: dict, match: str) -> None:
    url = stack[0]
    if body.get("key") == "KEY":
        body = {**body, "key": _key(regions[0])}
    r = requests.post(
        f"http://{url}/v2/systemsharedmemory/region/bad/register", json=body, timeout=10
    )
    assert r.status_code == 400, r.text
    assert match in r.json()["error"]
    assert requests.get(f"http://{url}/v2/systemsharedmemory/status", timeout=10).json() == []


def test_bad_regions_in_infer_calls_are_400s(stack, regions) -> None:
    url = stack[0]
    inputs, outputs = regions
    client = httpclient.InferenceServerClient(url)
    client.unregister_system_shared_memory()
    client.register_system_shared_memory("in", _key(inputs), 2 * NBYTES)
    client.register_system_shared_memory("small", _key(outputs), 8)
    try:
        for offset, size, match in (
            (32, 16, "Invalid offset for shared memory region"),
            (24, 16, r"Invalid offset \+ byte size"),
            (0, 8, "expected 16 bytes for FP32 shape"),  # not the tensor's size
        ):
            a = httpclient.InferInput("A", [1, 4], "FP32")
            a.set_shared_memory("in", size, offset=offset)
            b = httpclient.InferInput("B", [1, 4], "FP32")
            b.set_data_from_numpy(B)
            with pytest.raises(InferenceServerException, match=match) as err:
                client.infer("add", [a, b])
            assert err.value.status() == "400"
        a = httpclient.InferInput("A", [1, 4], "FP32")
        a.set_data_from_numpy(A)
        b = httpclient.InferInput("B", [1, 4], "FP32")
        b.set_data_from_numpy(B)
        out = httpclient.InferRequestedOutput("OUT")
        out.set_shared_memory("small", 8)
        with pytest.raises(InferenceServerException, match="should be at least 16 bytes"):
            client.infer("add", [a, b], outputs=[out])
        unknown = httpclient.InferRequestedOutput("OUT")
        unknown.set_shared_memory("nope", 16)
        with pytest.raises(InferenceServerException, match="Unable to find shared memory"):
            client.infer("add", [a, b], outputs=[unknown])
        np.testing.assert_array_equal(_plain(url), A + B)  # and it serves on
    finally:
        client.unregister_system_shared_memory()
    assert all(s.alive() for s in stack[2:])


def test_cuda_shared_memory_is_refused_with_the_reason(stack) -> None:
    url, grpc_url = stack[0], stack[1]
    r = requests.post(
        f"http://{url}/v2/cudasharedmemory/region/g/register",
        json={"raw_handle": {"b64": "AA=="}, "device_id": 0, "byte_size": 8},
        timeout=10,
    )
    assert r.status_code == 400 and "CUDA shared memory is not supported" in r.json()["error"]
    client = httpclient.InferenceServerClient(url)
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_cuda_shared_memory()  # nothing to do, as on a CPU-only Triton
    grpc = grpcclient.InferenceServerClient(grpc_url)
    with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported"):
        grpc.register_cuda_shared_memory("g", b"\0" * 64, 0, 8)
    grpc.unregister_cuda_shared_memory()


def test_off_by_default(stack, log_dir: Path) -> None:
    """A gateway without the flag refuses the routes and any call naming a region (403,
    naming the flag); the server metadata does not list the extension."""
    url = stack[0]
    assert (
        "system_shared_memory" in requests.get(f"http://{url}/v2", timeout=10).json()["extensions"]
    )
    gateway, off = start_gateway(PLACES["repo"], PLACES["db"], log_dir)  # type: ignore[arg-type]
    try:
        for method, path in (
            ("get", "/v2/systemsharedmemory/status"),
            ("post", "/v2/systemsharedmemory/region/r/register"),
            ("post", "/v2/systemsharedmemory/unregister"),
            ("get", "/v2/cudasharedmemory/status"),
        ):
            r = requests.request(method, f"http://{off}{path}", json={}, timeout=10)
            assert r.status_code == 403 and "--allow-client-shm=true" in r.json()["error"], path
        doc = {
            "inputs": [
                {
                    "name": "A",
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16},
                }
            ]
        }
        r = requests.post(f"http://{off}/v2/models/add/infer", json=doc, timeout=10)
        assert r.status_code == 403 and "--allow-client-shm" in r.json()["error"], r.text
        assert (
            "system_shared_memory"
            not in requests.get(f"http://{off}/v2", timeout=10).json()["extensions"]
        )
    finally:
        gateway.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(stack, protocol: str) -> None:
    url = stack[0] if protocol == "http" else stack[1]
    out, throughputs = run_perf_analyzer(
        "-m",
        "add",
        "-u",
        url,
        "-i",
        protocol,
        "--shared-memory",
        "system",
        "--output-shared-memory-size",
        "64",
        "--concurrency-range",
        "1:2",
    )
    assert throughputs and all(t > 0 for t in throughputs), out[-3000:]
    assert all(s.alive() for s in stack[2:])
