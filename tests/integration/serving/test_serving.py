"""The real path: stock tritonclient → gateway (gunicorn) → Redis → Celery worker → onnxruntime."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from harness import reference_mlp, start_gateway, start_worker, wait_model_ready, waiting
from models import IDENTITY_TYPES, identity_array, rng_input


@pytest.fixture(scope="module")
def stack(model_repo: Path, redis_url: str, log_dir: Path) -> Iterator[str]:
    worker = start_worker(model_repo, redis_url, log_dir)
    gateway, url = start_gateway(model_repo, redis_url, log_dir, workers=2)
    try:
        for m in ("mlp", "mlp_autocomplete", "identity", "add", "transpose"):
            wait_model_ready(url, m, 90, worker, gateway)
        yield url
    finally:
        gateway.stop()
        worker.stop()


@pytest.fixture()
def client(stack: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(stack)


def http(stack: str, method: str, path: str, **kw) -> requests.Response:
    return requests.request(method, f"http://{stack}{path}", timeout=30, **kw)


def infer_mlp(client, x: np.ndarray, binary: bool = True, **kw) -> np.ndarray:
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    return client.infer("mlp", [inp], outputs=[out], **kw).as_numpy("OUTPUT0")


# -- health and metadata --------------------------------------------------------------
def test_health_and_server_metadata(client) -> None:
    assert client.is_server_live()
    # Strict readiness, Triton's default: the repository's 'broken' model never loads.
    # (tests/integration/serving/test_readiness.py has the server become ready.)
    assert not client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "conch"
    assert "binary_tensor_data" in meta["extensions"]
    assert "model_configuration" in meta["extensions"]
    assert "statistics" in meta["extensions"]


def test_model_metadata(client) -> None:
    meta = client.get_model_metadata("mlp")
    assert meta == {
        "name": "mlp",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
    }
    assert client.get_model_metadata("mlp", "1")["versions"] == ["1"]


def test_model_config_is_tritons_json(client) -> None:
    cfg = client.get_model_config("mlp")
    assert cfg["name"] == "mlp"
    assert cfg["max_batch_size"] == 64
    assert cfg["input"][0]["dims"] == [64] and cfg["output"][0]["dims"] == [16]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert "sequence_batching" not in cfg and "ensemble_scheduling" not in cfg
    assert cfg["backend"] == "onnxruntime" and cfg["platform"] == "onnxruntime_onnx"
    assert cfg["version_policy"] == {"latest": {"num_versions": 1}}
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert cfg["instance_group"][0]["name"]
    assert cfg["default_model_filename"] == "model.onnx"


def test_auto_completed_model(client) -> None:
    cfg = client.get_model_config("mlp_autocomplete")
    assert cfg["max_batch_size"] == 4  # Triton's default for a batchable ONNX model
    assert cfg["platform"] == "onnxruntime_onnx"
    assert "dynamic_batching" in cfg
    names = {i["name"] for i in cfg["input"]}
    assert names == {i["name"] for i in client.get_model_metadata("mlp_autocomplete")["inputs"]}
    meta = client.get_model_metadata("mlp_autocomplete")
    inputs = []
    for i in meta["inputs"]:
        shape = [2, *[d if d > 0 else 1 for d in i["shape"][1:]]]
        arr = np.ones(shape, dtype=np.float32)
        inp = httpclient.InferInput(i["name"], shape, i["datatype"])
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer("mlp_autocomplete", inputs)
    for o in meta["outputs"]:
        assert result.as_numpy(o["name"]).shape[0] == 2


# -- inference ------------------------------------------------------------------------
@pytest.mark.parametrize("binary", [True, False])
def test_mlp_matches_reference(client, binary: bool) -> None:
    x = rng_input((3, 64), seed=1)
    got = infer_mlp(client, x, binary=binary)
    np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-5, atol=1e-5)


def test_explicit_version_and_request_id(client) -> None:
    x = rng_input((1, 64), seed=2)
    inp = httpclient.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp", [inp], model_version="1", request_id="abc-1")
    assert result.get_response()["id"] == "abc-1"
    assert result.get_response()["model_version"] == "1"
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), reference_mlp(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_round_trips(client, binary: bool) -> None:
    arrays = {name: identity_array(name, (2, 5), seed=len(name)) for name in IDENTITY_TYPES}
    inputs, outputs = [], []
    for name, arr in arrays.items():
        inp = httpclient.InferInput(f"IN_{name}", list(arr.shape), np_to_triton_dtype(arr.dtype))
        # FP16 cannot travel in JSON (Triton's rule too), so it is always binary here.
        inp.set_data_from_numpy(arr, binary_data=binary or name == "FP16")
        inputs.append(inp)
        outputs.append(
            httpclient.InferRequestedOutput(f"OUT_{name}", binary_data=binary or name == "FP16")
        )
    result = client.infer("identity", inputs, outputs=outputs)
    for name, arr in arrays.items():
        got = result.as_numpy(f"OUT_{name}")
        assert got.shape == arr.shape, name
        if name == "BYTES":
            # tritonclient gives str elements for JSON outputs, bytes for binary ones.
            as_bytes = [
                [e.encode() if isinstance(e, str) else e for e in row] for row in got.tolist()
            ]
            assert as_bytes == arr.tolist()
        else:
            assert got.dtype == arr.dtype, name
            np.testing.assert_array_equal(got, arr)


def test_fp16_in_json_is_refused(stack: str) -> None:
    body = {"inputs": [{"name": "IN_FP16", "shape": [1, 1], "datatype": "FP16", "data": [1.0]}]}
    r = http(stack, "POST", "/v2/models/identity/infer", json=body)
    assert r.status_code == 400 and "FP16" in r.json()["error"]


def test_outputs_default_to_all_binary(client) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    inputs = []
    for n in ("A", "B"):
        i = httpclient.InferInput(n, [2, 4], "FP32")
        i.set_data_from_numpy(a)
        inputs.append(i)
    result = client.infer("add", inputs)  # no outputs listed: all of them, binary
    np.testing.assert_array_equal(result.as_numpy("OUT"), a + a)
    assert result.get_output("OUT")["parameters"]["binary_data_size"] == 32


def test_compressed_request_and_response(stack: str) -> None:
    x = rng_input((1, 64), seed=3)
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}
            ]
        }
    ).encode()
    r = http(
        stack,
        "POST",
        "/v2/models/mlp/infer",
        data=gzip.compress(body),
        headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
    )
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]  # requests undoes the gzip
    np.testing.assert_allclose(
        np.array(out["data"], dtype=np.float32).reshape(out["shape"]),
        reference_mlp(x),
        rtol=1e-5,
        atol=1e-5,
    )


def test_concurrent_requests_all_correct(client, stack: str) -> None:
    xs = [rng_input((1 + i % 3, 64), seed=100 + i) for i in range(64)]

    def one(x: np.ndarray) -> np.ndarray:
        return infer_mlp(httpclient.InferenceServerClient(stack), x)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, xs))
    for x, got in zip(xs, results, strict=True):
        np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-5, atol=1e-5)


def test_kind_gpu_serves_on_a_gpu_or_says_why_not(client, stack: str) -> None:
    from conch.backends.onnxruntime import gpu_available

    x = rng_input((2, 64), seed=5)
    inp = httpclient.InferInput("INPUT0", [2, 64], "FP32")
    inp.set_data_from_numpy(x)
    has_gpu, _ = gpu_available()
    if has_gpu:
        wait_model_ready(stack, "gpu_mlp", 60)
        got = client.infer("gpu_mlp", [inp]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-3, atol=1e-3)
        return
    # No GPU here: the model is unavailable with the reason, and requests fail at once.
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["gpu_mlp"]["state"] == "UNAVAILABLE"
    assert (
        "KIND_GPU" in index["gpu_mlp"]["reason"]
        and "CUDAExecutionProvider" in index["gpu_mlp"]["reason"]
    )
    assert not client.is_model_ready("gpu_mlp")
    with pytest.raises(InferenceServerException, match="CUDAExecutionProvider") as exc:
        client.infer("gpu_mlp", [inp])
    assert exc.value.status() == "503"


# -- readiness and the repository index ----------------------------------------------------
def test_readiness(client) -> None:
    assert client.is_model_ready("mlp")
    assert client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("broken")
    assert not client.is_model_ready("nope")


def test_config_reshape_is_what_clients_see(client) -> None:
    # The model takes [batch, 2, 2]; its config shows rows of 4 with reshape { [2, 2] }.
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    inp = httpclient.InferInput("X", [3, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("transpose", [inp])
    got = result.as_numpy("Y")
    np.testing.assert_array_equal(got, x.reshape(3, 2, 2).transpose(0, 2, 1).reshape(3, 4))
    meta = client.get_model_metadata("transpose")
    assert meta["inputs"][0]["shape"] == [-1, 4]


def _add(client, rows: int) -> None:
    a = np.full((rows, 4), float(rows), np.float32)
    inputs = []
    for name in ("A", "B"):
        inp = httpclient.InferInput(name, [rows, 4], "FP32")
        inp.set_data_from_numpy(a)
        inputs.append(inp)
    np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("OUT"), a * 2)


def test_statistics_count_what_ran(client) -> None:
    def stats() -> dict:
        (entry,) = client.get_inference_statistics("add")["model_stats"]
        return entry

    before = stats()
    for rows in (1, 2, 3):  # add has no dynamic batching: one execution each
        _add(client, rows)
    after = stats()
    assert after["name"] == "add" and after["version"] == "1"
    assert after["inference_count"] - before["inference_count"] == 6
    assert after["execution_count"] - before["execution_count"] == 3
    assert after["last_inference"] > 0 and after["last_inference"] >= before["last_inference"]
    for phase in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        grew = {
            k: after["inference_stats"][phase][k] - before["inference_stats"][phase][k]
            for k in ("count", "ns")
        }
        assert grew["count"] == 3 and grew["ns"] > 0, (phase, grew)
    assert after["inference_stats"]["fail"] == before["inference_stats"]["fail"]
    s = after["inference_stats"]
    assert s["success"]["ns"] >= s["queue"]["ns"] + s["compute_infer"]["ns"]  # the whole stay
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    old = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    assert all(sizes[n] - old.get(n, 0) >= 1 for n in (1, 2, 3)), sizes
    # One version, every model, an unknown model: Triton's routes and errors.
    (v1,) = client.get_inference_statistics("add", "1")["model_stats"]
    assert v1["version"] == "1" and v1["execution_count"] >= after["execution_count"]
    names = {m["name"] for m in client.get_inference_statistics()["model_stats"]}
    assert {"add", "mlp", "identity"} <= names
    with pytest.raises(InferenceServerException) as exc:
        client.get_inference_statistics("no_such_model")
    assert exc.value.status() == "400"


def test_repository_index(client) -> None:
    index = {(m["name"], m.get("version")): m for m in client.get_model_repository_index()}
    assert index[("mlp", "1")]["state"] == "READY"
    assert index[("broken", None)]["state"] == "UNAVAILABLE"
    assert "config.pbtxt" in index[("broken", None)]["reason"]


# -- errors: a clear 4xx in Triton's form, and nothing reaches a worker ------------------
BAD_REQUESTS = [
    # (path, body, headers, status, fragment of the message)
    ("/v2/models/nope/infer", b"{}", {}, 400, "unknown model"),
    ("/v2/models/broken/infer", b"{}", {}, 400, "config.pbtxt"),
    ("/v2/models/mlp/versions/7/infer", b"{}", {}, 404, "version"),
    ("/v2/models/mlp/infer", b"{not json", {}, 400, ""),
    ("/v2/models/mlp/infer", b"[]", {}, 400, ""),
    (
        "/v2/models/mlp/infer",
        json.dumps(
            {
                "inputs": [
                    {"name": "WRONG", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}
                ]
            }
        ).encode(),
        {},
        400,
        "WRONG",
    ),
    (
        "/v2/models/mlp/infer",
        json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 64], "datatype": "INT32", "data": [0] * 64}
                ]
            }
        ).encode(),
        {},
        400,
        "INT32",
    ),
    (
        "/v2/models/mlp/infer",
        json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 32], "datatype": "FP32", "data": [0.0] * 32}
                ]
            }
        ).encode(),
        {},
        400,
        "shape",
    ),
    (
        "/v2/models/mlp/infer",
        json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": [65, 64],
                        "datatype": "FP32",
                        "data": [0.0] * 65 * 64,
                    }
                ]
            }
        ).encode(),
        {},
        400,
        "batch",
    ),
    (
        "/v2/models/mlp/infer",
        json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 63}
                ]
            }
        ).encode(),
        {},
        400,
        "",
    ),
    (
        "/v2/models/mlp/infer",
        json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": [1, 64],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 256},
                    }
                ]
            }
        ).encode()
        + b"\0" * 300,
        {"Inference-Header-Content-Length": "-"},
        400,
        "",
    ),
    (
        "/v2/models/mlp/infer",
        json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}
                ],
                "outputs": [{"name": "NOPE"}],
            }
        ).encode(),
        {},
        400,
        "NOPE",
    ),
    ("/v2/models/mlp/infer", b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"}, 400, ""),
    ("/v2/models/mlp/infer", b"{}", {"Content-Encoding": "br"}, 400, ""),
    ("/v2/models/%2E%2E/infer", b"{}", {}, 400, "unknown model"),
    ("/v2/models/..%2F..%2Fetc/infer", b"{}", {}, 404, "not found"),
]


@pytest.mark.parametrize(("path", "body", "headers", "status", "fragment"), BAD_REQUESTS)
def test_bad_requests_get_a_clear_4xx_and_reach_no_worker(
    stack: str, redis_url: str, path: str, body: bytes, headers: dict, status: int, fragment: str
) -> None:
    if headers.get("Inference-Header-Content-Length") == "-":
        headers = {"Inference-Header-Content-Length": str(body.index(b"\0"))}
    r = http(stack, "POST", path, data=body, headers=headers)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and error
    assert fragment.lower() in error.lower()
    assert waiting(redis_url, "mlp") == 0


def test_body_size_is_bounded(stack: str) -> None:
    r = http(stack, "POST", "/v2/models/mlp/infer", data=b"x" * (65 * 1024 * 1024))
    assert r.status_code == 400
    assert "limit" in r.json()["error"]


def test_unknown_route_and_method(stack: str) -> None:
    r = http(stack, "GET", "/v2/nowhere")
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    r = http(stack, "GET", "/v2/models/mlp/versions/abc")
    assert r.status_code == 404
    r = http(stack, "DELETE", "/v2/models/mlp/infer")
    assert r.status_code == 405 and r.json()["error"]
    # A 405 says which methods the route takes (RFC 9110's Allow), as well as Triton's body.
    assert {m.strip() for m in r.headers["Allow"].split(",")} == {"OPTIONS", "POST"}
    r = http(stack, "TRACE", "/v2")
    assert r.status_code == 405 and r.headers["Content-Type"] == "application/json"
    assert {m.strip() for m in r.headers["Allow"].split(",")} == {"GET", "HEAD", "OPTIONS"}


def test_metadata_errors(stack: str) -> None:
    r = http(stack, "GET", "/v2/models/nope")
    assert r.status_code == 400 and "unknown model" in r.json()["error"]
    r = http(stack, "GET", "/v2/models/broken/config")
    assert r.status_code == 400 and "config.pbtxt" in r.json()["error"]
    r = http(stack, "GET", "/v2/models/mlp/versions/9/config")
    assert r.status_code == 404


def test_service_goes_on_after_bad_input(client) -> None:
    x = rng_input((2, 64), seed=9)
    np.testing.assert_allclose(infer_mlp(client, x), reference_mlp(x), rtol=1e-5, atol=1e-5)
