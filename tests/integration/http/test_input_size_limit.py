"""A body over ``--http-max-input-size`` answers in Triton's words for what is over
(Triton's L0_http http_input_size_limit_test, issue 40): a JSON document, whole or the
JSON part of a body with binary tensors ("request JSON size of ..."), on the infer and
generate routes alike; a compressed body that inflates past it ("Decompressed data size
..."); a body whose binary tensors alone are over, in the same form. The limit here is
1 MiB, so the bodies stay small."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from conch.devtools.redis_server import start_private

from harness import start_gateway, start_worker, wait_model_ready
from integration.serving.test_triton_parity import IDENTITY_CONFIG, IDENTITY_MODEL, python_model

LIMIT = 1 << 20
RAISE_IT = "Use --http-max-input-size to increase the limit."


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("size-limit") / "models"
    python_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_MODEL)
    server = start_private()
    worker = start_worker(repo, server.url, log_dir)
    gateway, url = start_gateway(repo, server.url, log_dir, "--http-max-input-size", str(LIMIT))
    try:
        wait_model_ready(url, "identity", 120, worker, gateway)
        yield url
    finally:
        gateway.stop()
        worker.stop()
        server.stop()


def json_body(elements: int) -> bytes:
    doc = {
        "inputs": [{"name": "X", "shape": [elements], "datatype": "FP32", "data": [1.0] * elements}]
    }
    return json.dumps(doc).encode()


def refused(r: requests.Response) -> str:
    assert r.status_code == 400, r.text
    return r.json()["error"]


@pytest.mark.parametrize("route", ["infer", "generate"])
@pytest.mark.parametrize("sent", ["sized", "chunked"])
def test_a_json_body_over_the_limit(url: str, route: str, sent: str) -> None:
    """http_input_size_limit_test's test_default_limit_json and
    test_json_dtype_size_expansion_exceeds_limit_error (a generate call): checked before
    the body is read when its size is given, after when it comes in chunks (an infer
    call reads no more than one byte past the limit, so that is the size it can name)."""
    body = json_body(LIMIT // 4)
    data = body if sent == "sized" else iter([body[: len(body) // 2], body[len(body) // 2 :]])
    r = requests.post(
        f"http://{url}/v2/models/identity/{route}",
        data=data,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    read = LIMIT + 1 if (route, sent) == ("infer", "chunked") else len(body)
    assert refused(r) == (
        f"request JSON size of {read} bytes exceeds the maximum allowed input size of "
        f"{LIMIT} bytes. {RAISE_IT}"
    )


def test_a_compressed_body_that_inflates_past_the_limit(url: str) -> None:
    """test_default_limit_compressed: the limit bounds what the body inflates to."""
    body = json_body(LIMIT // 4)
    packed = gzip.compress(body)
    assert len(packed) < LIMIT < len(body)
    r = requests.post(
        f"http://{url}/v2/models/identity/infer",
        data=packed,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        timeout=60,
    )
    assert refused(r) == (
        f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. {RAISE_IT}"
    )


def test_binary_tensors_over_the_limit_beside_a_small_json_part(url: str) -> None:
    header = b'{"inputs":[{"name":"X","shape":[262400],"datatype":"FP32","parameters":{"binary_data_size":1049600}}]}'
    body = header + b"\0" * 1049600
    r = requests.post(
        f"http://{url}/v2/models/identity/infer",
        data=body,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=60,
    )
    assert refused(r) == (
        f"request body of {len(body)} bytes exceeds the maximum allowed input size of "
        f"{LIMIT} bytes. {RAISE_IT}"
    )
