"""OpenVINO models for the tests: an IR converted here from one of the unit tests' ONNX
files (``openvino.convert_model`` and ``save_model``), and a repository folder for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conch.backends.openvino import load_openvino

from unit._onnx_models import mlp


def ir_from_onnx(onnx_file: Path, xml: Path) -> Path:
    """``xml`` (and its ``.bin``) converted from ``onnx_file``, weights kept in FP32."""
    ov = load_openvino()

    xml.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.convert_model(str(onnx_file)), str(xml), compress_to_fp16=False)
    return xml


def mlp_ir(version_dir: Path, batch: str | int = "N") -> Path:
    """The unit tests' MLP (x [batch, 4] -> y [batch, 3]) as ``model.xml``/``model.bin``."""
    onnx_file = mlp(version_dir.parent / f"src_{version_dir.name}.onnx", batch=batch)
    return ir_from_onnx(onnx_file, version_dir / "model.xml")


def openvino_answers(model_file: Path, x: np.ndarray) -> np.ndarray:
    """What openvino answers in this process, in FP32, for the model's one input."""
    ov = load_openvino()

    core = ov.Core()
    compiled = core.compile_model(
        core.read_model(str(model_file)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    return np.array(compiled.create_infer_request().infer([x])[compiled.output(0)])


def onnxruntime_answers(onnx_file: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def pooled(path: Path, classes: int = 1001) -> Path:
    """A small image model with the names and shapes of the reshape example in Triton's
    OpenVINO README: ``input`` [1, 3, 8, 8] (fixed, so only RESHAPE_IO_LAYERS opens it)
    averaged per channel, then a dense layer to ``output`` [1, classes]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(7).standard_normal((3, classes)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("MatMul", ["flat", "W"], ["output"]),
        ],
        "pooled",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, classes])],
        initializer=[numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def pooled_reference(path: Path, x: np.ndarray) -> np.ndarray:
    """``pooled``'s answer computed with numpy from its weights, for any batch and size."""
    import onnx
    from onnx import numpy_helper

    (w,) = [numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer]
    return x.mean(axis=(2, 3)) @ w
