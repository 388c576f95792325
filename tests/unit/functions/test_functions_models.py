"""The shipped model repository ``functions/`` and the script that builds it.

Two promises are checked here: the models that ``functions/build_models.py`` writes compute
what its numpy reference computes, and the ``model.onnx`` files committed under
``functions/`` are what the script builds today (so neither can drift from the other).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[3]
FUNCTIONS = ROOT / "functions"
SCRIPT = FUNCTIONS / "build_models.py"

MODELS = ("mlp", "mlp_autocomplete")


def _load_script_module():
    spec = importlib.util.spec_from_file_location("conch_functions_build_models", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bm = _load_script_module()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A model repository written by running the script as a program."""
    out = tmp_path_factory.mktemp("functions")
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def _session(path: Path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _mlp_input(batch: int, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, bm.MLP_IN)).astype(np.float32)


def _autocomplete_inputs(batch: int, seed: int = 11) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((batch, bm.AUTOCOMPLETE_WIDTH)).astype(np.float32),
        "scale": rng.uniform(0.25, 4.0, (batch, 1)).astype(np.float32),
    }


def _inputs_for(model: str, batch: int) -> dict[str, np.ndarray]:
    if model == "mlp":
        return {"INPUT0": _mlp_input(batch)}
    return _autocomplete_inputs(batch)


def _interface(session) -> list[tuple[str, str, str, list]]:
    return [("in", a.name, a.type, list(a.shape)) for a in session.get_inputs()] + [
        ("out", a.name, a.type, list(a.shape)) for a in session.get_outputs()
    ]


# ------------------------------------------------------------------ what the script writes


def test_script_writes_the_repository_layout(fresh):
    assert (fresh / "mlp" / "1" / "model.onnx").is_file()
    assert (fresh / "mlp" / "config.pbtxt").is_file()
    assert (fresh / "mlp_autocomplete" / "1" / "model.onnx").is_file()
    # Served through auto-complete: there must be no config next to it.
    assert not (fresh / "mlp_autocomplete" / "config.pbtxt").exists()


def test_build_is_byte_for_byte_deterministic():
    assert bm.build_mlp().SerializeToString() == bm.build_mlp().SerializeToString()
    assert (
        bm.build_autocomplete().SerializeToString() == bm.build_autocomplete().SerializeToString()
    )
    a, b = bm.mlp_weights(), bm.mlp_weights()
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("model", MODELS)
def test_models_are_opset_17_with_an_ir_version_onnxruntime_loads(fresh, model):
    proto = onnx.load(str(fresh / model / "1" / "model.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.ir_version == bm.IR_VERSION
    assert {(o.domain, o.version) for o in proto.opset_import} == {("", bm.OPSET)}
    # Every input and output has a symbolic first (batch) dimension.
    for value in [*proto.graph.input, *proto.graph.output]:
        first = value.type.tensor_type.shape.dim[0]
        assert first.dim_param == bm.BATCH_DIM and not first.HasField("dim_value"), value.name


def test_mlp_interface(fresh):
    assert _interface(_session(fresh / "mlp" / "1" / "model.onnx")) == [
        ("in", "INPUT0", "tensor(float)", ["batch", 64]),
        ("out", "OUTPUT0", "tensor(float)", ["batch", 16]),
    ]


def test_autocomplete_interface(fresh):
    assert _interface(_session(fresh / "mlp_autocomplete" / "1" / "model.onnx")) == [
        ("in", "x", "tensor(float)", ["batch", 8]),
        ("in", "scale", "tensor(float)", ["batch", 1]),
        ("out", "y", "tensor(float)", ["batch", 8]),
        ("out", "argmax", "tensor(int64)", ["batch", 1]),
    ]


def test_mlp_config_is_a_valid_triton_config(fresh):
    config = pytest.importorskip("conch.core.model_config")
    text = (fresh / "mlp" / "config.pbtxt").read_text()
    cfg = config.parse_config(text, model="mlp", source="config.pbtxt")
    assert cfg.name == "mlp"
    assert cfg.platform == "onnxruntime_onnx"
    assert cfg.max_batch_size == 64
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("INPUT0", [64])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("OUTPUT0", [16])]
    assert cfg.HasField("dynamic_batching")
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 500
    [group] = cfg.instance_group
    assert group.count == 1
    assert group.kind == config.model_config_pb2().ModelInstanceGroup.KIND_CPU


# ------------------------------------------------------------ numerics against numpy


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_mlp_matches_the_numpy_reference(fresh, batch):
    x = _mlp_input(batch)
    [got] = _session(fresh / "mlp" / "1" / "model.onnx").run(["OUTPUT0"], {"INPUT0": x})
    want = bm.reference_mlp(x)
    assert got.dtype == np.float32 and got.shape == (batch, 16)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The reference is not trivially zero: ReLU leaves a real signal through.
    assert np.abs(want).max() > 0.1


@pytest.mark.parametrize("batch", [1, 5, 32])
def test_autocomplete_matches_the_numpy_reference(fresh, batch):
    feeds = _autocomplete_inputs(batch)
    y, argmax = _session(fresh / "mlp_autocomplete" / "1" / "model.onnx").run(
        ["y", "argmax"], feeds
    )
    want = bm.reference_autocomplete(feeds["x"], feeds["scale"])
    assert y.dtype == np.float32 and y.shape == (batch, 8)
    assert argmax.dtype == np.int64 and argmax.shape == (batch, 1)
    np.testing.assert_allclose(y, want["y"], rtol=1e-5, atol=1e-6)
    # ArgMax agrees exactly with the model's own y, and with the reference's.
    np.testing.assert_array_equal(argmax, np.argmax(y, axis=1, keepdims=True))
    np.testing.assert_array_equal(argmax, want["argmax"])


def test_weights_follow_the_seed():
    assert not np.array_equal(bm.mlp_weights(1)["W1"], bm.mlp_weights(2)["W1"])
    w = bm.mlp_weights()
    assert {k: v.shape for k, v in w.items()} == {
        "W1": (64, 256),
        "b1": (256,),
        "W2": (256, 16),
        "b2": (16,),
    }
    assert all(v.dtype == np.float32 for v in w.values())


# ------------------------------------------------- committed files against a fresh build


@pytest.mark.parametrize("model", MODELS)
def test_committed_model_matches_a_fresh_build(fresh, model):
    committed_path = FUNCTIONS / model / "1" / "model.onnx"
    assert committed_path.is_file(), (
        f"{committed_path} is missing; run .venv/bin/python functions/build_models.py"
    )
    committed, rebuilt = _session(committed_path), _session(fresh / model / "1" / "model.onnx")
    hint = f"{committed_path} differs from what functions/build_models.py builds; rerun it"
    assert _interface(committed) == _interface(rebuilt), hint
    feeds = _inputs_for(model, batch=9)
    for got, want in zip(committed.run(None, feeds), rebuilt.run(None, feeds), strict=True):
        np.testing.assert_array_equal(got, want, err_msg=hint)


def test_committed_config_matches_a_fresh_build(fresh):
    assert (FUNCTIONS / "mlp" / "config.pbtxt").read_text() == (
        fresh / "mlp" / "config.pbtxt"
    ).read_text(), "functions/mlp/config.pbtxt differs from the script's; rerun it"
    assert not (FUNCTIONS / "mlp_autocomplete" / "config.pbtxt").exists()


# ------------------------------------------------------------ tiny_cnn (TorchScript)

TINY_CNN_FILES = ("tiny_cnn/1/model.pt", "tiny_cnn/config.pbtxt")


def _torchscript(path_or_bytes):
    import io
    import warnings

    torch = pytest.importorskip("torch")
    source = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else str(path_or_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(source, map_location="cpu")


def _cnn_input(batch: int, seed: int = 13) -> np.ndarray:
    side = bm.CNN_SIDE
    return np.random.default_rng(seed).standard_normal((batch, 1, side, side)).astype(np.float32)


def _run_cnn(module, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return module(torch.from_numpy(x)).numpy()


def test_script_writes_tiny_cnn(fresh):
    for rel in TINY_CNN_FILES:
        assert (fresh / rel).is_file(), rel
    # Small enough to commit: 2.6k weights and the TorchScript code.
    assert (fresh / "tiny_cnn" / "1" / "model.pt").stat().st_size < 32_000


def test_tiny_cnn_build_is_byte_for_byte_deterministic(fresh):
    pytest.importorskip("torch")
    # This process's build against the script run as a program (another process).
    built = bm.build_tiny_cnn()
    assert built == (fresh / "tiny_cnn" / "1" / "model.pt").read_bytes()
    # No debug records (they would carry this checkout's absolute paths), no stored
    # example input, and no per-process renaming of the class.
    assert b".debug_pkl" not in built and b"traced_inputs" not in built
    assert str(ROOT).encode() not in built and b"torch_mangle" not in built
    a, b = bm.tiny_cnn_weights(), bm.tiny_cnn_weights()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(bm.tiny_cnn_weights(1)["fc_w"], bm.tiny_cnn_weights(2)["fc_w"])


def test_tiny_cnn_interface(fresh):
    module = _torchscript(fresh / "tiny_cnn" / "1" / "model.pt")
    schema = module.forward.schema
    assert [a.name for a in schema.arguments][1:] == ["x"]
    assert [str(r.type) for r in schema.returns] == ["Tensor"]


@pytest.mark.parametrize("batch", [1, 7, 32])
def test_tiny_cnn_matches_the_numpy_reference(fresh, batch):
    x = _cnn_input(batch)
    got = _run_cnn(_torchscript(fresh / "tiny_cnn" / "1" / "model.pt"), x)
    want = bm.reference_tiny_cnn(x)
    assert got.dtype == np.float32 and got.shape == (batch, bm.CNN_CLASSES)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.abs(want).max() > 0.1


def test_tiny_cnn_config_is_complete_for_the_pytorch_backend(fresh):
    config = pytest.importorskip("conch.core.model_config")
    from conch.backends.completion import complete
    from conch.core.repository import ModelRepository

    text = (fresh / "tiny_cnn" / "config.pbtxt").read_text()
    cfg = config.parse_config(text, model="tiny_cnn", source="config.pbtxt")
    assert cfg.platform == "pytorch_libtorch"
    assert cfg.max_batch_size == 32
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("INPUT__0", [1, 8, 8])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("OUTPUT__0", [10])]
    assert cfg.HasField("dynamic_batching")
    assert cfg.parameters["INTRA_OP_THREAD_COUNT"].string_value == "1"
    entry = ModelRepository(fresh, complete=complete, gpu_count=0).read_model("tiny_cnn")
    assert entry.error is None, entry.error
    assert entry.backend == "pytorch"


def test_committed_tiny_cnn_matches_a_fresh_build(fresh):
    committed_path = FUNCTIONS / "tiny_cnn" / "1" / "model.pt"
    assert committed_path.is_file(), (
        f"{committed_path} is missing; run .venv/bin/python functions/build_models.py"
    )
    hint = f"{committed_path} differs from what functions/build_models.py builds; rerun it"
    x = _cnn_input(9)
    committed = _run_cnn(_torchscript(committed_path), x)
    rebuilt = _run_cnn(_torchscript(fresh / "tiny_cnn" / "1" / "model.pt"), x)
    np.testing.assert_array_equal(committed, rebuilt, err_msg=hint)
    # With torch pinned the build is byte-for-byte reproducible, so hold it to that.
    assert committed_path.read_bytes() == (fresh / "tiny_cnn" / "1" / "model.pt").read_bytes(), hint
    assert (FUNCTIONS / "tiny_cnn" / "config.pbtxt").read_text() == (
        fresh / "tiny_cnn" / "config.pbtxt"
    ).read_text(), "functions/tiny_cnn/config.pbtxt differs from the script's; rerun it"


# ---------------------------------------------------------- the sentiment classifier


def test_committed_classifier_matches_a_fresh_build_and_the_reference(fresh):
    committed = FUNCTIONS / "classifier" / "1" / "model.onnx"
    hint = f"{committed} differs from what functions/build_models.py builds; rerun it"
    assert committed.read_bytes() == (fresh / "classifier" / "1" / "model.onnx").read_bytes(), hint
    assert (FUNCTIONS / "classifier" / "config.pbtxt").read_text() == bm.CLASSIFIER_CONFIG, hint
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 100, size=(5, bm.SEQUENCE_LENGTH)).astype(np.int64)
    mask = (np.arange(bm.SEQUENCE_LENGTH)[None, :] < rng.integers(1, 33, size=(5, 1))).astype(
        np.int64
    )
    (got,) = _session(committed).run(None, {"INPUT_IDS": ids, "ATTENTION_MASK": mask})
    np.testing.assert_allclose(got, bm.reference_classifier(ids, mask), rtol=1e-5, atol=1e-6)
