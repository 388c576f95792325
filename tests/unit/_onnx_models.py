"""Tiny ONNX models for the unit tests, built with onnx.helper (fixed-seed weights)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # old enough for any onnxruntime we support

RNG_SEED = 1234


def mlp_weights() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(RNG_SEED)
    w1 = rng.standard_normal((4, 8)).astype(np.float32)
    b1 = rng.standard_normal(8).astype(np.float32)
    w2 = rng.standard_normal((8, 3)).astype(np.float32)
    b2 = rng.standard_normal(3).astype(np.float32)
    return w1, b1, w2, b2


def mlp_reference(x: np.ndarray) -> np.ndarray:
    w1, b1, w2, b2 = mlp_weights()
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def mlp(path: Path, batch: str | int = "N") -> Path:
    """y = relu(x @ W1 + b1) @ W2 + b2; x [batch, 4] float, y [batch, 3]."""
    w1, b1, w2, b2 = mlp_weights()
    inits = [
        numpy_helper.from_array(w1, "W1"),
        numpy_helper.from_array(b1, "B1"),
        numpy_helper.from_array(w2, "W2"),
        numpy_helper.from_array(b2, "B2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "B1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["h3"]),
        helper.make_node("Add", ["h3", "B2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        initializer=inits,
    )
    return _save(graph, path)


def fixed(path: Path) -> Path:
    """b = a * 2 with a fixed [2, 3] shape: a model that cannot batch."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "two"], ["b"])],
        "fixed",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    return _save(graph, path)


def strings(path: Path) -> Path:
    """echo = Identity(text), text [N, 2] string; plus length-free second output."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["echo"])],
        "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N", 2])],
        [helper.make_tensor_value_info("echo", TensorProto.STRING, ["N", 2])],
    )
    return _save(graph, path)


def half_bool(path: Path) -> Path:
    """h_out = Identity(h) (float16), flag_out = Not(flag) (bool); both [N, 2]."""
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["h"], ["h_out"]),
            helper.make_node("Not", ["flag"], ["flag_out"]),
        ],
        "half_bool",
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT16, ["N", 2]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, ["N", 2]),
        ],
        [
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT16, ["N", 2]),
            helper.make_tensor_value_info("flag_out", TensorProto.BOOL, ["N", 2]),
        ],
    )
    return _save(graph, path)


def scalar(path: Path) -> Path:
    """out = Identity(s) with a scalar float input."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["out"])],
        "scalar",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [])],
    )
    return _save(graph, path)


def row_scalar(path: Path) -> Path:
    """out = s * 2 with input shape [N]: one scalar per batch row."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["s", "two"], ["out"])],
        "row_scalar",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N"])],
        initializer=[two],
    )
    return _save(graph, path)


def square(path: Path) -> Path:
    """y = transpose of each 2x2 matrix x (shape [N, 2, 2]): the layout shows a reshape."""
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])],
        "square",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 2])],
    )
    return _save(graph, path)


def write_model(
    repo: Path,
    name: str,
    builder=mlp,
    *,
    versions: tuple[int, ...] = (1,),
    config: str | None = None,
) -> Path:
    """<repo>/<name>/<v>/model.onnx for each version, and config.pbtxt when given."""
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    for v in versions:
        builder(model_dir / str(v) / "model.onnx")
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir
