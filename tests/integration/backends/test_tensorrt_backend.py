"""The tensorrt backend.

Without TensorRT or a GPU (the usual CI machine): the backend reports the reason, the
config checks run against a described engine, and a served ``tensorrt_plan`` model is
unavailable with the reason. With both: an engine is built from an ONNX model at test
time (``trt.Builder`` + ``OnnxParser``, a dynamic batch profile), served through the real
path and compared with onnxruntime.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from conch.backends import BackendRequest, InstanceSpec, backend_class
from conch.backends import tensorrt as trt_backend
from conch.backends.completion import complete
from conch.backends.tensorrt import EngineTensor, TensorRTBackend, check_and_fill, trt_available
from conch.core.backend_table import BACKENDS
from conch.core.errors import InvalidArgument, ModelLoadError
from conch.core.model_config import new_config, parse_config
from conch.core.repository import ModelRepository

from harness import start_gateway, start_worker, wait_model_ready, wait_until

TRT_OK, TRT_REASON = trt_available()
needs_trt = pytest.mark.skipif(not TRT_OK, reason=f"TensorRT cannot run here: {TRT_REASON}")

WIDTH_IN, WIDTH_OUT, MAX_BATCH = 16, 8, 8

# ------------------------------------------------------------------ models


def onnx_mlp(path: Path) -> Path:
    """y = relu(x @ W1 + b1) @ W2 + b2, x (batch, 16) -> y (batch, 8), fixed-seed weights."""
    rng = np.random.default_rng(4321)
    w1 = rng.standard_normal((WIDTH_IN, 32)).astype(np.float32) * 0.25
    b1 = rng.standard_normal(32).astype(np.float32) * 0.1
    w2 = rng.standard_normal((32, WIDTH_OUT)).astype(np.float32) * 0.25
    b2 = rng.standard_normal(WIDTH_OUT).astype(np.float32) * 0.1
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h0"]),
            helper.make_node("Add", ["h0", "b1"], ["h1"]),
            helper.make_node("Relu", ["h1"], ["h"]),
            helper.make_node("MatMul", ["h", "W2"], ["y0"]),
            helper.make_node("Add", ["y0", "b2"], ["y"]),
        ],
        "trt_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH_IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH_OUT])],
        initializer=[
            numpy_helper.from_array(w1, "W1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "W2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def build_engine(onnx_path: Path, plan_path: Path) -> Path:
    """A TensorRT engine for ``onnx_path`` with batch 1..8 (optimal 4), FP32 without TF32."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: always explicit batch
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise AssertionError(f"TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 28)
    config.clear_flag(trt.BuilderFlag.TF32)  # exact FP32, to compare with onnxruntime
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, WIDTH_IN), (4, WIDTH_IN), (MAX_BATCH, WIDTH_IN))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None, "TensorRT failed to build the engine"
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_bytes(bytes(plan))
    return plan_path


def ort_reference(onnx_path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


TRT_CONFIG = f"""
platform: "tensorrt_plan"
max_batch_size: {MAX_BATCH}
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {WIDTH_IN} ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {WIDTH_OUT} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
"""


# ------------------------------------------------------------------ registry and reasons


def test_registry_points_here():
    assert backend_class("tensorrt") is TensorRTBackend
    entry = BACKENDS["tensorrt"]
    assert entry.platforms == ("tensorrt_plan",)
    assert entry.default_filename == "model.plan"


@pytest.fixture()
def no_tensorrt(monkeypatch):
    """``import tensorrt`` fails, as on a machine without conch[gpu]."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)


def test_reason_when_tensorrt_is_not_importable(no_tensorrt):
    ok, reason = trt_available()
    assert not ok
    assert reason.startswith("the tensorrt package cannot be imported (ModuleNotFoundError: ")


def test_reason_when_tensorrt_is_too_old(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="8.6.1"))
    ok, reason = trt_available()
    assert not ok
    assert reason == "TensorRT 8.6.1 is installed; conch needs TensorRT 10 or later"


def _plan_repo(tmp_path: Path, config: str | None = TRT_CONFIG, name: str = "t") -> Path:
    (tmp_path / name / "1").mkdir(parents=True)
    (tmp_path / name / "1" / "model.plan").write_bytes(b"not an engine")
    if config is not None:
        (tmp_path / name / "config.pbtxt").write_text(config)
    return tmp_path


def test_load_without_tensorrt_says_why(tmp_path, no_tensorrt):
    entry = ModelRepository(_plan_repo(tmp_path), complete=complete, gpu_count=0).scan()["t"]
    # A complete config passes the scan: the worker that loads the model decides.
    assert entry.error is None, entry.error
    assert entry.backend == "tensorrt"
    [instance] = entry.instances()
    backend = TensorRTBackend(entry.spec(1), instance)
    with pytest.raises(ModelLoadError) as info:
        backend.load()
    msg = info.value.message
    assert msg.startswith("model 't' needs TensorRT and an NVIDIA GPU: the tensorrt package ")
    assert msg.endswith("(install conch[gpu])")


def test_incomplete_config_without_tensorrt_is_unavailable_at_scan(tmp_path, no_tensorrt):
    entry = ModelRepository(
        _plan_repo(tmp_path, config=None), complete=complete, gpu_count=0
    ).scan()["t"]
    assert entry.backend == "tensorrt"  # chosen by the model.plan file name
    assert entry.error is not None
    assert "model 't' needs TensorRT and an NVIDIA GPU" in entry.error
    assert "install conch[gpu]" in entry.error


def test_kind_auto_is_cpu_without_tensorrt_and_still_says_why(tmp_path, no_tensorrt):
    entry = ModelRepository(_plan_repo(tmp_path), complete=complete, gpu_count=0).scan()["t"]
    [instance] = entry.instances()
    assert instance.kind == "CPU"
    with pytest.raises(ModelLoadError, match="needs TensorRT and an NVIDIA GPU"):
        TensorRTBackend(entry.spec(1), instance).load()


@pytest.mark.gpu
@needs_trt
def test_kind_cpu_is_refused_where_tensorrt_runs(tmp_path):
    entry = ModelRepository(_plan_repo(tmp_path), complete=complete, gpu_count=1).scan()["t"]
    backend = TensorRTBackend(entry.spec(1), InstanceSpec("t_0", "CPU"))
    with pytest.raises(
        ModelLoadError, match="KIND_CPU but a TensorRT engine runs on an NVIDIA GPU"
    ):
        backend.load()


@pytest.mark.gpu
@needs_trt
def test_a_file_that_is_no_engine(tmp_path):
    entry = ModelRepository(_plan_repo(tmp_path), complete=complete, gpu_count=1).scan()["t"]
    backend = TensorRTBackend(entry.spec(1), InstanceSpec("t_0", "GPU", 0))
    with pytest.raises(ModelLoadError, match=r"model 't': TensorRT .* cannot deserialize"):
        backend.load()


# ------------------------------------------------------------------ config against an engine


def engine(
    *,
    batch: bool = True,
    lo: int = 1,
    hi: int = MAX_BATCH,
    y_dtype: str | None = "TYPE_FP32",
    width: int = WIDTH_IN,
) -> list[EngineTensor]:
    """What ``engine_io`` reports for the MLP engine above (or a variant of it)."""
    lead = (-1,) if batch else (4,)
    return [
        EngineTensor(
            "x",
            True,
            "TYPE_FP32",
            "FLOAT",
            (*lead, width),
            profile_min=(lo if batch else 4, WIDTH_IN if width != -1 else 1),
            profile_max=(hi if batch else 4, WIDTH_IN if width != -1 else 64),
        ),
        EngineTensor("y", False, y_dtype, "FLOAT" if y_dtype else "FP8", (*lead, WIDTH_OUT)),
    ]


def _config(text: str = "", name: str = "t"):
    cfg = parse_config(text, model=name, source="test") if text else new_config()
    cfg.name = name
    return cfg


def test_auto_complete_from_the_engine():
    cfg = _config()
    check_and_fill(cfg, engine(), fill=True, default_max_batch_size=4)
    assert cfg.max_batch_size == MAX_BATCH  # the profile's largest batch, as Triton does
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("x", 11, [WIDTH_IN])]
    assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [("y", 11, [WIDTH_OUT])]


def test_auto_complete_fixed_batch_engine_keeps_full_shapes():
    cfg = _config()
    check_and_fill(cfg, engine(batch=False), fill=True, default_max_batch_size=4)
    assert cfg.max_batch_size == 0
    assert list(cfg.input[0].dims) == [4, WIDTH_IN]


def test_complete_config_checks_clean():
    cfg = _config(TRT_CONFIG)
    check_and_fill(cfg, engine(), fill=False, default_max_batch_size=0)


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        (
            TRT_CONFIG.replace('name: "y" data_type: TYPE_FP32', 'name: "y" data_type: TYPE_FP16'),
            engine(),
            "model 't': output 'y' field data_type is TYPE_FP16 but the engine has TYPE_FP32",
        ),
        (
            TRT_CONFIG.replace(f"dims: [ {WIDTH_IN} ]", "dims: [ 3 ]"),
            engine(),
            "model 't': input 'x' field dims is [3] but the engine's shape after the batch "
            f"dimension (max_batch_size {MAX_BATCH}) is [{WIDTH_IN}], profile [1, {WIDTH_IN}]"
            f"..[{MAX_BATCH}, {WIDTH_IN}]",
        ),
        (
            TRT_CONFIG.replace(f"max_batch_size: {MAX_BATCH}", "max_batch_size: 64"),
            engine(),
            f"model 't': max_batch_size is 64 but the engine's optimization profile allows "
            f"input 'x' a batch of at most {MAX_BATCH}",
        ),
        (
            TRT_CONFIG,
            engine(batch=False),
            f"model 't': max_batch_size is {MAX_BATCH} but the engine cannot batch: tensor 'x' "
            "has first dimension 4, not a dynamic batch dimension; set max_batch_size: 0",
        ),
        (
            TRT_CONFIG.replace('name: "x"', 'name: "input"'),
            engine(),
            "model 't': config input 'input' is not an input of the engine (it has ['x'])",
        ),
        (
            TRT_CONFIG,
            engine(y_dtype=None),
            "model 't': engine tensor 'y' is FP8, which has no Triton data type",
        ),
    ],
    ids=["dtype", "dims", "batch-beyond-profile", "no-batch-dim", "unknown-input", "fp8"],
)
def test_config_contradicting_the_engine(config, tensors, message):
    with pytest.raises(ModelLoadError) as info:
        check_and_fill(_config(config), tensors, fill=False, default_max_batch_size=0)
    assert info.value.message == message


def test_fixed_config_dim_must_lie_in_the_profile():
    tensors = engine(width=-1)  # dynamic feature dim, profile 1..64
    ok = _config(TRT_CONFIG.replace(f"dims: [ {WIDTH_IN} ]", "dims: [ 32 ]"))
    check_and_fill(ok, tensors, fill=False, default_max_batch_size=0)
    bad = _config(TRT_CONFIG.replace(f"dims: [ {WIDTH_IN} ]", "dims: [ 100 ]"))
    with pytest.raises(ModelLoadError, match=r"input 'x' field dims is \[100\]"):
        check_and_fill(bad, tensors, fill=False, default_max_batch_size=0)


def test_strict_config_missing_an_engine_input():
    cfg = _config(TRT_CONFIG.replace('input [ { name: "x"', 'input [ { name: "x2"'))
    tensors = [
        *engine(),
        EngineTensor("x2", True, "TYPE_FP32", "FLOAT", (-1, 16), (1, 16), (8, 16)),
    ]
    with pytest.raises(
        ModelLoadError, match="the engine has input 'x', which the config does not list"
    ):
        check_and_fill(cfg, tensors, fill=False, default_max_batch_size=0)


def test_shape_tensors_are_refused():
    tensors = [EngineTensor("s", True, "TYPE_INT32", "INT32", (2,), shape_tensor=True)]
    with pytest.raises(ModelLoadError, match="'s' is a shape tensor"):
        check_and_fill(_config(), tensors, fill=True, default_max_batch_size=4)


class FakeEngine:
    """The engine API ``engine_io`` uses, for a (batch, 16) -> (batch, 8) engine."""

    num_io_tensors = 2
    num_optimization_profiles = 1

    def get_tensor_name(self, i):
        return ["x", "y"][i]

    def get_tensor_mode(self, name):
        return "INPUT" if name == "x" else "OUTPUT"

    def get_tensor_dtype(self, name):
        return types.SimpleNamespace(name="FLOAT")

    def get_tensor_shape(self, name):
        return [-1, WIDTH_IN] if name == "x" else [-1, WIDTH_OUT]

    def is_shape_inference_io(self, name):
        return False

    def get_tensor_profile_shape(self, name, profile):
        assert (name, profile) == ("x", 0)
        return [[1, WIDTH_IN], [4, WIDTH_IN], [MAX_BATCH, WIDTH_IN]]


def test_engine_io_reads_the_named_tensor_api(monkeypatch):
    fake = types.SimpleNamespace(TensorIOMode=types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT"))
    monkeypatch.setattr(trt_backend, "_trt", lambda: fake)
    assert trt_backend.engine_io(FakeEngine()) == engine()


# ------------------------------------------------------------------ a real engine, in-process


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    if not TRT_OK:
        pytest.skip(f"TensorRT cannot run here: {TRT_REASON}")
    root = tmp_path_factory.mktemp("trt")
    onnx_path = onnx_mlp(root / "mlp.onnx")
    return onnx_path, build_engine(onnx_path, root / "model.plan")


@pytest.mark.gpu
@needs_trt
def test_engine_io_of_a_built_engine(built):
    _, plan = built
    _, eng = trt_backend._read_engine(plan, "t", 0)
    assert trt_backend.engine_io(eng) == engine()


@pytest.mark.gpu
@needs_trt
def test_backend_runs_a_built_engine(built, tmp_path):
    onnx_path, plan = built
    (tmp_path / "t" / "1").mkdir(parents=True)
    (tmp_path / "t" / "1" / "model.plan").write_bytes(plan.read_bytes())
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=1).scan()[
        "t"
    ]  # no config: auto-complete
    assert entry.error is None, entry.error
    assert entry.config.max_batch_size == MAX_BATCH
    backend = TensorRTBackend(entry.spec(1), InstanceSpec("t_0", "GPU", 0))
    backend.load()
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((n, WIDTH_IN)).astype(np.float32) for n in (1, 3, 4)]
    results = backend.execute([BackendRequest({"x": x}, ["y"]) for x in xs])
    for x, res in zip(xs, results, strict=True):
        np.testing.assert_allclose(res["y"], ort_reference(onnx_path, x), rtol=1e-3, atol=1e-4)
    # Beyond the profile: a clear error for that run, not a crash.
    with pytest.raises(InvalidArgument, match=r"outside the engine's optimization profile"):
        backend.run({"x": np.zeros((MAX_BATCH + 1, WIDTH_IN), np.float32)}, ["y"])
    backend.unload()


# ------------------------------------------------------------------ the real path


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[tuple[str, Path | None]]:
    repo = tmp_path_factory.mktemp("trt_repo") / "models"
    # Served everywhere: unavailable with the reason (no TensorRT or no GPU), or, where
    # TensorRT runs, unavailable because the file is no engine.
    _plan_repo(repo, name="trt_bogus")
    onnx_path = None
    ready = []
    if TRT_OK:
        onnx_path = onnx_mlp(repo.parent / "mlp.onnx")
        build_engine(onnx_path, repo / "trt_mlp" / "1" / "model.plan")
        (repo / "trt_mlp" / "config.pbtxt").write_text(TRT_CONFIG)
        auto = repo / "trt_auto" / "1"
        auto.mkdir(parents=True)
        (auto / "model.plan").write_bytes((repo / "trt_mlp" / "1" / "model.plan").read_bytes())
        ready = ["trt_mlp", "trt_auto"]
    worker = start_worker(repo, redis_url, log_dir)
    gateway, url = start_gateway(repo, redis_url, log_dir)
    try:
        for m in ready:
            wait_model_ready(url, m, 180, worker, gateway)
        yield url, onnx_path
    finally:
        gateway.stop()
        worker.stop()


def test_served_plan_is_unavailable_with_the_reason(stack) -> None:
    url, _ = stack
    client = httpclient.InferenceServerClient(url)

    def row() -> dict:
        return {m["name"]: m for m in client.get_model_repository_index()}["trt_bogus"]

    expected = "needs TensorRT and an NVIDIA GPU" if not TRT_OK else "cannot deserialize"
    wait_until(lambda: expected in row().get("reason", ""), 60, "trt_bogus's reason")
    assert row()["state"] == "UNAVAILABLE"
    if not TRT_OK:
        assert row()["reason"] == (
            f"model 'trt_bogus' needs TensorRT and an NVIDIA GPU: {TRT_REASON} (install conch[gpu])"
        )
    assert not client.is_model_ready("trt_bogus")
    x = np.zeros((1, WIDTH_IN), np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match=expected) as exc:
        client.infer("trt_bogus", [inp])
    assert exc.value.status() == "503"


@pytest.mark.gpu
@needs_trt
@pytest.mark.parametrize("model", ["trt_mlp", "trt_auto"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_engine_matches_onnxruntime(stack, model: str, binary: bool) -> None:
    url, onnx_path = stack
    client = httpclient.InferenceServerClient(url)
    x = np.random.default_rng(7).standard_normal((3, WIDTH_IN)).astype(np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("y", binary_data=binary)
    got = client.infer(model, [inp], outputs=[out]).as_numpy("y")
    assert got.shape == (3, WIDTH_OUT)
    np.testing.assert_allclose(got, ort_reference(onnx_path, x), rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@needs_trt
def test_auto_completed_config(stack) -> None:
    url, _ = stack
    cfg = httpclient.InferenceServerClient(url).get_model_config("trt_auto")
    assert cfg["platform"] == "tensorrt_plan" and cfg["backend"] == "tensorrt"
    assert cfg["max_batch_size"] == MAX_BATCH
    assert [(i["name"], i["dims"]) for i in cfg["input"]] == [("x", [WIDTH_IN])]
    assert [(o["name"], o["dims"]) for o in cfg["output"]] == [("y", [WIDTH_OUT])]


@pytest.mark.gpu
@needs_trt
def test_concurrent_requests_of_different_sizes(stack) -> None:
    url, onnx_path = stack
    sizes = [1, 3, 2, 4, 1, 5]
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((n, WIDTH_IN)).astype(np.float32) for n in sizes]

    def one(x: np.ndarray) -> np.ndarray:
        c = httpclient.InferenceServerClient(url)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return c.infer("trt_mlp", [inp]).as_numpy("y")

    with ThreadPoolExecutor(len(xs)) as pool:
        results = list(pool.map(one, xs))
    for x, got in zip(xs, results, strict=True):
        np.testing.assert_allclose(got, ort_reference(onnx_path, x), rtol=1e-3, atol=1e-4)
