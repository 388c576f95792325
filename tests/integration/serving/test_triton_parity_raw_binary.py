"""Raw binary requests, through the real gateway (issue 29 point 1; Triton's L0_http).

``Inference-Header-Content-Length: 0`` and the whole body is the model's one input: its
name, datatype and shape come from the model's config (a batch of 1 when the model
batches, the one variable dim from the body's size, a BYTES input as one element), and
every output comes back in binary form. A model with more than one input, or one whose
shape cannot be deduced, is refused with Triton's message; so is a body of the wrong
size. Each call is sent every way a gateway reads one: the gevent worker's own loop
(a plain call), gunicorn's parser in the same worker (a query string, a chunked body),
WSGI's ``InferFastPath`` (a gthread gateway), and an async job's submission.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from conch.devtools.redis_server import start_private

from harness import start_gateway, start_worker, wait_model_ready
from integration.serving.test_triton_parity import IDENTITY_MODEL, python_model

HEADER_LENGTH = "Inference-Header-Content-Length"
RAW = {HEADER_LENGTH: "0"}

# One batching FP32 input with a variable dim; two outputs, both of which come back.
SCALE_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "SHAPE" data_type: TYPE_INT64 dims: [ 2 ] }
]
"""

SCALE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("DOUBLED", (x * 2).astype(np.float32)),
                pb_utils.Tensor("SHAPE", np.array([x.shape], np.int64)),
            ]))
        return out
"""

# A BYTES input of one element (Triton's onnx_zero_1_object_1_element): it comes back
# reversed.
BYTES_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

BYTES_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            y = np.array([[x[0, 0][::-1]]], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return out
"""

# Fixed dims and no batching: 16 bytes exactly.
FIXED_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# Two inputs: a raw body cannot say which bytes are which (Triton's onnx_zero_3_float32).
TWO_CONFIG = """
backend: "python"
max_batch_size: 8
input [
  { name: "X" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "Z" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

MODELS = {
    "raw_scale": (SCALE_CONFIG, SCALE_MODEL),
    "raw_bytes": (BYTES_CONFIG, BYTES_MODEL),
    "raw_fixed": (FIXED_CONFIG, IDENTITY_MODEL),
    "raw_two": (TWO_CONFIG, IDENTITY_MODEL),
}

# How a call reaches ``serve_infer``: the gateway it goes to, and how it is sent.
WAYS = ("plain", "query", "chunked", "wsgi")


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[dict[str, str]]:
    """The gevent gateway's URL and a gthread (WSGI) gateway's, over one worker."""
    repo = tmp_path_factory.mktemp("raw-binary") / "models"
    for name, (config, source) in MODELS.items():
        python_model(repo, name, config, source)
    server = start_private()
    worker = start_worker(repo, server.url, log_dir)
    gevent, gevent_url = start_gateway(repo, server.url, log_dir)
    gthread, gthread_url = start_gateway(
        repo, server.url, log_dir, env={"CONCH_HTTP_WORKER_CLASS": "gthread"}
    )
    try:
        for name in MODELS:
            wait_model_ready(gevent_url, name, 120, worker, gevent, gthread)
        yield {"gevent": gevent_url, "gthread": gthread_url}
    finally:
        gthread.stop()
        gevent.stop()
        worker.stop()
        server.stop()


def post(
    gateways: dict[str, str], way: str, model: str, body: bytes, headers: dict[str, str] = RAW
) -> requests.Response:
    """``body`` to ``model``'s infer route, sent ``way`` (one of ``WAYS``)."""
    url = gateways["gthread" if way == "wsgi" else "gevent"]
    target = f"http://{url}/v2/models/{model}/infer"
    data: Any = body
    if way == "query":
        target += "?via=gunicorn"
    elif way == "chunked":
        data = iter([body[: len(body) // 2], body[len(body) // 2 :]])  # Transfer-Encoding
    r = requests.post(target, data=data, headers=headers, timeout=60)
    if way == "chunked":
        assert r.request.headers.get("Transfer-Encoding") == "chunked"
    return r


def split(r: requests.Response) -> tuple[dict[str, Any], bytes]:
    """A binary response's JSON document and the bytes after it."""
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/octet-stream"
    size = int(r.headers[HEADER_LENGTH])
    return json.loads(r.content[:size]), r.content[size:]


@pytest.mark.parametrize("way", WAYS)
def test_the_body_is_the_one_input_and_every_output_comes_back_binary(
    gateways: dict[str, str], way: str
) -> None:
    x = np.arange(8, dtype=np.float32) - 2.5
    r = post(gateways, way, "raw_scale", x.tobytes())
    doc, tail = split(r)
    assert "id" not in doc and doc["model_name"] == "raw_scale"
    assert doc["outputs"] == [
        {
            "name": "DOUBLED",
            "datatype": "FP32",
            "shape": [1, 8],
            "parameters": {"binary_data_size": 32},
        },
        {
            "name": "SHAPE",
            "datatype": "INT64",
            "shape": [1, 2],
            "parameters": {"binary_data_size": 16},
        },
    ]
    assert tail == (x * 2).tobytes() + np.array([1, 8], np.int64).tobytes()
    # What tritonclient makes of the answer.
    result = httpclient.InferenceServerClient.parse_response_body(
        r.content, header_length=int(r.headers[HEADER_LENGTH])
    )
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), (x * 2).reshape(1, 8))
    np.testing.assert_array_equal(result.as_numpy("SHAPE"), [[1, 8]])


@pytest.mark.parametrize("way", ["plain", "wsgi"])
def test_a_longer_body_fills_the_variable_dim(gateways: dict[str, str], way: str) -> None:
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    doc, tail = split(post(gateways, way, "raw_scale", x.tobytes()))
    assert doc["outputs"][0]["shape"] == [1, 32]
    assert tail == (x * 2).tobytes() + np.array([1, 32], np.int64).tobytes()


@pytest.mark.parametrize("way", ["plain", "chunked", "wsgi"])
def test_a_bytes_input_is_the_whole_body_as_one_element(gateways: dict[str, str], way: str) -> None:
    doc, tail = split(post(gateways, way, "raw_bytes", b"427"))
    assert doc["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "BYTES",
            "shape": [1, 1],
            "parameters": {"binary_data_size": 7},
        }
    ]
    assert tail == struct.pack("<I", 3) + b"724"  # BYTES: its length, then the element


@pytest.mark.parametrize("way", WAYS)
def test_a_model_with_fixed_dims_takes_exactly_their_bytes(
    gateways: dict[str, str], way: str
) -> None:
    x = np.array([1.5, -2.0, 3.25, 0.0], np.float32)
    doc, tail = split(post(gateways, way, "raw_fixed", x.tobytes()))
    assert doc["outputs"][0]["shape"] == [4] and tail == x.tobytes()

    r = post(gateways, way, "raw_fixed", np.zeros(5, np.float32).tobytes())
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": "input byte size mismatch for input 'X' for model 'raw_fixed'. Expected 16, got 20"
    }
    # A variable dim's share that is not whole elements is the same error.
    r = post(gateways, way, "raw_scale", b"\x00" * 10)
    assert r.status_code == 400
    assert "input byte size mismatch for input 'INPUT0'" in r.json()["error"]


@pytest.mark.parametrize("way", WAYS)
def test_a_model_with_two_inputs_is_refused_with_tritons_message(
    gateways: dict[str, str], way: str
) -> None:
    r = post(gateways, way, "raw_two", np.arange(16, dtype=np.float32).tobytes())
    assert r.status_code == 400
    assert r.json() == {
        "error": "Raw request must only have 1 input (found 1) to be deduced but got 2 "
        "inputs in 'raw_two' model configuration"
    }


@pytest.mark.parametrize("gateway", ["gevent", "gthread"])
def test_content_encoding_chunked_manually(gateways: dict[str, str], gateway: str) -> None:
    """Triton's L0_http case of that name: a raw body chunk-encoded by hand and posted
    with ``Transfer-Encoding: chunked``, beside the ``Content-Length`` that ``requests``
    adds for bytes. It is read by its chunks, and the connection closes after the
    answer (RFC 9112 section 6.1)."""
    x = np.arange(8, dtype=np.float32)
    raw = x.tobytes()
    body = f"{len(raw):X}\r\n".encode() + raw + b"\r\n0\r\n\r\n"
    r = requests.post(
        f"http://{gateways[gateway]}/v2/models/raw_scale/infer",
        data=body,
        headers={**RAW, "Transfer-Encoding": "chunked"},
        timeout=60,
    )
    assert r.request.headers["Content-Length"] == str(len(body))  # both framings sent
    doc, tail = split(r)
    assert doc["outputs"][0]["shape"] == [1, 8]
    assert tail == (x * 2).tobytes() + np.array([1, 8], np.int64).tobytes()
    assert r.headers["Connection"] == "close"


def test_a_raw_body_over_the_size_limit_is_refused_in_tritons_words(
    gateways: dict[str, str],
) -> None:
    # --http-max-input-size is 64 MiB by default: one byte past it, without reading it.
    r = requests.post(
        f"http://{gateways['gevent']}/v2/models/raw_scale/infer",
        headers={**RAW, "Content-Length": str(64 * 1024 * 1024 + 4)},
        data=b"",
        timeout=60,
    )
    assert r.status_code == 400
    assert "Raw input has a byte_size" in r.json()["error"]
    assert "exceeds the maximum allowed value" in r.json()["error"]


def test_a_json_body_still_works_beside_raw_ones(gateways: dict[str, str]) -> None:
    """The same model over the ordinary form: the header is what makes a body raw."""
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(x)
    client = httpclient.InferenceServerClient(gateways["gevent"], network_timeout=60)
    try:
        result = client.infer("raw_scale", [tensor])
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), x * 2)


def test_an_async_job_takes_a_raw_body_too(gateways: dict[str, str]) -> None:
    url = gateways["gevent"]
    x = np.arange(4, dtype=np.float32)
    r = requests.post(
        f"http://{url}/v2/models/raw_scale/jobs", data=x.tobytes(), headers=RAW, timeout=60
    )
    assert r.status_code == 202, r.text
    got = requests.get(f"http://{url}/v2/jobs/{r.json()['id']}/result?wait=30", timeout=60)
    doc, tail = split(got)
    assert [o["name"] for o in doc["outputs"]] == ["DOUBLED", "SHAPE"]
    assert tail == (x * 2).tobytes() + np.array([1, 4], np.int64).tobytes()


@pytest.mark.parametrize("way", ["plain", "wsgi"])
def test_an_empty_body_with_no_header_is_a_raw_request_of_no_bytes(
    gateways: dict[str, str], way: str
) -> None:
    """Triton's reading: no header means the JSON is the whole body, and a JSON part of 0
    bytes is a raw request; here, of no elements."""
    doc, tail = split(post(gateways, way, "raw_scale", b"", headers={}))
    assert doc["outputs"][0]["shape"] == [1, 0]
    assert tail == np.array([1, 0], np.int64).tobytes()
    r = post(gateways, way, "raw_fixed", b"", headers={})
    assert r.status_code == 400
    assert r.json()["error"].startswith("input byte size mismatch for input 'X'")
