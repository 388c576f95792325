"""TensorRT engines (Triton's ``tensorrt`` backend, platform ``tensorrt_plan``).

``model.plan`` is a serialized engine, built for one TensorRT version and one GPU
architecture. conch runs it with the TensorRT 10 Python runtime: named I/O tensors,
shapes set per run inside the engine's optimization profile, device buffers held as
torch CUDA tensors, and ``execute_async_v3`` on the instance's own torch CUDA stream.

TensorRT and a visible NVIDIA GPU are needed (``conch[gpu]``); without them the model is
unavailable with that reason. The config is checked against the engine at load; a
config that lists no inputs or outputs is completed from the engine where TensorRT can
read it (otherwise the model is unavailable with the reason).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.backends import autocomplete
from conch.backends.autocomplete import type_name
from conch.backends.base import InstanceSpec, ModelSpec, TensorBackend
from conch.backends.pytorch import (
    CONFIG_TO_TORCH,
    numpy_to_torch,
    torch_to_numpy,
)
from conch.core.errors import Internal, InvalidArgument, ModelLoadError

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)

# TensorRT DataType member names -> Triton config data types.
TRT_TO_CONFIG: dict[str, str] = {
    "FLOAT": "TYPE_FP32",
    "HALF": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "INT8": "TYPE_INT8",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
}

INSTALL_HINT = "install conch[gpu]"


def _trt() -> Any:
    import tensorrt

    return tensorrt


def _torch() -> Any:
    import torch

    return torch


def trt_available() -> tuple[bool, str]:
    """Whether TensorRT engines can run here, and if not, why."""
    try:
        trt = _trt()
    except Exception as exc:  # ImportError, or OSError for missing libnvinfer
        return False, f"the tensorrt package cannot be imported ({type(exc).__name__}: {exc})"
    version = str(getattr(trt, "__version__", "0"))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 0
    if major < 10:
        return False, f"TensorRT {version} is installed; conch needs TensorRT 10 or later"
    torch = _torch()
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} here is a CPU-only build"
    if not torch.cuda.is_available():
        return False, "no NVIDIA GPU is visible to this process (driver, CUDA_VISIBLE_DEVICES)"
    return True, ""


def unavailable(model: str, reason: str) -> ModelLoadError:
    return ModelLoadError(
        f"model '{model}' needs TensorRT and an NVIDIA GPU: {reason} ({INSTALL_HINT})"
    )


# --------------------------------------------------------------------------- logging


class _Recent:
    """TensorRT's messages go to Python logging; the last errors are kept for load errors."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: collections.deque[str] = collections.deque(maxlen=8)

    def take(self) -> list[str]:
        with self.lock:
            out = list(self.errors)
            self.errors.clear()
            return out


_recent = _Recent()
_logger: Any = None
_logger_lock = threading.Lock()


def trt_logger() -> Any:
    """One ``trt.ILogger`` per process (TensorRT keeps a pointer to it)."""
    global _logger
    with _logger_lock:
        if _logger is None:
            trt = _trt()
            severity = trt.ILogger.Severity
            levels = {
                severity.INTERNAL_ERROR: logging.CRITICAL,
                severity.ERROR: logging.ERROR,
                severity.WARNING: logging.WARNING,
                severity.INFO: logging.INFO,
                severity.VERBOSE: logging.DEBUG,
            }

            class Logger(trt.ILogger):
                def __init__(self) -> None:
                    trt.ILogger.__init__(self)

                def log(self, sev: Any, msg: str) -> None:
                    level = levels.get(sev, logging.INFO)
                    if level >= logging.ERROR:
                        with _recent.lock:
                            _recent.errors.append(msg)
                    log.log(level, "TensorRT: %s", msg)

            _logger = Logger()
        return _logger


# --------------------------------------------------------------------------- engine I/O


@dataclass(frozen=True)
class EngineTensor:
    """One I/O tensor of an engine, as the config checks need it."""

    name: str
    is_input: bool
    dtype: str | None  # config data type, None when Triton has none (FP8, INT4, ...)
    trt_dtype: str  # TensorRT's name for it
    shape: tuple[int, ...]  # -1 for dynamic dimensions
    profile_min: tuple[int, ...] = ()  # inputs: the optimization profile's range
    profile_max: tuple[int, ...] = ()
    shape_tensor: bool = False


def engine_io(engine: Any, profile: int = 0) -> list[EngineTensor]:
    """The engine's I/O tensors in engine order."""
    trt = _trt()
    tensors = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        trt_dtype = engine.get_tensor_dtype(name)
        dtype_name = getattr(trt_dtype, "name", str(trt_dtype).rpartition(".")[2])
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        lo: tuple[int, ...] = ()
        hi: tuple[int, ...] = ()
        shape_tensor = bool(engine.is_shape_inference_io(name))
        if is_input and not shape_tensor:
            lo_dims, _, hi_dims = engine.get_tensor_profile_shape(name, profile)
            lo = tuple(int(d) for d in lo_dims)
            hi = tuple(int(d) for d in hi_dims)
        tensors.append(
            EngineTensor(
                name=name,
                is_input=is_input,
                dtype=TRT_TO_CONFIG.get(dtype_name),
                trt_dtype=dtype_name,
                shape=shape,
                profile_min=lo,
                profile_max=hi,
                shape_tensor=shape_tensor,
            )
        )
    return tensors


class _Profiles(autocomplete.Hooks):
    """TensorRT's additions to Triton's auto-complete: the optimization profile bounds the
    batch and any dimension the engine leaves dynamic."""

    def __init__(self, model: str, inputs: list[EngineTensor]) -> None:
        self.model = model
        self.inputs = inputs

    def filled_max_batch_size(self, default_max_batch_size: int) -> int:
        # Triton's TensorRT auto-complete: the largest batch the profile allows.
        return max(1, min((t.profile_max[0] for t in self.inputs if t.profile_max), default=0))

    def check_batching(self, config: ModelConfig) -> None:
        for t in self.inputs:
            if t.profile_max and t.profile_max[0] < config.max_batch_size:
                raise ModelLoadError(
                    f"model '{self.model}': max_batch_size is {config.max_batch_size} but the "
                    f"engine's optimization profile allows input '{t.name}' a batch of at "
                    f"most {t.profile_max[0]}"
                )
            if t.profile_min and t.profile_min[0] > 1:
                log.warning(
                    "model '%s': the engine's profile needs a batch of at least %d for "
                    "input '%s'; smaller batches will fail",
                    self.model,
                    t.profile_min[0],
                    t.name,
                )

    def dims_fit(self, tensor: Any, have: list[int], batched: bool) -> bool:
        if not tensor.profile_min:
            return True
        # A fixed config dimension where the engine's is dynamic must lie in the profile.
        lo = tensor.profile_min[1:] if batched else tensor.profile_min
        hi = tensor.profile_max[1:] if batched else tensor.profile_max
        return all(h == -1 or lo_d <= h <= hi_d for h, lo_d, hi_d in zip(have, lo, hi, strict=True))

    def shape_note(self, tensor: Any) -> str:
        if not tensor.profile_min:
            return ""
        return f", profile {list(tensor.profile_min)}..{list(tensor.profile_max)}"


def check_and_fill(
    config: ModelConfig, tensors: list[EngineTensor], *, fill: bool, default_max_batch_size: int
) -> None:
    """Check the config against the engine's tensors; with ``fill``, add what it leaves out
    (``autocomplete.check_and_fill`` with the profile checks).

    Raises ``ModelLoadError`` naming the model and the tensor.
    """
    model = config.name
    for t in tensors:
        if t.shape_tensor:
            raise ModelLoadError(
                f"model '{model}': engine tensor '{t.name}' is a shape tensor, which conch's "
                "tensorrt backend does not support"
            )
        if t.dtype is None:
            raise ModelLoadError(
                f"model '{model}': engine tensor '{t.name}' is {t.trt_dtype}, which has no "
                "Triton data type"
            )
    inputs = [t for t in tensors if t.is_input]
    autocomplete.check_and_fill(
        config,
        inputs,
        [t for t in tensors if not t.is_input],
        fill=fill,
        default_max_batch_size=default_max_batch_size,
        source="the engine",
        hooks=_Profiles(model, inputs),
    )


def _read_engine(model_file: Path, model: str, device: int) -> tuple[Any, Any]:
    """Deserialize ``model_file`` on GPU ``device``; returns (runtime, engine)."""
    trt = _trt()
    torch = _torch()
    try:
        data = model_file.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"model '{model}': cannot read {model_file}: {exc}") from None
    with torch.cuda.device(device):
        runtime = trt.Runtime(trt_logger())
        _recent.take()
        engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        errors = "; ".join(_recent.take()) or "no message from TensorRT"
        raise ModelLoadError(
            f"model '{model}': TensorRT {trt.__version__} cannot deserialize {model_file} "
            f"(an engine runs only on the TensorRT version and GPU it was built for): {errors}"
        )
    return runtime, engine


# Engines inspected for auto-complete, by file identity: a rescan does not deserialize
# again (and does not touch CUDA in a process that forked after the first look).
_inspected: dict[tuple[str, int, int], list[EngineTensor]] = {}


def _inspect(model_file: Path, model: str) -> list[EngineTensor]:
    st = os.stat(model_file)
    key = (str(model_file.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _inspected:
        _, engine = _read_engine(model_file, model, 0)
        _inspected[key] = engine_io(engine, 0)
        del engine
    return _inspected[key]


def _profile_index(config: ModelConfig, instance: InstanceSpec) -> int:
    """The optimization profile the instance's group names (Triton's ``profile``), else 0."""
    for group in config.instance_group:
        if instance.name.startswith(f"{group.name}_") and group.profile:
            raw = group.profile[0]
            try:
                return int(raw)
            except ValueError:
                raise ModelLoadError(
                    f"model '{config.name}': instance_group '{group.name}' field profile "
                    f"holds '{raw}', not a profile index"
                ) from None
    return 0


class TensorRTBackend(TensorBackend):
    # The repository asks this to decide KIND_AUTO: GPU only where engines can run.
    gpu_available = staticmethod(trt_available)

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        self.runtime: Any = None
        self.engine: Any = None
        self.context: Any = None
        self.stream: Any = None
        self.device: Any = None
        self._inputs: dict[str, EngineTensor] = {}
        self._outputs: dict[str, EngineTensor] = {}

    @classmethod
    def auto_complete(
        cls, config: ModelConfig, model_file: Path | None, *, default_max_batch_size: int
    ) -> None:
        if model_file is None or not model_file.exists():
            raise ModelLoadError(f"model '{config.name}': model file {model_file} not found")
        ok, reason = trt_available()
        if not ok:
            if config.input and config.output:
                return  # complete: the worker that loads it checks it (and says why not)
            raise unavailable(config.name, reason)
        try:
            tensors = _inspect(model_file, config.name)
        except ModelLoadError:
            if config.input and config.output:
                return  # e.g. CUDA unusable in this (forked) process; the worker checks
            raise
        check_and_fill(config, tensors, fill=True, default_max_batch_size=default_max_batch_size)

    def load(self) -> None:
        config = self.spec.config
        name = self.spec.name
        ok, reason = trt_available()
        if not ok:
            raise unavailable(name, reason)
        if self.instance.kind == "CPU":
            raise ModelLoadError(
                f"model '{name}' instance '{self.instance.name}' is KIND_CPU but a TensorRT "
                "engine runs on an NVIDIA GPU; use KIND_GPU (or KIND_AUTO)"
            )
        torch = _torch()
        device_id = self.instance.device_id
        count = torch.cuda.device_count()
        if device_id >= count:
            raise ModelLoadError(
                f"model '{name}' instance '{self.instance.name}' asks for GPU {device_id} but "
                f"{count} GPU(s) are visible"
            )
        model_file = self.spec.model_file
        if not model_file.exists():
            raise ModelLoadError(f"model '{name}': model file {model_file} not found")
        profile = _profile_index(config, self.instance)
        runtime, engine = _read_engine(model_file, name, device_id)
        if profile >= engine.num_optimization_profiles:
            raise ModelLoadError(
                f"model '{name}' instance '{self.instance.name}' asks for optimization profile "
                f"{profile} but the engine has {engine.num_optimization_profiles}"
            )
        tensors = engine_io(engine, profile)
        check_and_fill(config, tensors, fill=False, default_max_batch_size=0)
        for entry in [*config.input, *config.output]:
            if type_name(entry.data_type) not in CONFIG_TO_TORCH:
                raise ModelLoadError(
                    f"model '{name}': tensor '{entry.name}' is {type_name(entry.data_type)}, "
                    "which the tensorrt backend cannot hold in a torch buffer"
                )
        device = torch.device("cuda", device_id)
        with torch.cuda.device(device):
            context = engine.create_execution_context()
            if context is None:
                errors = "; ".join(_recent.take()) or "out of GPU memory?"
                raise ModelLoadError(
                    f"model '{name}': TensorRT cannot create an execution context: {errors}"
                )
            stream = torch.cuda.Stream(device=device)
            if profile:
                context.set_optimization_profile_async(profile, stream.cuda_stream)
                stream.synchronize()
        self._inputs = {t.name: t for t in tensors if t.is_input}
        self._outputs = {t.name: t for t in tensors if not t.is_input}
        self.runtime, self.engine, self.context = runtime, engine, context
        self.stream, self.device = stream, device
        log.info(
            "model '%s' instance '%s': TensorRT engine on %s, profile %d, inputs %s, outputs %s",
            name,
            self.instance.name,
            device,
            profile,
            sorted(self._inputs),
            sorted(self._outputs),
        )

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        torch = _torch()
        model = self.spec.name
        batched = self.spec.config.max_batch_size > 0
        batch = next(iter(inputs.values())).shape[0] if batched and inputs else None
        missing = sorted(set(self._inputs) - set(inputs))
        if missing:
            raise InvalidArgument(f"model '{model}': missing input(s) {missing}")
        context = self.context
        keep: list[Any] = []  # device buffers live until the copies back are done
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            for name, arr in inputs.items():
                t = self._inputs.get(name)
                if t is None:
                    raise InvalidArgument(f"unexpected input '{name}' for model '{model}'")
                self._check_profile(t, arr.shape)
                host = numpy_to_torch(arr, CONFIG_TO_TORCH[t.dtype or ""])
                buf = host.to(self.device, non_blocking=True).contiguous()
                keep.append((host, buf))
                if not context.set_input_shape(name, tuple(arr.shape)):
                    raise InvalidArgument(
                        f"model '{model}': TensorRT refuses shape {list(arr.shape)} for input "
                        f"'{name}': {'; '.join(_recent.take())}"
                    )
                context.set_tensor_address(name, buf.data_ptr())
            results: dict[str, Any] = {}
            for name, t in self._outputs.items():
                dims = tuple(int(d) for d in context.get_tensor_shape(name))
                if any(d < 0 for d in dims):
                    raise Internal(
                        f"model '{model}': output '{name}' has a data-dependent shape {list(dims)}, "
                        "which conch's tensorrt backend does not support"
                    )
                dtype = getattr(torch, CONFIG_TO_TORCH[t.dtype or ""])
                buf = torch.empty(dims, dtype=dtype, device=self.device)
                context.set_tensor_address(name, buf.data_ptr())
                results[name] = buf
            if not context.execute_async_v3(self.stream.cuda_stream):
                raise Internal(
                    f"model '{model}': TensorRT failed to execute: "
                    f"{'; '.join(_recent.take()) or 'no message'}"
                )
            wanted = outputs or list(self._outputs)
            out: dict[str, np.ndarray] = {}
            for name in wanted:
                if name not in results:
                    raise InvalidArgument(f"model '{model}' has no output '{name}'")
                arr = torch_to_numpy(results[name])  # waits for the stream
                if batch is not None and (arr.ndim == 0 or arr.shape[0] != batch):
                    raise Internal(
                        f"model '{model}': output '{name}' has shape {list(arr.shape)}, but the "
                        f"batch has {batch} row(s)"
                    )
                out[name] = arr
        del keep
        return out

    def _check_profile(self, t: EngineTensor, shape: tuple[int, ...]) -> None:
        if not t.profile_min:
            return
        ok = len(shape) == len(t.profile_min) and all(
            lo <= d <= hi for d, lo, hi in zip(shape, t.profile_min, t.profile_max, strict=True)
        )
        if not ok:
            raise InvalidArgument(
                f"model '{self.spec.name}': input '{t.name}' has shape {list(shape)}, outside "
                f"the engine's optimization profile {list(t.profile_min)}..{list(t.profile_max)}"
            )

    def unload(self) -> None:
        # Context before engine before runtime, as TensorRT wants them released.
        self.context = None
        self.engine = None
        self.runtime = None
        self.stream = None
        if self.device is not None:
            _torch().cuda.empty_cache()
        self.device = None


__all__ = [
    "TRT_TO_CONFIG",
    "EngineTensor",
    "TensorRTBackend",
    "check_and_fill",
    "engine_io",
    "trt_available",
]
