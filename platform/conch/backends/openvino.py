"""Models on OpenVINO (Triton's ``openvino`` backend, ``backend: "openvino"``).

The conventions are those of triton-inference-server/openvino_backend: the model file is
``model.xml`` (with its ``model.bin`` beside it) unless ``default_model_filename`` names
another format the ``openvino`` package reads (``model.onnx``, ``model.saved_model``,
``model.pdmodel``, ``model.tflite``); the ``parameters`` are the backend's own
(``OpenVinoParameters``); inputs and outputs may be converted to the config's data types,
and with ``RESHAPE_IO_LAYERS`` the inputs take the config's dims. Models run on the CPU
plugin; ``TARGET_DEVICE`` may name another device only where OpenVINO sees one here.

Where conch departs from Triton, it is to answer rather than fail: Triton fixes the batch
dimension at ``max_batch_size`` and refuses a smaller batch unless ``ENABLE_BATCH_PADDING``
is set, while conch leaves it dynamic so any batch up to ``max_batch_size`` runs as it is
(``SKIP_OV_DYNAMIC_BATCHSIZE: YES`` keeps Triton's fixed batch, for models that cannot take
a dynamic one). Inference runs in FP32 unless ``HINT_BF16`` asks for bfloat16, so answers
do not depend on whether the CPU has bfloat16 units. Each instance uses one inference
thread unless ``INFERENCE_NUM_THREADS`` says otherwise, as conch's other CPU backends do.

``openvino`` is imported only by the processes that read or run such a model; it comes with
the ``openvino`` extra (``pip install conch[openvino]``).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.backends.autocomplete import set_dims, type_name, type_value
from conch.backends.base import InstanceSpec, ModelSpec, TensorBackend
from conch.core.errors import Internal, ModelLoadError
from conch.core.extras import needs_extra

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig, ModelInput, ModelOutput

log = logging.getLogger(__name__)

# OpenVINO element type names (``Type.get_type_name()``) -> Triton config data types.
OV_TO_CONFIG: dict[str, str] = {
    "boolean": "TYPE_BOOL",
    "u8": "TYPE_UINT8",
    "u16": "TYPE_UINT16",
    "u32": "TYPE_UINT32",
    "u64": "TYPE_UINT64",
    "i8": "TYPE_INT8",
    "i16": "TYPE_INT16",
    "i32": "TYPE_INT32",
    "i64": "TYPE_INT64",
    "f16": "TYPE_FP16",
    "f32": "TYPE_FP32",
    "f64": "TYPE_FP64",
    "bf16": "TYPE_BF16",
}
CONFIG_TO_OV = {v: k for k, v in OV_TO_CONFIG.items()}

# Model files Triton's README names, each read by the ``openvino`` package's own frontend.
FORMATS = (".xml", ".onnx", ".saved_model", ".pdmodel", ".tflite")

# Threads per instance when INFERENCE_NUM_THREADS is absent (OpenVINO's default is every
# core, which oversubscribes a worker running several instances or processes).
DEFAULT_THREADS = 1

# The parameters Triton's OpenVINO backend reads (its README, and ``ParseParameters``).
BOOL_KEYS = ("SKIP_OV_DYNAMIC_BATCHSIZE", "ENABLE_BATCH_PADDING", "RESHAPE_IO_LAYERS")
KNOWN_KEYS = (
    "PERFORMANCE_HINT",
    "CPU_EXTENSION_PATH",
    "INFERENCE_NUM_THREADS",
    "COMPILATION_NUM_THREADS",
    "HINT_BF16",
    "NUM_STREAMS",
    "TARGET_DEVICE",
    *BOOL_KEYS,
)
HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")


# (model, parameter) pairs already warned about: a polled repository is read again and
# again, and one warning per model and key is enough.
_warned: set[tuple[str, str]] = set()


def load_openvino() -> Any:
    """The ``openvino`` package, imported with its usage telemetry cut off.

    The package reports usage to Google Analytics, on import and on a conversion error,
    from a process it forks for each report (``openvino_telemetry``), unless a consent file
    in the user's home says no. A server must not phone home, and a fork inside a gevent
    gateway runs a copy of its event loop, which closed the gateway's connections. With
    ``openvino_telemetry`` unimportable, openvino uses its own stub that sends nothing.
    """
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    try:
        import openvino
    except ImportError:
        raise ModelLoadError(needs_extra("the openvino backend", "openvino", "openvino")) from None
    return openvino


@dataclass(frozen=True)
class OpenVinoParameters:
    """What a config's ``parameters`` ask of OpenVINO, checked as Triton's backend checks
    them (its values are case-insensitive), except that a yes/no parameter must say YES or
    NO: Triton reads anything but YES as no, which would hide a typo."""

    device: str = "CPU"
    properties: dict[str, Any] = field(default_factory=dict)  # given to compile_model
    cpu_extension: str = ""
    skip_dynamic_batch: bool = False
    batch_padding: bool = False
    reshape_io: bool = False

    @classmethod
    def from_config(cls, config: ModelConfig) -> OpenVinoParameters:
        model = config.name
        raw = {k: config.parameters[k].string_value for k in config.parameters}
        for key in raw:
            if key.isupper() and key not in KNOWN_KEYS and (model, key) not in _warned:
                _warned.add((model, key))
                log.warning(
                    "model '%s': parameters '%s' is not one of Triton's OpenVINO backend "
                    "(%s); ignored, as Triton ignores it",
                    model,
                    key,
                    ", ".join(KNOWN_KEYS),
                )
        flags = {k: _yes_no(model, k, raw.get(k, "")) for k in BOOL_KEYS}
        props: dict[str, Any] = {
            "INFERENCE_NUM_THREADS": DEFAULT_THREADS,
            "INFERENCE_PRECISION_HINT": "f32",
        }
        for key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
            if raw.get(key):
                props[key] = _count(model, key, raw[key])
        if raw.get("HINT_BF16"):
            if raw["HINT_BF16"].upper() != "YES":
                raise _bad(model, "HINT_BF16", "YES", raw["HINT_BF16"])
            props["INFERENCE_PRECISION_HINT"] = "bf16"
        if raw.get("NUM_STREAMS"):
            value = raw["NUM_STREAMS"].upper()
            if value not in ("AUTO", "NUMA") and not value.isdigit():
                raise _bad(model, "NUM_STREAMS", "AUTO, NUMA or a number", raw["NUM_STREAMS"])
            props["NUM_STREAMS"] = value
        if raw.get("PERFORMANCE_HINT"):
            value = raw["PERFORMANCE_HINT"].upper()
            if value not in HINTS:
                raise _bad(model, "PERFORMANCE_HINT", "/".join(HINTS), raw["PERFORMANCE_HINT"])
            props["PERFORMANCE_HINT"] = value
        return cls(
            device=raw.get("TARGET_DEVICE", "").upper() or "CPU",
            properties=props,
            cpu_extension=raw.get("CPU_EXTENSION_PATH", ""),
            skip_dynamic_batch=flags["SKIP_OV_DYNAMIC_BATCHSIZE"],
            batch_padding=flags["ENABLE_BATCH_PADDING"],
            reshape_io=flags["RESHAPE_IO_LAYERS"],
        )

    @property
    def fixed_batch(self) -> bool:
        """Whether the batch dimension is compiled at ``max_batch_size`` (Triton's way)."""
        return self.skip_dynamic_batch or self.batch_padding


def _bad(model: str, key: str, want: str, got: str) -> ModelLoadError:
    return ModelLoadError(f"model '{model}': parameters '{key}' must be {want}, got '{got}'")


def _yes_no(model: str, key: str, value: str) -> bool:
    if value.upper() in ("", "NO"):
        return False
    if value.upper() == "YES":
        return True
    raise _bad(model, key, "YES or NO", value)


def _count(model: str, key: str, value: str) -> int:
    if not value.isdigit():
        raise _bad(model, key, "a non-negative number", value)
    return int(value)


@dataclass(frozen=True)
class _Port:
    """One input or output of the model: its names, config type and shape (-1: open)."""

    names: frozenset[str]
    name: str  # the name Triton uses (``get_any_name``)
    dtype: str
    shape: tuple[int, ...]
    batch_layout: bool  # its layout names a batch dimension (``N``)


def _port(ov: Any, port: Any, model: str, what: str) -> _Port:
    type_ = port.get_element_type().get_type_name()
    if type_ not in OV_TO_CONFIG:
        raise ModelLoadError(
            f"model '{model}': {what} '{port.get_any_name()}' has OpenVINO type {type_}, "
            "which Triton's OpenVINO backend does not serve"
        )
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        raise ModelLoadError(
            f"model '{model}': {what} '{port.get_any_name()}' has no fixed rank; "
            "reshape the model with known dimensions"
        )
    dims = tuple(-1 if d.is_dynamic else d.get_length() for d in shape)
    layout = ov.layout_helpers.get_layout(port)
    batch = not layout.empty and ov.layout_helpers.has_batch(layout)
    return _Port(frozenset(port.get_names()), port.get_any_name(), OV_TO_CONFIG[type_], dims, batch)


def read_model(model_file: Path, model: str, extension: str = "") -> tuple[Any, Any]:
    """The OpenVINO core and the model read from ``model_file``, or a load error saying why."""
    ov = load_openvino()
    if model_file.suffix not in FORMATS:
        raise ModelLoadError(
            f"model '{model}': the openvino backend reads {', '.join(FORMATS)} model files, "
            f"not '{model_file.name}'"
        )
    if not model_file.exists():
        raise ModelLoadError(f"model '{model}': unable to find '{model_file}'")
    core = ov.Core()
    if extension:
        try:
            core.add_extension(extension)
        except Exception as exc:
            raise ModelLoadError(
                f"model '{model}': CPU_EXTENSION_PATH '{extension}' cannot be loaded: {exc}"
            ) from None
    try:
        return core, core.read_model(str(model_file))
    except Exception as exc:
        raise ModelLoadError(f"model '{model}': OpenVINO cannot read {model_file}: {exc}") from None


def _ports(ov: Any, ov_model: Any, model: str) -> tuple[list[_Port], list[_Port]]:
    return (
        [_port(ov, p, model, "input") for p in ov_model.inputs],
        [_port(ov, p, model, "output") for p in ov_model.outputs],
    )


# Repositories are read again on every poll, and reading a model reads its weights, so
# signatures are kept per file identity (path, inode, mtime, size).
_SIGNATURES: dict[tuple[str, int, int, int], tuple[list[_Port], list[_Port]]] = {}


def _signature(model_file: Path, model: str) -> tuple[list[_Port], list[_Port]]:
    """The model's inputs and outputs, read once per version of its file."""
    try:
        st = model_file.stat()
    except OSError as exc:
        raise ModelLoadError(f"model '{model}': unable to find '{model_file}': {exc}") from None
    key = (str(model_file), st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _SIGNATURES:
        _, ov_model = read_model(model_file, model)
        if len(_SIGNATURES) > 1024:
            _SIGNATURES.clear()
        _SIGNATURES[key] = _ports(load_openvino(), ov_model, model)
    return _SIGNATURES[key]


def auto_complete(
    config: ModelConfig, inputs: list[_Port], outputs: list[_Port], default: int
) -> None:
    """Triton's OpenVINO auto-complete: ``max_batch_size`` only for a model whose every
    input and output has a layout naming its batch dimension (an IR saved with layouts);
    inputs, and outputs, only when the config lists none of them. Each filled dimension is
    the model's, -1 where it is open (Triton writes -1 for every dimension of a shape with
    any open one, which would let a request of the wrong size reach the model)."""
    ports = [*inputs, *outputs]
    if ports and all(p.batch_layout for p in ports):
        if config.max_batch_size == 0:
            config.max_batch_size = max(default, 1)
        if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    batched = config.max_batch_size > 0
    for entries, group in ((config.input, inputs), (config.output, outputs)):
        if len(entries) > 0:
            continue
        for p in group:
            entry = entries.add()
            entry.name = p.name
            entry.data_type = type_value(p.dtype)
            set_dims(entry, list(p.shape[1:] if batched else p.shape))


# OpenVINO's devices that run a model on other devices, named after a colon (or chosen).
VIRTUAL_DEVICES = ("AUTO", "MULTI", "HETERO", "BATCH")


def _check_device(core: Any, device: str, model: str) -> None:
    """TARGET_DEVICE names devices OpenVINO sees here (a virtual device's listed ones)."""
    head, _, listed = device.partition(":")
    wanted = listed.split(",") if head in VIRTUAL_DEVICES else [device]
    seen = {d.split(".")[0] for d in core.available_devices}
    missing = [d for d in wanted if d and d.split(".")[0] not in seen]
    if missing:
        raise ModelLoadError(
            f"model '{model}': TARGET_DEVICE '{device}' is not available here "
            f"(OpenVINO sees {core.available_devices})"
        )


def _dims(entry: ModelInput | ModelOutput) -> list[int]:
    """A config entry's dims as the model takes them (its ``reshape`` when it has one)."""
    return [int(d) for d in (entry.reshape.shape if entry.HasField("reshape") else entry.dims)]


class OpenVinoBackend(TensorBackend):
    """One instance: a compiled model and its one infer request (a drain loop runs one
    batch at a time)."""

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        self.compiled: Any = None
        self._ov: Any = None  # the openvino package, once loaded
        self._request: Any = None
        self._outputs: dict[str, Any] = {}  # config output name -> compiled output port
        self._params = OpenVinoParameters()

    @classmethod
    def auto_complete(
        cls, config: ModelConfig, model_file: Path | None, *, default_max_batch_size: int
    ) -> None:
        if model_file is None:
            raise ModelLoadError(f"model '{config.name}': no model file")
        OpenVinoParameters.from_config(config)  # a bad value shows in the index at once
        inputs, outputs = _signature(model_file, config.name)
        auto_complete(config, inputs, outputs, default_max_batch_size)

    def parameters(self) -> OpenVinoParameters:
        """The OpenVINO settings for this model (from its config's ``parameters``)."""
        return OpenVinoParameters.from_config(self.spec.config)

    def load(self) -> None:
        ov = load_openvino()
        name = self.spec.name
        if self.instance.kind == "GPU":
            raise ModelLoadError(
                f"model '{name}': the openvino backend runs KIND_CPU instances only, as "
                "Triton's does (TARGET_DEVICE chooses OpenVINO's device)"
            )
        params = self.parameters()
        core, ov_model = read_model(self.spec.model_file, name, params.cpu_extension)
        ov_model = self._configure(ov, ov_model, params)
        _check_device(core, params.device, name)
        props = dict(params.properties)
        batched = self.spec.config.max_batch_size > 0
        props["ALLOW_AUTO_BATCHING"] = batched and not params.skip_dynamic_batch
        try:
            self.compiled = core.compile_model(ov_model, params.device, props)
        except Exception as exc:
            raise ModelLoadError(
                f"model '{name}' version {self.spec.version}: OpenVINO cannot compile it on "
                f"{params.device}: {exc}"
            ) from None
        self._params = params
        self._ov = ov
        self._request = self.compiled.create_infer_request()
        by_name = {n: port for port in self.compiled.outputs for n in port.get_names()}
        self._outputs = {o.name: by_name[o.name] for o in self.spec.config.output}

    def _configure(self, ov: Any, ov_model: Any, params: OpenVinoParameters) -> Any:
        """The model checked against the config and fitted to it: the input dims
        (``RESHAPE_IO_LAYERS``) and the batch dimension first, then each input's and
        output's data type, the outputs checked against the reshaped model."""
        config = self.spec.config
        name = self.spec.name
        inputs, _ = _ports(ov, ov_model, name)
        if len(inputs) != len(config.input):
            raise ModelLoadError(
                f"unable to load model '{name}', configuration expects {len(config.input)} "
                f"inputs, model provides {len(inputs)}"
            )
        batch = config.max_batch_size
        lead = 1 if batch > 0 else 0
        shapes: dict[str, list[int]] = {}
        for entry in config.input:
            port = self._port_for(entry, inputs, "input")
            dims = _dims(entry)
            if params.reshape_io:
                if any(d < -1 or d == 0 for d in dims) or len(dims) + lead != len(port.shape):
                    raise ModelLoadError(
                        f"model '{name}': input '{entry.name}' dims {dims} cannot reshape "
                        f"the model's shape {list(port.shape)}"
                    )
                shapes[entry.name] = [*port.shape[:lead], *dims]
            else:
                self._check_dims("input", entry.name, dims, port, exact=False)
            if batch > 0:
                shape = shapes.get(entry.name, list(port.shape))
                shape[0] = batch if params.fixed_batch else -1
                shapes[entry.name] = shape
        if shapes:
            try:
                ov_model.reshape({k: ov.PartialShape(v) for k, v in shapes.items()})
            except Exception as exc:
                hint = (
                    "; if its batch dimension cannot vary, set SKIP_OV_DYNAMIC_BATCHSIZE or "
                    "ENABLE_BATCH_PADDING to YES"
                    if batch > 0 and not params.fixed_batch
                    else ""
                )
                raise ModelLoadError(
                    f"model '{name}': OpenVINO cannot reshape the model to {shapes}: {exc}{hint}"
                ) from None
        _, outputs = _ports(ov, ov_model, name)
        for entry in config.output:
            port = self._port_for(entry, outputs, "output")
            self._check_dims("output", entry.name, _dims(entry), port, exact=True)
        ppp = ov.preprocess.PrePostProcessor(ov_model)
        for what, entries in (("input", config.input), ("output", config.output)):
            for entry in entries:
                dtype = type_name(entry.data_type)
                if dtype not in CONFIG_TO_OV:
                    raise ModelLoadError(
                        f"model '{name}': unsupported datatype {dtype} for {what} '{entry.name}'"
                    )
                side = ppp.input(entry.name) if what == "input" else ppp.output(entry.name)
                side.tensor().set_element_type(getattr(ov.Type, CONFIG_TO_OV[dtype]))
        return ppp.build()

    def _port_for(self, entry: ModelInput | ModelOutput, ports: list[_Port], what: str) -> _Port:
        port = next((p for p in ports if entry.name in p.names), None)
        if port is None:
            raise ModelLoadError(
                f"model '{self.spec.name}': config {what} '{entry.name}' is not an {what} of "
                f"the model (it has {sorted(p.name for p in ports)})"
            )
        return port

    def _check_dims(
        self, what: str, tensor: str, dims: list[int], port: _Port, exact: bool
    ) -> None:
        """Config dims against the model's shape (after the batch dimension when batching),
        as Triton compares them: an open model dimension takes any config dim, and a config
        -1 fits a fixed one only for the input of a model that batches (Triton reshapes it)."""
        batched = self.spec.config.max_batch_size > 0
        want = list(port.shape[1:] if batched else port.shape)
        ok = len(dims) == len(want) and all(
            m == -1 or d == m or (d == -1 and batched and not exact)
            for d, m in zip(dims, want, strict=True)
        )
        if not ok:
            raise ModelLoadError(
                f"model '{self.spec.name}': {what} '{tensor}' dims {dims} do not match the "
                f"model's shape {want}"
                + (
                    f" after the batch dimension (max_batch_size {self.spec.config.max_batch_size})"
                    if batched
                    else ""
                )
            )

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        batch = self.spec.config.max_batch_size
        rows = next(iter(inputs.values())).shape[0] if batch > 0 and inputs else 0
        if batch > 0 and self._params.fixed_batch and rows != batch:
            if not self._params.batch_padding:
                raise Internal(
                    f"expected requests with batch size '{batch}', got '{rows}'... this "
                    "error can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in "
                    "model configuration to 'YES' at a performance cost."
                )
            inputs = {
                n: np.concatenate([a, np.zeros((batch - rows, *a.shape[1:]), a.dtype)])
                for n, a in inputs.items()
            }
        # The request's own tensors over the arrays, not ``infer(dict)``: that one wraps
        # and copies every input and output in Python, which doubled a small model's time
        # a call (bench/README.md, "OpenVINO"). OpenVINO shares only writeable memory, and
        # a request's tensors are views of its read-only message, so those are copied.
        for name, array in inputs.items():
            shared = np.require(array, requirements=("C", "W"))
            self._request.set_tensor(name, self._ov.Tensor(shared, True))
        self._request.infer()
        names = list(outputs) or list(self._outputs)
        out = {n: self._request.get_tensor(self._outputs[n]).data.copy() for n in names}
        if batch > 0 and self._params.fixed_batch:
            out = {n: a[:rows] for n, a in out.items()}
        return out

    def unload(self) -> None:
        self._request = None
        self.compiled = None


class OnnxOnOpenVino(OpenVinoBackend):
    """An ONNX model of the onnxruntime backend run on OpenVINO for its ``openvino`` CPU
    accelerator: the config's ``parameters`` are onnxruntime's, so OpenVINO's settings
    are its defaults here, with ``threads`` inference threads."""

    def __init__(self, spec: ModelSpec, instance: InstanceSpec, *, threads: int) -> None:
        super().__init__(spec, instance)
        self._threads = threads

    def parameters(self) -> OpenVinoParameters:
        props = {"INFERENCE_NUM_THREADS": self._threads, "INFERENCE_PRECISION_HINT": "f32"}
        return OpenVinoParameters(properties=props)


__all__ = [
    "CONFIG_TO_OV",
    "DEFAULT_THREADS",
    "FORMATS",
    "KNOWN_KEYS",
    "OV_TO_CONFIG",
    "OnnxOnOpenVino",
    "OpenVinoBackend",
    "OpenVinoParameters",
    "auto_complete",
    "load_openvino",
    "read_model",
]
