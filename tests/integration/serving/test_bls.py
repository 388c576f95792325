"""Business logic scripting through the real path: Python models calling other models with
``pb_utils.InferenceRequest(...).exec()`` / ``async_exec()``, served by a real worker and
gateway and driven with stock tritonclient.http.

Most tests go through one generic Python model (``caller``, also served as ``pong`` and
``relay``) whose request parameters say what to call and how; it reports what it got
back in its INFO output (JSON), or turns the callee's error into its own.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness import ROOT, start_gateway, start_worker, wait_model_ready
from models import add_model

# -- the models ---------------------------------------------------------------------------

CALLER_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: %d kind: KIND_CPU } ]
"""

# Parameters: target (model), inputs (x | add | x64 | none), outputs ("OUT,TXT"), mode
# (exec | async | async2 | decoupled | ready | load), on_error (report | return | raise),
# bls_timeout (µs), id (the BLS request id), forward (JSON parameters for the callee).
CALLER_MODEL = """
import asyncio
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def describe(arr):
    values = arr.ravel().tolist()
    return {
        "dtype": str(arr.dtype),
        "shape": list(arr.shape),
        "types": sorted({type(v).__name__ for v in values}),
        "values": [v.hex() if isinstance(v, bytes) else v for v in values],
    }


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    async def execute(self, requests):
        return list(await asyncio.gather(*(self.one(r) for r in requests)))

    def build(self, p, x):
        kind = p.get("inputs", "x")
        if kind == "add":
            inputs = [pb_utils.Tensor("A", x), pb_utils.Tensor("B", x + 1)]
        elif kind == "x64":
            inputs = [pb_utils.Tensor("A", x.astype(np.float64)), pb_utils.Tensor("B", x)]
        elif kind == "none":
            inputs = []
        else:
            inputs = [pb_utils.Tensor("X", x)]
        return pb_utils.InferenceRequest(
            model_name=p.get("target", "add"),
            requested_output_names=[o for o in p.get("outputs", "OUT").split(",") if o],
            inputs=inputs,
            request_id=p.get("id", ""),
            timeout=int(p.get("bls_timeout", 0)),
            parameters=json.loads(p.get("forward", "{}")),
        )

    async def one(self, request):
        p = json.loads(request.parameters())
        x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
        mode = p.get("mode", "exec")
        info = {"model": self.name}
        if mode == "ready":
            info["ready"] = {
                n: pb_utils.is_model_ready(*n.split(":")) for n in p["names"].split(",")
            }
            return self.respond(x, info, None)
        if mode == "load":
            pb_utils.load_model("add")
        start = time.monotonic()
        if mode == "async2":
            responses = await asyncio.gather(
                self.build(p, x).async_exec(), self.build(p, x).async_exec()
            )
        elif mode == "async":
            responses = [await self.build(p, x).async_exec()]
        elif mode == "decoupled":
            responses = list(self.build(p, x).exec(decoupled=True))
        else:
            responses = [self.build(p, x).exec()]
        info["elapsed"] = time.monotonic() - start
        info["outputs"], info["errors"] = [], []
        first = None
        for resp in responses:
            if resp.has_error():
                error = resp.error()
                on_error = p.get("on_error", "report")
                if on_error == "return":
                    return pb_utils.InferenceResponse(error=error)
                if on_error == "raise":
                    raise pb_utils.TritonModelException(error.message())
                info["errors"].append({"code": error.code(), "message": error.message()})
                continue
            info["outputs"].append(
                {t.name(): describe(t.as_numpy()) for t in resp.output_tensors()}
            )
            first = first or pb_utils.get_output_tensor_by_name(resp, "OUT")
        return self.respond(x, info, first)

    def respond(self, x, info, out):
        out = out.as_numpy() if out is not None and out.shape() == list(x.shape) else x
        text = np.array([[json.dumps(info).encode()]] * x.shape[0], dtype=object)
        return pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", out.astype(np.float32)), pb_utils.Tensor("INFO", text)]
        )
"""

INNER_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "TXT" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

INNER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x.flat[0] == -7:
                raise RuntimeError("inner_py was asked to raise")
            if x.flat[0] == -1:
                error = pb_utils.TritonError("refusing -1", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            text = np.array([[b"inner\\xff"]] * x.shape[0], dtype=object)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", x * 2), pb_utils.Tensor("TXT", text)]
                )
            )
        return responses
"""

SLEEP_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: %d kind: KIND_CPU } ]
parameters { key: "seconds" value: { string_value: "%s" } }
"""

SLEEP_MODEL = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.seconds = float(config["parameters"]["seconds"]["string_value"])

    def execute(self, requests):
        time.sleep(self.seconds)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""

# Waits up to a second for a batch of 4; reports the request ids each batch held.
BATCH_PROBE_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "IDS" data_type: TYPE_STRING dims: [ 1 ] }
]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1000000 }
"""

BATCH_PROBE_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        ids = json.dumps(sorted(r.request_id() for r in requests)).encode()
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", x),
                        pb_utils.Tensor("IDS", np.array([[ids]] * x.shape[0], dtype=object)),
                    ]
                )
            )
        return responses
"""

# The sentiment pipeline written as BLS: the three step models in turn, or the ensemble.
PIPELINE_CONFIG = """
backend: "python"
max_batch_size: 16
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "SCORE" data_type: TYPE_FP32 dims: [ 1 ] }
]
"""

PIPELINE_MODEL = """
import json

import triton_python_backend_utils as pb_utils


def call(model, outputs, **inputs):
    response = pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=outputs,
        inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
    ).exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return [pb_utils.get_output_tensor_by_name(response, o).as_numpy() for o in outputs]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            if json.loads(request.parameters()).get("via") == "ensemble":
                label, score = call("sentiment", ["LABEL", "SCORE"], TEXT=text)
            else:
                ids, mask = call("preprocessing", ["INPUT_IDS", "ATTENTION_MASK"], TEXT=text)
                (logits,) = call("classifier", ["LOGITS"], INPUT_IDS=ids, ATTENTION_MASK=mask)
                label, score = call("postprocessing", ["LABEL", "SCORE"], LOGITS=logits)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("LABEL", label), pb_utils.Tensor("SCORE", score)]
                )
            )
        return responses
"""

PIPELINE = ("preprocessing", "classifier", "postprocessing", "sentiment")


def _python_model(root: Path, name: str, config: str, model: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(model))


def build_repository(root: Path) -> Path:
    root.mkdir(parents=True)
    for name in PIPELINE:
        shutil.copytree(ROOT / "functions" / name, root / name)
    add_model(root / "add")
    _python_model(root, "caller", CALLER_CONFIG % 1, CALLER_MODEL)
    _python_model(root, "pong", CALLER_CONFIG % 1, CALLER_MODEL)
    _python_model(root, "relay", CALLER_CONFIG % 2, CALLER_MODEL)
    _python_model(root, "inner_py", INNER_CONFIG, INNER_MODEL)
    _python_model(root, "sleepy", SLEEP_CONFIG % (2, "0.5"), SLEEP_MODEL)
    _python_model(root, "slow", SLEEP_CONFIG % (1, "2.0"), SLEEP_MODEL)
    _python_model(root, "batch_probe", BATCH_PROBE_CONFIG, BATCH_PROBE_MODEL)
    _python_model(root, "sentiment_bls", PIPELINE_CONFIG, PIPELINE_MODEL)
    return root


SERVED = (
    "add",
    "caller",
    "pong",
    "relay",
    "inner_py",
    "sleepy",
    "slow",
    "batch_probe",
    "sentiment_bls",
    "preprocessing",
    "classifier",
    "postprocessing",
)

# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("bls") / "models")


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    url = redis_url.rsplit("/", 1)[0] + "/12"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="module")
def url(repo: Path, db: str, log_dir: Path) -> Iterator[str]:
    worker = start_worker(repo, db, log_dir)
    gateway, url = start_gateway(repo, db, log_dir, threads=32)
    try:
        for m in (*SERVED, "sentiment"):
            wait_model_ready(url, m, 90, worker, gateway)
        yield url
    finally:
        gateway.stop()
        worker.stop()


def client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url, network_timeout=30, connection_timeout=30)


def call(url: str, x: np.ndarray | None = None, model: str = "caller", **params: Any) -> Any:
    """The caller's OUT and INFO for a request with these parameters."""
    x = np.arange(4, dtype=np.float32).reshape(1, 4) if x is None else x
    inp = httpclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    timeout = params.pop("client_timeout", None)
    result = client(url).infer(model, [inp], parameters=params or None, timeout=timeout)
    return result.as_numpy("OUT"), json.loads(result.as_numpy("INFO")[0, 0])


def outcome(url: str, **params: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call(url, **params)
    return info.value


# -- calling models -----------------------------------------------------------------------


def test_exec_returns_the_onnx_models_answer(url: str) -> None:
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    out, info = call(url, x, target="add", inputs="add")
    assert info["errors"] == []
    a = httpclient.InferInput("A", [3, 4], "FP32")
    a.set_data_from_numpy(x)
    b = httpclient.InferInput("B", [3, 4], "FP32")
    b.set_data_from_numpy(x + 1)
    direct = client(url).infer("add", [a, b]).as_numpy("OUT")
    np.testing.assert_array_equal(out, direct)
    np.testing.assert_allclose(out, 2 * x + 1, rtol=1e-6)
    assert info["outputs"][0]["OUT"]["dtype"] == "float32"


def test_exec_returns_a_python_models_bytes_as_bytes(url: str) -> None:
    x = np.full((2, 4), 1.5, np.float32)
    out, info = call(url, x, target="inner_py", outputs="OUT,TXT")
    np.testing.assert_array_equal(out, x * 2)
    txt = info["outputs"][0]["TXT"]
    assert txt["dtype"] == "object" and txt["shape"] == [2, 1] and txt["types"] == ["bytes"]
    assert txt["values"] == [b"inner\xff".hex()] * 2


def test_a_bls_pipeline_answers_as_the_ensemble_and_the_models_in_turn(url: str) -> None:
    texts = np.array(
        [[b"I really love this, it is great"], [b"slow and broken, awful"], [b"a table"]],
        dtype=object,
    )

    def infer(model: str, **params: Any) -> tuple[list[bytes], np.ndarray]:
        inp = httpclient.InferInput("TEXT", [3, 1], "BYTES")
        inp.set_data_from_numpy(texts)
        result = client(url).infer(model, [inp], parameters=params or None)
        return result.as_numpy("LABEL").ravel().tolist(), result.as_numpy("SCORE")

    labels, scores = infer("sentiment")
    assert len(set(labels)) == 3  # a real answer: positive, negative and neutral
    for params in ({}, {"via": "ensemble"}):
        got_labels, got_scores = infer("sentiment_bls", **params)
        assert got_labels == labels
        np.testing.assert_array_equal(got_scores, scores)


def test_async_exec_calls_run_concurrently(url: str) -> None:
    call(url, target="sleepy", mode="async")  # both sleepy instances are up
    start = time.monotonic()
    _, info = call(url, target="sleepy", mode="async2")
    elapsed = time.monotonic() - start
    assert info["errors"] == [] and len(info["outputs"]) == 2
    # Two 0.5 s calls on two instances: together, not one after the other.
    assert info["elapsed"] < 0.9, info
    assert elapsed < 0.9, elapsed


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "code", "text"),
    [
        (
            {"target": "no_such_model"},
            3,  # INVALID_ARG
            "Request for unknown model: 'no_such_model' is not found",
        ),
        (
            {"target": "add", "inputs": "x64"},
            3,
            "data-type is 'FP64', but model 'add' expects 'FP32'",
        ),
        ({"target": "add", "inputs": "x"}, 3, "unexpected inference input 'X' for model 'add'"),
        ({"target": "add", "inputs": "add", "outputs": "NOPE"}, 3, "output 'NOPE' for model 'add'"),
        (
            {"target": "inner_py", "x": -7},
            1,  # INTERNAL
            "Failed to process the request(s) for model instance 'inner_py_0', message: "
            "RuntimeError: inner_py was asked to raise",
        ),
        ({"target": "inner_py", "x": -1}, 3, "BLS request to model 'inner_py' failed: refusing -1"),
        (
            {"target": "no_such_model", "mode": "decoupled"},
            3,
            "Request for unknown model: 'no_such_model' is not found",
        ),
    ],
    ids=["unknown-model", "bad-dtype", "bad-input", "bad-output", "raises", "errors", "decoupled"],
)
def test_callee_errors_come_back_as_error_responses(
    url: str, params: dict[str, Any], code: int, text: str
) -> None:
    x = np.full((1, 4), float(params.pop("x", 1.0)), np.float32)
    _, info = call(url, x, **params)
    [error] = info["errors"]
    assert error["code"] == code, error
    assert text in error["message"], error


def test_the_caller_can_answer_with_the_callees_error(url: str) -> None:
    err = outcome(url, target="no_such_model", on_error="return")
    assert err.status() == "400"
    assert "Request for unknown model: 'no_such_model' is not found" in err.message()
    x = np.full((1, 4), -7.0, np.float32)
    with pytest.raises(InferenceServerException) as info:
        call(url, x, target="inner_py", on_error="raise")
    assert info.value.status() == "500"
    message = info.value.message()
    assert message.startswith("Failed to process the request(s) for model instance 'caller_")
    assert (
        "Failed to process the request(s) for model instance 'inner_py_0', message: "
        "RuntimeError: inner_py was asked to raise" in message
    )


def test_model_control_from_a_model_needs_explicit_mode(url: str) -> None:
    # This stack runs with --model-control-mode none; Triton refuses the same way.
    err = outcome(url, mode="load")
    assert err.status() == "500" and "--model-control-mode explicit" in err.message()


def test_is_model_ready_reads_the_workers_registry(url: str) -> None:
    names = "add,add:1,add:2,no_such_model,sentiment,inner_py"
    _, info = call(url, mode="ready", names=names)
    assert info["ready"] == {
        "add": True,
        "add:1": True,
        "add:2": False,
        "no_such_model": False,
        "sentiment": True,
        "inner_py": True,
    }


# -- deadlocks ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_call_to_itself_is_refused_at_once(url: str) -> None:
    start = time.monotonic()
    _, info = call(url, target="caller")
    assert time.monotonic() - start < 1.0
    [error] = info["errors"]
    assert error["code"] == 3
    assert (
        "BLS call from model 'caller' to model 'caller' would wait on itself (caller -> caller)"
        in error["message"]
    )


@pytest.mark.timeout(60)
def test_a_cycle_through_another_model_is_refused_at_once(url: str) -> None:
    # caller -> pong -> caller: pong's call back is refused, and pong answers with it.
    forward = json.dumps({"target": "caller", "on_error": "return"})
    start = time.monotonic()
    _, info = call(url, target="pong", forward=forward)
    assert time.monotonic() - start < 1.0
    [error] = info["errors"]
    assert "from model 'pong' to model 'caller'" in error["message"]
    assert "(caller -> pong -> caller)" in error["message"]


# -- deadlines ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_outer_deadline_bounds_a_bls_call(url: str) -> None:
    start = time.monotonic()
    err = outcome(url, target="slow", client_timeout=300_000)  # slow sleeps 2 s
    assert time.monotonic() - start < 1.0
    assert err.status() == "503" and "Request timeout expired" in err.message()
    # The caller's only instance gave up at the deadline too: it answers at once, long
    # before slow is done.
    _, info = call(url, target="add", inputs="add")
    assert info["errors"] == []
    assert time.monotonic() - start < 1.5


@pytest.mark.timeout(60)
def test_a_bls_timeout_shortens_the_deadline(url: str) -> None:
    start = time.monotonic()
    _, info = call(url, target="slow", bls_timeout=200_000)
    assert time.monotonic() - start < 1.0
    [error] = info["errors"]
    assert error["code"] == 4  # UNAVAILABLE
    assert "Request timeout expired for model 'slow'" in error["message"]


# -- batching -----------------------------------------------------------------------------


def test_bls_calls_are_batched_with_direct_traffic(url: str) -> None:
    barrier = threading.Barrier(4)

    def bls(i: int) -> list[str]:
        barrier.wait()
        # async_exec: relay may get both requests in one execute, and must not call in turn.
        _, info = call(
            url, model="relay", target="batch_probe", outputs="OUT,IDS", id=f"bls-{i}", mode="async"
        )
        [ids] = info["outputs"][0]["IDS"]["values"]
        return json.loads(bytes.fromhex(ids))

    def direct(i: int) -> list[str]:
        inp = httpclient.InferInput("X", [1, 4], "FP32")
        inp.set_data_from_numpy(np.ones((1, 4), np.float32))
        barrier.wait()
        result = client(url).infer("batch_probe", [inp], request_id=f"direct-{i}")
        return json.loads(result.as_numpy("IDS")[0, 0])

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(bls, 0), pool.submit(bls, 1)]
        futures += [pool.submit(direct, 0), pool.submit(direct, 1)]
        batches = [f.result() for f in futures]
    # One execution of batch_probe held the two BLS calls and the two client requests.
    assert batches == [["bls-0", "bls-1", "direct-0", "direct-1"]] * 4
