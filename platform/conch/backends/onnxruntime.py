"""ONNX models on onnxruntime (Triton's ``onnxruntime`` backend, platform ``onnxruntime_onnx``).

Config tensor names are the ONNX graph's names. CPU instances use the
CPUExecutionProvider; GPU instances need ``onnxruntime-gpu`` (``conch[gpu]``) and a
visible NVIDIA GPU, and may put TensorRT first through the config's
``optimization.execution_accelerators``. A CPU model whose config asks for the
``openvino`` CPU accelerator runs on OpenVINO instead (``_load_on_openvino`` says why).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.backends.autocomplete import (
    check_and_fill,
    cuda_device_count,
    gpu_device,
    int_parameter,
)
from conch.backends.base import InstanceSpec, ModelSpec, TensorBackend
from conch.core.datatypes import config_to_wire
from conch.core.errors import InvalidArgument, ModelLoadError
from conch.core.sequence import SequenceSpec

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)

# ONNX tensor type strings, as onnxruntime reports them, -> Triton config data types.
ONNX_TO_CONFIG: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(string)": "TYPE_STRING",
}

# Threads per CPU session when the config does not say (Triton's parameter
# ``intra_op_thread_count``). onnxruntime's own default is one thread per core, which
# oversubscribes a worker that runs several instances or processes on few cores.
DEFAULT_INTRA_OP_THREADS = 1


def _ort() -> Any:
    import onnxruntime

    return onnxruntime


def gpu_available() -> tuple[bool, str]:
    """Whether a KIND_GPU instance can load here, and if not, why."""
    if "CUDAExecutionProvider" not in _ort().get_available_providers():
        return False, (
            "onnxruntime has no CUDAExecutionProvider here "
            "(install conch[gpu] on a machine with an NVIDIA GPU)"
        )
    if cuda_device_count() == 0:
        return False, "no NVIDIA GPU is visible to this process (driver, CUDA_VISIBLE_DEVICES)"
    return True, ""


@dataclass(frozen=True)
class _Tensor:
    """One input or output of an ONNX model, as ``autocomplete.check_and_fill`` reads it."""

    name: str
    dtype: str  # config data type name
    shape: tuple[int, ...]  # -1 where the graph leaves a dimension open (None or a name)


def _io(session: Any, model: str) -> tuple[list[_Tensor], list[_Tensor]]:
    """The model's inputs and outputs with config types and -1 for open dimensions."""

    def one(arg: Any, what: str) -> _Tensor:
        if arg.type not in ONNX_TO_CONFIG:
            raise ModelLoadError(
                f"model '{model}': {what} '{arg.name}' has ONNX type {arg.type}, "
                "which has no Triton data type"
            )
        shape = tuple(
            -1 if d is None or isinstance(d, str) or d < 0 else int(d) for d in arg.shape or ()
        )
        return _Tensor(arg.name, ONNX_TO_CONFIG[arg.type], shape)

    return (
        [one(a, "input") for a in session.get_inputs()],
        [one(a, "output") for a in session.get_outputs()],
    )


def _lists_its_tensors(config: ModelConfig) -> bool:
    """Whether the config names inputs (batch inputs count) and outputs both, so that
    Triton's onnxruntime backend completes nothing in it: no ``max_batch_size``, no
    dynamic batcher. The model is still checked against what the config says."""
    return len(config.input) + len(config.batch_input) > 0 and len(config.output) > 0


def _check_and_fill(
    config: ModelConfig, session: Any, *, fill: bool, default_max_batch_size: int
) -> None:
    """Fill missing config inputs/outputs from the model (``fill``) and check existing ones.

    A sequence model's control and state inputs, and its state outputs, are the server's
    to feed and read: they are neither added to the config nor refused for missing from it
    (a state output the config lists, for clients to see, is checked like any output).
    """
    inputs, outputs = _io(session, config.name)
    spec = SequenceSpec.from_config(config)
    if spec is not None:
        listed = {o.name for o in config.output}
        inputs = [t for t in inputs if t.name not in spec.input_types()]
        outputs = [t for t in outputs if t.name not in spec.output_types() or t.name in listed]
    check_and_fill(
        config,
        inputs,
        outputs,
        fill=fill,
        default_max_batch_size=default_max_batch_size,
        source="the ONNX model",
    )


def _check_sequence_io(config: ModelConfig, session: Any) -> None:
    """The model has each control and state tensor the config's sequence_batching names,
    of its datatype, a control of shape [1] after the batch dimension (Triton's checks)."""
    spec = SequenceSpec.from_config(config)
    if spec is None:
        return
    model = config.name
    inputs, outputs = _io(session, model)
    by_name = {t.name: t for t in inputs}
    produced = {t.name: t for t in outputs}
    batched = config.max_batch_size > 0
    for control in spec.controls:
        t = by_name.get(control.name)
        if t is None:
            raise ModelLoadError(
                f"model '{model}': configuration specified sequence control '{control.name}', "
                "but model does not provide that input"
            )
        dims = list(t.shape[1:] if batched else t.shape)
        if dims != [1] and dims != [-1]:
            raise ModelLoadError(
                f"unable to load model '{model}', sequence control '{control.name}' in model "
                f"has dims {dims} but dims [1] is expected"
            )
        _same_type(model, f"sequence control '{control.name}'", t, control.datatype)
    for state in spec.states:
        for name, found, what in (
            (state.input_name, by_name, "input"),
            (state.output_name, produced, "output"),
        ):
            t = found.get(name)
            if t is None:
                raise ModelLoadError(
                    f"model '{model}': sequence_batching state names {what} '{name}', which "
                    "the ONNX model does not have"
                )
            _same_type(model, f"state {what} '{name}'", t, state.datatype)


def _same_type(model: str, what: str, t: _Tensor, datatype: str) -> None:
    if config_to_wire(t.dtype) != datatype:
        raise ModelLoadError(
            f"unable to load model '{model}', {what}, the model expects data-type "
            f"{config_to_wire(t.dtype)} but the model configuration specifies data-type "
            f"{datatype}"
        )


@dataclass(frozen=True)
class _Arg:
    name: str
    type: str
    shape: tuple[Any, ...]


@dataclass(frozen=True)
class _Signature:
    """A model file's inputs and outputs, as an InferenceSession lists them."""

    inputs: tuple[_Arg, ...]
    outputs: tuple[_Arg, ...]

    def get_inputs(self) -> tuple[_Arg, ...]:
        return self.inputs

    def get_outputs(self) -> tuple[_Arg, ...]:
        return self.outputs


# Repositories are read again on every poll; opening a session each time would reload
# every model's weights. Signatures are kept per file identity (path, inode, mtime, size).
_SIGNATURES: dict[tuple[str, int, int, int], _Signature] = {}


def _open_for_inspection(model_file: Path, model: str) -> _Signature:
    try:
        st = model_file.stat()
    except OSError as exc:
        raise ModelLoadError(f"model '{model}': cannot read {model_file}: {exc}") from None
    key = (str(model_file), st.st_ino, st.st_mtime_ns, st.st_size)
    cached = _SIGNATURES.get(key)
    if cached is not None:
        return cached
    ort = _ort()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(model_file), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelLoadError(
            f"model '{model}': onnxruntime cannot open {model_file}: {exc}"
        ) from None

    def args(items: Any) -> tuple[_Arg, ...]:
        return tuple(_Arg(a.name, a.type, tuple(a.shape or ())) for a in items)

    signature = _Signature(args(session.get_inputs()), args(session.get_outputs()))
    if len(_SIGNATURES) > 1024:
        _SIGNATURES.clear()
    _SIGNATURES[key] = signature
    return signature


class OnnxRuntimeBackend(TensorBackend):
    gpu_available = staticmethod(gpu_available)

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        self.session: Any = None
        self._string_inputs: set[str] = set()
        self._string_outputs: set[str] = set()
        self._output_names: list[str] = []
        self._openvino: Any = None  # the backend running the model for the accelerator

    @classmethod
    def auto_complete(
        cls, config: ModelConfig, model_file: Path | None, *, default_max_batch_size: int
    ) -> None:
        if model_file is None or not model_file.exists():
            raise ModelLoadError(f"model '{config.name}': model file {model_file} not found")
        if _lists_its_tensors(config):
            return  # Triton's backend completes nothing; the model is checked at load
        session = _open_for_inspection(model_file, config.name)
        _check_and_fill(config, session, fill=True, default_max_batch_size=default_max_batch_size)

    def _providers(self) -> list[Any]:
        config = self.spec.config
        if self.instance.kind != "GPU":
            return ["CPUExecutionProvider"]
        device = gpu_device(
            self.spec.name, self.instance.name, self.instance.device_id, gpu_available()
        )
        providers: list[Any] = []
        accel = config.optimization.execution_accelerators.gpu_execution_accelerator
        for acc in accel:
            if acc.name != "tensorrt":
                log.warning(
                    "model '%s': gpu_execution_accelerator '%s' is not supported, ignored",
                    self.spec.name,
                    acc.name,
                )
                continue
            if "TensorrtExecutionProvider" not in _ort().get_available_providers():
                log.warning(
                    "model '%s' asks for TensorRT but onnxruntime has no "
                    "TensorrtExecutionProvider here; using CUDA",
                    self.spec.name,
                )
                continue
            opts: dict[str, Any] = {"device_id": device}
            params = dict(acc.parameters)
            if params.get("precision_mode", "").upper() == "FP16":
                opts["trt_fp16_enable"] = True
            if "max_workspace_size_bytes" in params:
                opts["trt_max_workspace_size"] = int(params["max_workspace_size_bytes"])
            providers.append(("TensorrtExecutionProvider", opts))
        providers.append(("CUDAExecutionProvider", {"device_id": device}))
        providers.append("CPUExecutionProvider")
        return providers

    def load(self) -> None:
        ort = _ort()
        config = self.spec.config
        model_file = self.spec.model_file
        if not model_file.exists():
            raise ModelLoadError(f"model '{self.spec.name}': model file {model_file} not found")
        if _openvino_accelerated(config) and self.instance.kind != "GPU":
            self._load_on_openvino()
            return
        providers = self._providers()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int_parameter(
            config, "intra_op_thread_count", DEFAULT_INTRA_OP_THREADS
        )
        opts.inter_op_num_threads = int_parameter(config, "inter_op_thread_count", 1)
        level = config.optimization.graph.level
        opts.graph_optimization_level = {
            -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        try:
            session = ort.InferenceSession(str(model_file), opts, providers=providers)
        except Exception as exc:
            raise ModelLoadError(
                f"model '{self.spec.name}' version {self.spec.version}: onnxruntime cannot load "
                f"{model_file}: {exc}"
            ) from None
        if self.instance.kind == "GPU" and not any(
            p in session.get_providers()
            for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
        ):
            raise ModelLoadError(
                f"model '{self.spec.name}' asks for KIND_GPU but onnxruntime fell back to "
                f"{session.get_providers()} (CUDA libraries missing?)"
            )
        _check_sequence_io(config, session)
        _check_and_fill(config, session, fill=False, default_max_batch_size=0)
        self._string_inputs = {a.name for a in session.get_inputs() if a.type == "tensor(string)"}
        self._string_outputs = {a.name for a in session.get_outputs() if a.type == "tensor(string)"}
        self._output_names = [a.name for a in session.get_outputs()]
        self.session = session

    def _load_on_openvino(self) -> None:
        """Run the ONNX file on OpenVINO, as Triton runs it on ORT's OpenVINO provider.

        ORT's OpenVINO provider comes only in ``onnxruntime-openvino``, a build of the
        same ``onnxruntime`` module that cannot be installed beside conch's, so the
        accelerator is conch's OpenVINO backend reading the ONNX file itself (the
        ``openvino`` extra). Its threads follow ``intra_op_thread_count``. A KIND_GPU
        instance runs on CUDA as before: Triton applies CPU accelerators to CPU instances.
        """
        from conch.backends.openvino import OnnxOnOpenVino

        threads = int_parameter(self.spec.config, "intra_op_thread_count", DEFAULT_INTRA_OP_THREADS)
        self._openvino = OnnxOnOpenVino(self.spec, self.instance, threads=threads)
        self._openvino.load()

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        if self._openvino is not None:
            return self._openvino.run(inputs, outputs)
        feed = {}
        for name, arr in inputs.items():
            if name in self._string_inputs:
                arr = _bytes_to_str(arr, name)
            feed[name] = arr
        names = list(outputs) or self._output_names
        values = self.session.run(names, feed)
        result = {}
        for name, value in zip(names, values, strict=True):
            if name in self._string_outputs:
                value = _str_to_bytes(np.asarray(value))
            result[name] = value
        return result

    def unload(self) -> None:
        self.session = None
        if self._openvino is not None:
            self._openvino.unload()
            self._openvino = None


def _openvino_accelerated(config: ModelConfig) -> bool:
    """Whether the config asks for the "openvino" CPU accelerator, Triton's one CPU
    accelerator for ONNX models; any other name, or parameters on it, are refused."""
    accel = config.optimization.execution_accelerators.cpu_execution_accelerator
    if not accel:
        return False
    for acc in accel:
        if acc.name != "openvino":
            raise ModelLoadError(
                f"model '{config.name}': unknown cpu_execution_accelerator '{acc.name}'; "
                "onnxruntime has 'openvino'"
            )
        if acc.parameters:
            raise ModelLoadError(
                f"model '{config.name}': cpu_execution_accelerator 'openvino' takes no "
                f"parameters, got {sorted(acc.parameters)}"
            )
    return True


def _bytes_to_str(arr: np.ndarray, name: str) -> np.ndarray:
    """BYTES tensors (object arrays of bytes) -> what onnxruntime takes for tensor(string)."""
    flat = arr.ravel()
    out = np.empty(flat.shape, dtype=object)
    try:
        for i, item in enumerate(flat):
            out[i] = item.decode("utf-8") if isinstance(item, bytes | bytearray) else str(item)
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"input '{name}' is tensor(string) in the model, which takes UTF-8 text only"
        ) from None
    return out.reshape(arr.shape)


def _str_to_bytes(arr: np.ndarray) -> np.ndarray:
    flat = arr.ravel()
    out = np.empty(flat.shape, dtype=object)
    for i, item in enumerate(flat):
        out[i] = item if isinstance(item, bytes) else str(item).encode("utf-8")
    return out.reshape(arr.shape)


__all__ = ["DEFAULT_INTRA_OP_THREADS", "ONNX_TO_CONFIG", "OnnxRuntimeBackend", "gpu_available"]
