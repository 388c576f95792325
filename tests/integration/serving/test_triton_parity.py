"""Triton behaviours users rely on, through the real path (issue 13, point 5).

A private redis-server, a worker and a gateway serve a repository built here; stock
tritonclient and plain HTTP drive them. Each test names the Triton behaviour it holds:
a dynamic batcher's queue delay longer than redis-py's 5 s read timeout, ``to_dlpack`` on
a request's (read-only) input, a request with no inputs to a model whose inputs are all
optional, ``nv_inference_request_failure`` by reason, model names with commas, the
extensions ``GET /v2`` lists, and a worker serving more instances than redis-py's pool
holds connections (with ``conch serve``).
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.devtools.redis_server import free_port, start_private

from harness import Service, conch, start_gateway, start_worker, wait_model_ready, wait_until
from models import add_model

# -- the models -------------------------------------------------------------------------

IDENTITY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""

# Both inputs optional: N is how many the request gave, SUM what they add up to.
OPTIONAL_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "B" data_type: TYPE_FP32 dims: [ 1 ] optional: true }
]
output [
  { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }
]
"""

OPTIONAL_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            given = [t.as_numpy() for t in r.inputs()]
            total = sum((g for g in given), np.zeros(1, np.float32))
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("N", np.array([len(given)], np.int32)),
                pb_utils.Tensor("SUM", total.astype(np.float32)),
            ]))
        return out
"""

# The input goes to torch through DLPack and is changed there: Y shows the change only
# if torch shares the tensor's memory, as it does under Triton.
DLPACK_MODEL = """
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X")
            shared = torch.utils.dlpack.from_dlpack(x.to_dlpack())
            shared.mul_(2)
            y = pb_utils.Tensor.from_dlpack("Y", torch.utils.dlpack.to_dlpack(shared + 1))
            out.append(pb_utils.InferenceResponse([y, pb_utils.Tensor("X2", x.as_numpy())]))
        return out
"""
DLPACK_CONFIG = IDENTITY_CONFIG.replace(
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]',
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }, '
    '{ name: "X2" data_type: TYPE_FP32 dims: [ -1 ] } ]',
)

FAILING_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(error=pb_utils.TritonError("the model says no"))
            for _ in requests
        ]
"""

# Triton's L0_backend_python lifecycle "wrong_model": execute itself raises.
RAISING_MODEL = """
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("this model is wrong")
"""

# One instance that takes ``SECONDS`` a request: what waits behind it waits that long.
SLOW_MODEL = """
import time

import triton_python_backend_utils as pb_utils

SECONDS = {seconds}


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(SECONDS)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""
ONE_INSTANCE = "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
# Rejected after 1 s in the queue (Triton's REJECT), behind a 2.5 s request.
REJECTING_CONFIG = (
    IDENTITY_CONFIG.replace("max_batch_size: 0", "max_batch_size: 1").replace("-1 ]", "1 ]")
    + ONE_INSTANCE
    + "dynamic_batching { default_queue_policy { timeout_action: REJECT "
    "default_timeout_microseconds: 1000000 } }\n"
)
# One request waiting at most (Triton's max_queue_size), behind a 1.5 s one.
BOUNDED_CONFIG = (
    IDENTITY_CONFIG.replace("max_batch_size: 0", "max_batch_size: 1").replace("-1 ]", "1 ]")
    + ONE_INSTANCE
    + "dynamic_batching { default_queue_policy { max_queue_size: 1 } }\n"
)

ENSEMBLE_OF_FAILING = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ {
  model_name: "failing" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" }
} ] }
"""

# Triton's own BF16 example (L0_backend_python's bf16 test): as_numpy must refuse a BF16
# tensor with Triton's words; torch takes it, and gives it back, through DLPack.
BF16_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_BF16 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_BF16 dims: [ -1 ] } ]
"""

BF16_MODEL = """
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


def refuses_numpy(tensor):
    try:
        tensor.as_numpy()
    except pb_utils.TritonModelException as e:
        return "tensor dtype is bf16 and cannot be converted to numpy" in str(e).lower()
    return False


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            doubled = torch.utils.dlpack.from_dlpack(x.to_dlpack()) * 2
            y = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(doubled))
            if not (refuses_numpy(x) and refuses_numpy(y)):
                raise RuntimeError("as_numpy() gave a BF16 tensor's array")
            out.append(pb_utils.InferenceResponse([y]))
        return out
"""

# The delay Triton waits out for a fuller batch, past redis-py 8's 5 s read timeout.
LONG_DELAY_S = 6.5
COMMA_NAME = "a,b"
WIDE_NAME = "modèle x"  # a space and a letter outside ASCII: Triton serves it too

MODELS = (
    "optional_inputs",
    "dlpack",
    COMMA_NAME,
    WIDE_NAME,
    "patient",
    "failing",
    "failing_ensemble",
    "rejecting",
    "bounded",
    "busy",
    "bf16",
    "raising",
)


def python_model(root: Path, name: str, config: str, source: str) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(config))
    (folder / "1" / "model.py").write_text(textwrap.dedent(source))


def build_repository(root: Path) -> Path:
    python_model(root, "optional_inputs", OPTIONAL_CONFIG, OPTIONAL_MODEL)
    python_model(root, "dlpack", DLPACK_CONFIG, DLPACK_MODEL)
    python_model(root, COMMA_NAME, IDENTITY_CONFIG, IDENTITY_MODEL)
    python_model(root, WIDE_NAME, IDENTITY_CONFIG, IDENTITY_MODEL)
    add_model(root / "patient", max_batch_size=8, delay_us=int(LONG_DELAY_S * 1e6))
    python_model(root, "failing", IDENTITY_CONFIG, FAILING_MODEL)
    (root / "failing_ensemble" / "1").mkdir(parents=True)
    (root / "failing_ensemble" / "config.pbtxt").write_text(ENSEMBLE_OF_FAILING)
    python_model(root, "rejecting", REJECTING_CONFIG, SLOW_MODEL.format(seconds=2.5))
    python_model(root, "bounded", BOUNDED_CONFIG, SLOW_MODEL.format(seconds=1.5))
    python_model(root, "busy", IDENTITY_CONFIG + ONE_INSTANCE, SLOW_MODEL.format(seconds=2))
    python_model(root, "bf16", BF16_CONFIG, BF16_MODEL)
    python_model(root, "raising", IDENTITY_CONFIG, RAISING_MODEL)
    return root


# -- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[tuple[str, str]]:
    """(gateway URL, metrics host:port) over a Redis of this module's own."""
    repo = build_repository(tmp_path_factory.mktemp("parity") / "models")
    server = start_private()
    worker = start_worker(repo, server.url, log_dir)
    gateway, url = start_gateway(repo, server.url, log_dir)
    try:
        for m in MODELS:
            wait_model_ready(url, m, 120, worker, gateway)
        yield url, gateway.metrics_url
    finally:
        gateway.stop()
        worker.stop()
        server.stop()


@pytest.fixture(scope="module")
def url(stack: tuple[str, str]) -> str:
    return stack[0]


def client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url, network_timeout=60)


def fp32(name: str, array: np.ndarray) -> httpclient.InferInput:
    i = httpclient.InferInput(name, list(array.shape), "FP32")
    i.set_data_from_numpy(array)
    return i


def failures(metrics: str, model: str) -> dict[str, int]:
    """``nv_inference_request_failure`` of ``model`` version 1, by reason."""
    text = requests.get(f"http://{metrics}/metrics", timeout=10).text
    pattern = rf'^nv_inference_request_failure\{{model="{re.escape(model)}",reason="(\w+)",version="1"\}} (\d+)$'
    return {m.group(1): int(m.group(2)) for m in re.finditer(pattern, text, re.M)}


# -- the tests --------------------------------------------------------------------------


def test_a_queue_delay_longer_than_redis_pys_read_timeout_is_waited_out(url: str) -> None:
    """max_queue_delay_microseconds of 6.5 s: the batcher blocks on Redis that long (past
    redis-py 8's default 5 s socket timeout) and then runs the batch it holds."""
    a = np.ones((1, 4), np.float32)
    started = time.monotonic()
    result = client(url).infer("patient", [fp32("A", a), fp32("B", a)])
    took = time.monotonic() - started
    np.testing.assert_array_equal(result.as_numpy("OUT"), 2 * a)
    assert LONG_DELAY_S - 0.3 <= took < LONG_DELAY_S + 10, took


def test_a_python_models_bf16_tensors_are_tritons(url: str) -> None:
    import ml_dtypes

    x = np.array([1.0, -2.5, 3.0e5], dtype=ml_dtypes.bfloat16)
    tensor = httpclient.InferInput("INPUT0", [3], "BF16")
    tensor.set_data_from_numpy(x)
    result = client(url).infer("bf16", [tensor])
    assert result.get_output("OUTPUT0")["datatype"] == "BF16"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)


def test_a_python_model_that_raises_fails_as_in_triton(url: str, stack: tuple[str, str]) -> None:
    """L0_backend_python's test_infer_pymodel_error: the failure series is there (at 0)
    before any request, the error says Triton's words, and BACKEND counts it."""
    metrics = stack[1]
    assert failures(metrics, "raising") == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    with pytest.raises(InferenceServerException) as err:
        client(url).infer("raising", [fp32("X", np.ones(1, np.float32))])
    assert err.value.message().startswith("Failed to process the request(s) for model ")
    assert "this model is wrong" in err.value.message()
    wait_until(lambda: failures(metrics, "raising").get("BACKEND") == 1, 20, "BACKEND counted once")


def test_to_dlpack_on_a_request_input_shares_its_memory(url: str) -> None:
    x = np.array([1.0, 2.0, 3.0], np.float32)
    result = client(url).infer("dlpack", [fp32("X", x)])
    np.testing.assert_array_equal(result.as_numpy("Y"), 2 * x + 1)
    np.testing.assert_array_equal(result.as_numpy("X2"), 2 * x)  # changed in place, by torch


def test_a_request_with_no_inputs_when_every_input_is_optional(url: str) -> None:
    c = client(url)
    none = c.infer("optional_inputs", [])
    assert none.as_numpy("N").tolist() == [0] and none.as_numpy("SUM").tolist() == [0.0]
    one = c.infer("optional_inputs", [fp32("B", np.array([2.5], np.float32))])
    assert one.as_numpy("N").tolist() == [1] and one.as_numpy("SUM").tolist() == [2.5]
    # Plain JSON too; "inputs" itself must be there, as Triton says.
    r = requests.post(f"http://{url}/v2/models/optional_inputs/infer", json={"inputs": []})
    assert r.status_code == 200, r.text
    assert {o["name"]: o["data"] for o in r.json()["outputs"]} == {"N": [0], "SUM": [0.0]}
    r = requests.post(f"http://{url}/v2/models/optional_inputs/infer", json={"id": "7"})
    assert r.status_code == 400 and "Unable to parse 'inputs'" in r.json()["error"]
    # A model with a required input still wants it.
    with pytest.raises(InferenceServerException, match="expected 1 inputs but got 0 inputs"):
        c.infer("failing", [])


@pytest.mark.parametrize("name", [COMMA_NAME, WIDE_NAME])
def test_model_names_with_commas_spaces_and_letters_are_served(url: str, name: str) -> None:
    c = client(url)
    assert c.is_model_ready(name)
    assert c.get_model_metadata(name)["name"] == name
    assert name in [m["name"] for m in c.get_model_repository_index()]
    x = np.array([4.0, 5.0], np.float32)
    np.testing.assert_array_equal(c.infer(name, [fp32("X", x)]).as_numpy("Y"), x)
    stats = c.get_inference_statistics(name)["model_stats"][0]
    assert stats["name"] == name and stats["inference_stats"]["success"]["count"] >= 1


def test_server_metadata_lists_the_model_repository_extensions(url: str) -> None:
    extensions = requests.get(f"http://{url}/v2", timeout=10).json()["extensions"]
    assert "model_repository" in extensions
    assert "model_repository(unload_dependents)" in extensions
    assert extensions.index("classification") == 0  # Triton's order


def test_failures_are_counted_by_tritons_reasons(url: str, stack: tuple[str, str]) -> None:
    metrics = stack[1]
    c = httpclient.InferenceServerClient(url, network_timeout=60, concurrency=4)
    x = np.array([1.0], np.float32)

    # BACKEND: the model answers each request with an error.
    for _ in range(2):
        with pytest.raises(InferenceServerException, match="the model says no"):
            c.infer("failing", [fp32("X", x)])
    # OTHER: an ensemble whose step failed (the step counts BACKEND once more).
    with pytest.raises(InferenceServerException, match="the model says no"):
        c.infer("failing_ensemble", [fp32("X", x)])

    # REJECTED: requests wait past the queue policy's 1 s behind a 2.5 s one: two of
    # three, or all three should the first wait over 1 s for its turn on a busy host.
    xb = np.array([[1.0]], np.float32)
    pending = [c.async_infer("rejecting", [fp32("X", xb)]) for _ in range(3)]
    outcomes = []
    for p in pending:
        try:
            p.get_result()
            outcomes.append("ok")
        except InferenceServerException as exc:
            assert "Request timeout expired" in str(exc)
            outcomes.append("rejected")
    rejected = outcomes.count("rejected")
    assert rejected >= 2, outcomes

    # REJECTED too: the queue is full (one waits while one runs); Triton's core does not
    # count these, conch does.
    first = c.async_infer("bounded", [fp32("X", xb)])
    time.sleep(0.4)  # taken by the worker: the queue is empty again
    queued = [c.async_infer("bounded", [fp32("X", xb)]) for _ in range(3)]
    full = 0
    for p in [first, *queued]:
        try:
            p.get_result()
        except InferenceServerException as exc:
            assert "Exceeds maximum queue size" in str(exc) and exc.status() == "503"
            full += 1
    assert full >= 2, full

    # CANCELED: an async job cancelled while it waits behind a 2 s request.
    running = c.async_infer("busy", [fp32("X", x)])
    time.sleep(0.3)
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    job = requests.post(f"http://{url}/v2/models/busy/jobs", json=body, timeout=10).json()["id"]
    assert requests.delete(f"http://{url}/v2/jobs/{job}", timeout=10).status_code == 200
    running.get_result()

    expected = {
        "failing": {"REJECTED": 0, "CANCELED": 0, "BACKEND": 3, "OTHER": 0},
        "failing_ensemble": {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 1},
        "rejecting": {"REJECTED": rejected, "CANCELED": 0, "BACKEND": 0, "OTHER": 0},
        "bounded": {"REJECTED": full, "CANCELED": 0, "BACKEND": 0, "OTHER": 0},
        "busy": {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0},
    }
    wait_until(
        lambda: {m: failures(metrics, m) for m in expected} == expected,
        20,
        f"failure counts {expected}",
    )
    # Every model has the four series, zero or not; the statistics extension's fail
    # count is their sum.
    assert failures(metrics, "dlpack") == dict.fromkeys(
        ("REJECTED", "CANCELED", "BACKEND", "OTHER"), 0
    )
    for model, by_reason in expected.items():
        fail = c.get_inference_statistics(model)["model_stats"][0]["inference_stats"]["fail"]
        assert fail["count"] == sum(by_reason.values()), model


# -- a worker serving more instances than redis-py's pool has connections ------------


MANY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 120 kind: KIND_CPU } ]
"""

# Each instance answers with its own name, after a pause that keeps it busy meanwhile.
MANY_MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"].encode()

    def execute(self, requests):
        time.sleep(1.5)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("INSTANCE", np.array([self.name], dtype=np.object_))]
            )
            for _ in requests
        ]
"""


def test_conch_serve_runs_a_model_with_more_instances_than_a_redis_pool_holds(
    tmp_path: Path, log_dir: Path
) -> None:
    """120 instances, each a batcher with its own Redis links, all busy at once; the
    worker also serves a model whose name holds a comma, named in ``--models``."""
    repo = tmp_path / "models"
    python_model(repo, "many", MANY_CONFIG, MANY_MODEL)
    python_model(repo, COMMA_NAME, IDENTITY_CONFIG, IDENTITY_MODEL)
    python_model(repo, "left_out", IDENTITY_CONFIG, IDENTITY_MODEL)
    server = start_private()
    port = free_port()
    serve = Service(
        "serve",
        conch(
            "serve",
            *("--model-repository", str(repo), "--redis-url", server.url),
            *("--http-address", "127.0.0.1", "--http-port", str(port)),
            *("--metrics-port", str(free_port()), "--http-thread-count", "512"),
            *("--models", "many,a\\,b"),
            "--allow-grpc=false",
        ),
        log_dir,
    )
    url = f"127.0.0.1:{port}"
    try:
        for m in ("many", COMMA_NAME):
            wait_model_ready(url, m, 180, serve)
        c = httpclient.InferenceServerClient(url, network_timeout=120, concurrency=240)
        assert not c.is_model_ready("left_out")  # not in --models: no worker serves it
        x = fp32("X", np.array([1.0], np.float32))
        pending = [c.async_infer("many", [x]) for _ in range(240)]
        names = {p.get_result().as_numpy("INSTANCE")[0] for p in pending}
        assert len(names) > 100, f"only {len(names)} instances answered"
        np.testing.assert_array_equal(c.infer(COMMA_NAME, [x]).as_numpy("Y"), [1.0])
        assert serve.alive(), serve.log()[-4000:]
        assert "MaxConnectionsError" not in serve.log()
    finally:
        serve.stop()
        server.stop()
