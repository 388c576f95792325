"""The openvino backend through the real path: IRs converted here from ONNX files, an ONNX
file read by OpenVINO, and an ONNX model on onnxruntime with the "openvino" CPU
accelerator, served by a worker and asked over HTTP and gRPC with stock tritonclient,
concurrently, as async jobs and as a batch job, each compared with what openvino and
onnxruntime answer in this process. The configs of Triton's OpenVINO README and tests
load as written; a broken model file leaves the others serving."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness import fresh_db, start_gateway, start_grpc, start_worker, wait_model_ready
from integration.jobs.test_jobs import result, submit, wait_done
from integration.jobs.test_offline import batch_job_outputs
from unit._onnx_models import mlp

pytest.importorskip("openvino")
import openvino_models as om

LATENCY = """parameters: [
{
   key: "NUM_STREAMS"
   value: {
     string_value: "1"
   }
},
{
   key: "PERFORMANCE_HINT"
   value: {
     string_value: "LATENCY"
   }
}
]
"""
THROUGHPUT = """instance_group [
    {
      count: 12
      kind: KIND_CPU
    }
  ]
parameters: [
{
   key: "NUM_STREAMS"
   value: {
     string_value: "12"
   }
}
]
"""
RESHAPE = """input [
  {
    name: "input"
    data_type: TYPE_FP32
    dims: [ -1, 3, -1, -1]
  }
]
output [
  {
    name: "output"
    data_type: TYPE_FP32
    dims: [ -1, 1001]
  }
]
parameters: {
key: "RESHAPE_IO_LAYERS"
value: {
string_value:"yes"
}
}
"""
BATCHED = 'backend: "openvino"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n'
ACCELERATED = (
    'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    "dynamic_batching { max_queue_delay_microseconds: 20000 }\n"
    "optimization { execution_accelerators { cpu_execution_accelerator: "
    '[ { name: "openvino" } ] } }\n'
)
MLP_MODELS = ("ov_ir", "ov_onnx", "ort_openvino", "ort_plain")


def _write(root: Path, name: str, config: str) -> None:
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("openvino") / "models"
    om.mlp_ir(root / "ov_ir" / "1")
    _write(
        root,
        "ov_ir",
        BATCHED + 'parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "2" } }\n',
    )
    mlp(root / "ov_onnx" / "1" / "model.onnx")
    _write(root, "ov_onnx", BATCHED + 'default_model_filename: "model.onnx"\n')
    mlp(root / "ort_openvino" / "1" / "model.onnx")
    _write(root, "ort_openvino", ACCELERATED)
    mlp(root / "ort_plain" / "1" / "model.onnx")
    _write(root, "ort_plain", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n')
    # Triton's README sections and its tests' configs, as written.
    om.mlp_ir(root / "readme_latency" / "1")
    _write(root, "readme_latency", 'backend: "openvino"\n' + LATENCY)
    om.mlp_ir(root / "readme_throughput" / "1")
    _write(root, "readme_throughput", 'backend: "openvino"\n' + THROUGHPUT)
    om.ir_from_onnx(
        om.pooled(root / "readme_reshape" / "src.onnx"), root / "readme_reshape" / "1" / "model.xml"
    )
    _write(root, "readme_reshape", 'backend: "openvino"\n' + RESHAPE)
    om.mlp_ir(root / "tests_ir" / "1")
    _write(root, "tests_ir", LATENCY)  # openvino_backend tests/configs/ir.pbtxt: no backend line
    broken = root / "ov_broken" / "1" / "model.xml"
    broken.parent.mkdir(parents=True)
    broken.write_text("<net>not an IR")
    _write(root, "ov_broken", 'backend: "openvino"\nmax_batch_size: 4\n')
    om.mlp_ir(root / "ov_bad_param" / "1")
    _write(
        root,
        "ov_bad_param",
        'backend: "openvino"\nparameters { key: "NUM_STREAMS" value: { string_value: "many" } }\n',
    )
    return root


@pytest.fixture(scope="module")
def stack(repo: Path, redis_url: str, log_dir: Path, s3_endpoint: str) -> Iterator[tuple[str, str]]:
    """(HTTP URL, gRPC URL) of a gateway, a gRPC server and a worker serving ``repo``."""
    db = fresh_db(redis_url, 13)
    worker = start_worker(repo, db, log_dir, env={"AWS_ENDPOINT_URL": s3_endpoint})
    gateway, url = start_gateway(repo, db, log_dir)
    grpc, grpc_url = start_grpc(repo, db, log_dir)
    try:
        for name in (
            *MLP_MODELS,
            "readme_latency",
            "readme_throughput",
            "readme_reshape",
            "tests_ir",
        ):
            wait_model_ready(url, name, 180, worker, gateway)
        yield url, grpc_url
    finally:
        grpc.stop()
        gateway.stop()
        worker.stop()


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def http_infer(url: str, model: str, x: np.ndarray, name: str = "x", out: str = "y") -> np.ndarray:
    inp = httpclient.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return httpclient.InferenceServerClient(url).infer(model, [inp]).as_numpy(out)


def grpc_infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp]).as_numpy("y")
    finally:
        client.close()


def expected(repo: Path, x: np.ndarray) -> np.ndarray:
    """What onnxruntime answers in this process for the MLP every MLP model serves."""
    return om.onnxruntime_answers(repo / "ov_onnx" / "1" / "model.onnx", x)


@pytest.mark.parametrize("model", MLP_MODELS)
def test_each_model_answers_as_openvino_and_onnxruntime_over_http_and_grpc(
    stack, repo, model
) -> None:
    url, grpc_url = stack
    x = rows(6)
    in_process = om.openvino_answers(repo / "ov_ir" / "1" / "model.xml", x)
    np.testing.assert_allclose(in_process, expected(repo, x), rtol=1e-5, atol=1e-5)
    for got in (http_infer(url, model, x), grpc_infer(grpc_url, model, x)):
        assert got.dtype == np.float32 and got.shape == (6, 3)
        np.testing.assert_allclose(got, in_process, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, expected(repo, x), rtol=1e-5, atol=1e-5)


def test_the_configs_are_completed_as_triton_completes_them(stack) -> None:
    url, _ = stack
    client = httpclient.InferenceServerClient(url)
    ir = client.get_model_config("ov_ir")
    assert ir["backend"] == "openvino" and ir["max_batch_size"] == 8
    assert ir["default_model_filename"] == "model.xml"
    assert [(i["name"], i["dims"]) for i in ir["input"]] == [("x", [4])]
    latency = client.get_model_config("tests_ir")
    assert latency["backend"] == "openvino" and latency["max_batch_size"] == 0
    assert latency["input"][0]["dims"] == [-1, 4]
    accel = client.get_model_config("ort_openvino")
    names = accel["optimization"]["execution_accelerators"]["cpu_execution_accelerator"]
    assert [a["name"] for a in names] == ["openvino"]


def test_concurrent_requests_are_batched_and_each_gets_its_rows(stack, repo) -> None:
    url, _ = stack
    client = httpclient.InferenceServerClient(url)
    for model in ("ov_ir", "ort_openvino"):
        before = client.get_inference_statistics(model)["model_stats"][0]
        burst = [rows(1 + i % 3, seed=100 + i) for i in range(40)]
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda x, m=model: http_infer(url, m, x), burst))
        for x, y in zip(burst, got, strict=True):
            np.testing.assert_allclose(y, expected(repo, x), rtol=1e-5, atol=1e-5)
        after = client.get_inference_statistics(model)["model_stats"][0]
        sent = sum(len(x) for x in burst)
        assert after["inference_count"] - before["inference_count"] == sent
        assert after["execution_count"] - before["execution_count"] < len(burst)


def test_the_readme_configs_load_unchanged_and_answer(stack, repo) -> None:
    url, _ = stack
    x = rows(3, seed=9)
    for model in ("readme_latency", "readme_throughput", "tests_ir"):
        np.testing.assert_allclose(
            http_infer(url, model, x), expected(repo, x), rtol=1e-5, atol=1e-5
        )
    config = httpclient.InferenceServerClient(url).get_model_config("readme_throughput")
    assert config["instance_group"][0]["count"] == 12


def test_reshape_io_layers_takes_any_batch_and_image_size(stack, repo) -> None:
    """The README's dynamic-shape example: a model fixed at [1, 3, 8, 8] answers any
    batch and resolution once RESHAPE_IO_LAYERS opens its dims."""
    url, _ = stack
    src = repo / "readme_reshape" / "src.onnx"
    for shape in ((1, 3, 8, 8), (2, 3, 5, 7), (3, 3, 16, 4)):
        x = np.random.default_rng(shape[2]).standard_normal(shape).astype(np.float32)
        got = http_infer(url, "readme_reshape", x, name="input", out="output")
        assert got.shape == (shape[0], 1001)
        np.testing.assert_allclose(got, om.pooled_reference(src, x), rtol=1e-4, atol=1e-4)


def test_a_wrong_shape_is_a_400(stack) -> None:
    url, _ = stack
    with pytest.raises(InferenceServerException) as exc:
        http_infer(url, "ov_ir", np.zeros((2, 5), np.float32))
    assert exc.value.status() == "400" and "x" in str(exc.value)


def test_a_broken_file_or_parameter_is_unavailable_with_the_reason(stack, repo) -> None:
    url, _ = stack
    client = httpclient.InferenceServerClient(url)
    row = {m["name"]: m for m in client.get_model_repository_index()}["ov_broken"]
    assert row["state"] == "UNAVAILABLE"
    assert "OpenVINO cannot read" in row["reason"] and "model.xml" in row["reason"], row
    assert not client.is_model_ready("ov_broken")
    row = {m["name"]: m for m in client.get_model_repository_index()}["ov_bad_param"]
    assert row["state"] == "UNAVAILABLE"
    assert "'NUM_STREAMS' must be AUTO, NUMA or a number, got 'many'" in row["reason"], row
    x = rows(2)
    np.testing.assert_allclose(http_infer(url, "ov_ir", x), expected(repo, x), rtol=1e-5, atol=1e-5)


def test_an_async_job_answers_what_infer_answers(stack, repo) -> None:
    url, _ = stack
    x = rows(5, seed=3)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    for model in ("ov_ir", "ort_openvino"):
        job = submit(url, model, [inp])
        status = wait_done(url, job, timeout=60)
        assert status["status"] == "SUCCESS", status
        got = result(url, job).as_numpy("y")
        np.testing.assert_allclose(got, expected(repo, x), rtol=1e-5, atol=1e-5)


def test_a_batch_job_answers_every_line(stack, repo, s3) -> None:
    url, _ = stack
    asks = [rows(1 + i % 4, seed=200 + i) for i in range(30)]
    answers = batch_job_outputs(url, s3, "ov_ir", "x", asks)
    for x, got in zip(asks, answers, strict=True):
        np.testing.assert_allclose(got, expected(repo, x), rtol=1e-5, atol=1e-5)
