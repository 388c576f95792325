"""Triton's L0_model_config autofill cases for the backends conch serves, and the configs
Triton returns for them.

triton-inference-server/server ``qa/L0_model_config/autofill_noplatform_success/<backend>/
<case>`` holds, for each case, a model folder whose ``config.pbtxt`` is partly or wholly
missing, and ``expected`` files: the config Triton's ``get_model_config`` answers, read as
a protobuf message and compared whole (gRPC's ``ModelConfig``; the HTTP JSON must parse
to the same message). The cases here are those of the onnx, pytorch and python folders
that conch can load (not the decoupled ones, left for issue 30's HTTP routes), with
models built here to the same signatures, and the expected configs written out again in
our own words.

Triton's files were made on a host with one GPU: a group the config leaves to the
default is ``count: 1 gpus: 0 kind: KIND_GPU`` there. On a host with none, Triton makes it
``KIND_CPU``, with its default CPU count (2 for onnxruntime, as its ``cpu_instance`` and
``no_config_no_batch`` files show, 1 for the others). ``expected(case, gpus)`` gives both.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
from onnx import TensorProto, helper

from conch.core.model_config import model_config_pb2, parse_config

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

PINNED = """
optimization {
  input_pinned_memory { enable: true }
  output_pinned_memory { enable: true }
}
"""
VERSIONS = "version_policy { latest { num_versions: 1 } }\n"


@dataclass(frozen=True)
class Case:
    name: str  # the model's name, as in Triton's folder
    backend: str
    config: str | None  # config.pbtxt as written; None: no file at all
    expected: str  # Triton's answer, with {group} where Triton fills in the default group
    cpu_count: int = 1  # Triton's default count for the group on a host with no GPU


# -- the models -------------------------------------------------------------------------


def _onnx(path: Path, inputs: list[tuple[str, int, list[Any]]], outputs: list[str]) -> None:
    """Identity-like ONNX graph: each output is a Cast of the first input."""
    elem_out = {"INT8": TensorProto.INT8, "FP16": TensorProto.FLOAT16}
    ins = [helper.make_tensor_value_info(n, t, shape) for n, t, shape in inputs]
    outs, nodes = [], []
    for spec in outputs:
        name, dtype, *_ = spec.split(":")
        shape = inputs[0][2]
        outs.append(helper.make_tensor_value_info(name, elem_out[dtype], shape))
        nodes.append(helper.make_node("Cast", [inputs[0][0]], [name], to=elem_out[dtype]))
    graph = helper.make_graph(nodes, path.parent.parent.name, ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _int32_int8(path: Path, batch: bool) -> None:
    """Triton's onnx_int32_int8_int8 signature: INPUT0/1 INT32 [16] -> OUTPUT0/1 INT8."""
    shape: list[Any] = ["N", 16] if batch else [16]
    _onnx(
        path,
        [("INPUT0", TensorProto.INT32, shape), ("INPUT1", TensorProto.INT32, shape)],
        ["OUTPUT0:INT8", "OUTPUT1:INT8"],
    )


def _fp16_identity(path: Path) -> None:
    """Triton's onnx_zero_1_float16 identity: INPUT0 FP16 [-1, -1] after the batch."""
    _onnx(path, [("INPUT0", TensorProto.FLOAT16, ["N", "A", "B"])], ["OUTPUT0:FP16"])


def _torchscript(path: Path) -> None:
    """INPUT__0, INPUT__1 -> OUTPUT__0 (sum), OUTPUT__1 (difference), as TorchScript."""
    import torch  # the tests that build it run where torch is installed

    class AddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a + b, a - b

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(AddSub()).save(str(path))


# The Python models of Triton's cases: an auto_complete_config that states the model's
# tensors (and, for some, its batching), and an execute that adds and subtracts.
PY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
{hook}
        return config

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1")
            a = np.zeros(4, np.float32) if a is None else a.as_numpy()
            b = np.zeros(4, np.float32) if b is None else b.as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32)),
            ]))
        return out
"""


def _io_calls(inputs: list[str], outputs: list[str], optional: tuple[str, ...] = ()) -> str:
    lines = []
    for name in inputs:
        extra = ', "optional": True' if name in optional else ""
        lines.append(
            f'config.add_input({{"name": "{name}", "data_type": "TYPE_FP32", "dims": [4]{extra}}})'
        )
    for name in outputs:
        lines.append(
            f'config.add_output({{"name": "{name}", "data_type": "TYPE_FP32", "dims": [4]}})'
        )
    return "\n".join(lines)


PY_HOOKS = {
    # max_batch_size 0, the four tensors (Triton's qa/python_models/auto_complete)
    "plain": "config.set_max_batch_size(0)\n"
    + _io_calls(["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"]),
    "batching": "config.set_max_batch_size(4)\nconfig.set_dynamic_batching()\n"
    + _io_calls(["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"]),
    "one_input": "config.set_max_batch_size(0)\n" + _io_calls(["INPUT0"], ["OUTPUT0", "OUTPUT1"]),
    "optional_input": "config.set_max_batch_size(0)\n"
    + _io_calls(["INPUT0"], ["OUTPUT0", "OUTPUT1"], optional=("INPUT0",)),
    "not_decoupled": "config.set_max_batch_size(4)\n"
    "config.set_model_transaction_policy(dict(decoupled=False))\n"
    + _io_calls(["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"]),
}


def _io(
    inputs: list[str], outputs: list[str], dtype: str = "TYPE_FP32", dims: str = "[ 4 ]"
) -> str:
    ins = ", ".join(f'{{ name: "{n}" data_type: {dtype} dims: {dims} }}' for n in inputs)
    outs = ", ".join(f'{{ name: "{n}" data_type: {dtype} dims: {dims} }}' for n in outputs)
    return f"input [ {ins} ]\noutput [ {outs} ]\n"


FOUR = _io(["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"])
FOUR_INT32_16 = _io(["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"], "TYPE_INT32", "[ 16 ]")
FOUR_INT32_INT8 = (
    _io(["INPUT0", "INPUT1"], [], "TYPE_INT32", "[ 16 ]").split("\n")[0]
    + "\n"
    + _io([], ["OUTPUT0", "OUTPUT1"], "TYPE_INT8", "[ 16 ]").split("\n")[1]
    + "\n"
)
TORCH_FOUR = _io(["INPUT__0", "INPUT__1"], ["OUTPUT__0", "OUTPUT__1"], "TYPE_INT32", "[ 16 ]")


def _py(name: str, config: str | None, expected_io: str, hook: str, tail: str = "") -> Case:
    return Case(
        name=name,
        backend="python",
        config=config,
        expected=f'name: "{name}"\n{VERSIONS}{expected_io}instance_group {{ {{group}} }}\n'
        f'default_model_filename: "model.py"\n{PINNED}backend: "python"\n{tail}',
    )


def _cases() -> list[Case]:
    onnx_batch = (
        'platform: "onnxruntime_onnx"\n'
        + VERSIONS
        + "max_batch_size: 4\n"
        + FOUR_INT32_INT8
        + "instance_group { {group} }\n"
        + "dynamic_batching { preferred_batch_size: 4 }\n"
        + 'default_model_filename: "model.onnx"\n'
        + PINNED
        + 'backend: "onnxruntime"\n'
    )
    cases = [
        # onnx/no_config: no config.pbtxt at all
        Case("no_config", "onnxruntime", None, f'name: "no_config"\n{onnx_batch}', cpu_count=2),
        # onnx/empty_config: an empty config.pbtxt
        Case("empty_config", "onnxruntime", "", f'name: "empty_config"\n{onnx_batch}', 2),
        # onnx/no_config_no_batch: a model that cannot batch, a KIND_CPU group, no count
        Case(
            "no_config_no_batch",
            "onnxruntime",
            "instance_group [ { kind: KIND_CPU } ]\n",
            'name: "no_config_no_batch"\nplatform: "onnxruntime_onnx"\n'
            + VERSIONS
            + FOUR_INT32_INT8
            + 'instance_group { name: "no_config_no_batch_0" count: 2 kind: KIND_CPU }\n'
            + 'default_model_filename: "model.onnx"\n'
            + PINNED
            + 'backend: "onnxruntime"\n',
        ),
        # onnx/cpu_instance: a whole config but the group's count. No batcher is added:
        # Triton's onnxruntime backend completes nothing in a config that lists inputs
        # and outputs
        Case(
            "cpu_instance_onnx",
            "onnxruntime",
            'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            + VERSIONS
            + _io(["INPUT0"], ["OUTPUT0"], "TYPE_FP16", "[ -1, -1 ]")
            + 'instance_group { name: "cpu_instance" kind: KIND_CPU }\n',
            'name: "cpu_instance_onnx"\nplatform: "onnxruntime_onnx"\n'
            + VERSIONS
            + "max_batch_size: 8\n"
            + _io(["INPUT0"], ["OUTPUT0"], "TYPE_FP16", "[ -1, -1 ]")
            + 'instance_group { name: "cpu_instance" count: 2 kind: KIND_CPU }\n'
            + 'default_model_filename: "model.onnx"\n'
            + PINNED
            + 'backend: "onnxruntime"\n',
        ),
        # pytorch/cpu_instance: a whole config (it names model.pt) but the group's count
        Case(
            "cpu_instance_pytorch",
            "pytorch",
            'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
            + VERSIONS
            + TORCH_FOUR
            + 'instance_group { name: "cpu_instance" kind: KIND_CPU }\n'
            + 'default_model_filename: "model.pt"\n'
            + PINNED
            + 'backend: "pytorch"\n',
            'name: "cpu_instance_pytorch"\nplatform: "pytorch_libtorch"\n'
            + VERSIONS
            + "max_batch_size: 8\n"
            + TORCH_FOUR
            + 'instance_group { name: "cpu_instance" count: 1 kind: KIND_CPU }\n'
            + 'default_model_filename: "model.pt"\n'
            + PINNED
            + 'backend: "pytorch"\n',
        ),
        # pytorch/no_name_platform: tensors only; the backend is found from model.pt, and
        # Triton then writes no default_model_filename
        Case(
            "no_name_platform",
            "pytorch",
            "max_batch_size: 8\n" + TORCH_FOUR,
            'name: "no_name_platform"\nplatform: "pytorch_libtorch"\n'
            + VERSIONS
            + "max_batch_size: 8\n"
            + TORCH_FOUR
            + "instance_group { {group} }\n"
            + PINNED
            + 'backend: "pytorch"\n',
        ),
        # python/empty_config: the model's auto_complete_config gives everything
        _py("empty_config_python", "", FOUR, "plain"),
        # python/dynamic_batching: the hook asks for the dynamic batcher
        _py(
            "dynamic_batching",
            FOUR,
            "max_batch_size: 4\n" + FOUR + "dynamic_batching { preferred_batch_size: 4 }\n",
            "batching",
        ),
        # python/dynamic_batching_no_op: the config already has what the hook asks for
        _py(
            "dynamic_batching_no_op",
            "max_batch_size: 4\n" + FOUR + "dynamic_batching { preferred_batch_size: [ 4 ] }\n",
            "max_batch_size: 4\n" + FOUR + "dynamic_batching { preferred_batch_size: 4 }\n",
            "batching",
        ),
        # python/incomplete_input: one input given, the hook adds the other after it
        _py(
            "incomplete_input",
            _io(["INPUT1"], []).split("\n")[0] + "\n",
            _io(["INPUT1", "INPUT0"], ["OUTPUT0", "OUTPUT1"]),
            "one_input",
        ),
        # python/incomplete_output: outputs named, each missing a field the hook gives
        _py(
            "incomplete_output",
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 }, { name: "OUTPUT1" dims: [ 4 ] } ]\n',
            FOUR,
            "plain",
        ),
        # python/unknown_input: the config has an input the hook does not know; kept
        _py(
            "unknown_input",
            _io(["INPUT0", "INPUT_UNKNOWN"], ["OUTPUT0", "OUTPUT1"]),
            _io(["INPUT0", "INPUT_UNKNOWN", "INPUT1"], ["OUTPUT0", "OUTPUT1"]),
            "plain",
        ),
        # python/unknown_output: likewise for an output
        _py(
            "unknown_output",
            _io(["INPUT0", "INPUT1"], ["OUTPUT_UNKNOWN", "OUTPUT1"]),
            _io(["INPUT0", "INPUT1"], ["OUTPUT_UNKNOWN", "OUTPUT1", "OUTPUT0"]),
            "plain",
        ),
        # python/optional_input: the hook adds an optional input
        _py(
            "optional_input",
            _io(["INPUT1"], []).split("\n")[0] + "\n",
            'input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }, '
            '{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]\n'
            + _io([], ["OUTPUT0", "OUTPUT1"]).split("\n")[1]
            + "\n",
            "optional_input",
        ),
        # python/model_transaction_policy_decoupled_false: the hook says "not decoupled"
        _py(
            "model_transaction_policy_decoupled_false",
            FOUR,
            "max_batch_size: 4\n" + FOUR,
            "not_decoupled",
            tail="model_transaction_policy { }\n",
        ),
    ]
    return cases


CASES: dict[str, Case] = {c.name: c for c in _cases()}
# Which hook each Python case's model.py has.
PY_CASE_HOOKS = {
    "empty_config_python": "plain",
    "dynamic_batching": "batching",
    "dynamic_batching_no_op": "batching",
    "incomplete_input": "one_input",
    "incomplete_output": "plain",
    "unknown_input": "plain",
    "unknown_output": "plain",
    "optional_input": "optional_input",
    "model_transaction_policy_decoupled_false": "not_decoupled",
}


def build(root: Path, names: list[str] | None = None) -> Path:
    """Each case's model folder under ``root`` (every case unless ``names``)."""
    for name in names or list(CASES):
        case = CASES[name]
        folder = root / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        if case.config is not None:
            (folder / "config.pbtxt").write_text(case.config)
        if case.backend == "onnxruntime":
            if name == "cpu_instance_onnx":
                _fp16_identity(folder / "1" / "model.onnx")
            else:
                _int32_int8(folder / "1" / "model.onnx", batch=name != "no_config_no_batch")
        elif case.backend == "pytorch":
            _torchscript(folder / "1" / "model.pt")
        else:
            hook = textwrap.indent(PY_HOOKS[PY_CASE_HOOKS[name]], " " * 8)
            (folder / "1" / "model.py").write_text(PY_MODEL.replace("{hook}", hook))
    return root


def expected(name: str, gpus: int) -> ModelConfig:
    """The config Triton answers for case ``name`` on a host with ``gpus`` GPUs."""
    case = CASES[name]
    if gpus:
        ids = " ".join(f"gpus: {i}" for i in range(gpus))
        group = f'name: "{name}" count: 1 {ids} kind: KIND_GPU'
    else:
        group = f'name: "{name}" count: {case.cpu_count} kind: KIND_CPU'
    return parse_config(case.expected.replace("{group}", group), model=name, source="expected")


def as_config(obj: Any) -> ModelConfig:
    """A config message from tritonclient's HTTP JSON (a dict) or gRPC answer."""
    from google.protobuf import json_format

    cfg = model_config_pb2().ModelConfig()
    if isinstance(obj, dict):
        json_format.ParseDict(obj, cfg)
    else:
        cfg.ParseFromString(obj.SerializeToString())  # tritonclient's own ModelConfig
    return cfg


__all__ = ["CASES", "Case", "as_config", "build", "expected"]
