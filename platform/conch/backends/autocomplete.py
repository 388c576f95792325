"""What the backends share for Triton's auto-complete and config reading.

``check_and_fill`` is Triton's auto-complete for a backend that can read its model's
signature (onnxruntime from the ONNX graph, tensorrt from the engine): check every config
input and output against the model, and with ``fill`` complete what the config leaves out
(``max_batch_size`` by Triton's full-rank rule, missing entries, ``data_type``, ``dims``,
and ``dynamic_batching`` for a model that batches and names no scheduler).
A backend adds its own checks through ``Hooks`` (TensorRT: its optimization profiles).

Also here: the config's data type names, Triton's scalar rule for ``dims``, reading an
integer ``parameters`` entry, and the CUDA device count, each written once.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from conch.core.errors import ModelLoadError
from conch.core.model_config import model_config_pb2

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig, ModelInput, ModelOutput


def type_name(value: int) -> str:
    """A config ``data_type`` number as its name (``11`` -> ``"TYPE_FP32"``)."""
    return model_config_pb2().DataType.Name(value)


def type_value(name: str) -> int:
    """A config data type name as its number (``"TYPE_FP32"`` -> ``11``)."""
    return model_config_pb2().DataType.Value(name)


def set_dims(entry: ModelInput | ModelOutput, dims: list[int]) -> None:
    """Config dims for a model shape; a scalar is ``dims: [1]`` reshaped to ``[]``, as in Triton."""
    if dims:
        entry.dims.extend(dims)
    else:
        entry.dims.append(1)
        entry.reshape.SetInParent()


def int_parameter(config: ModelConfig, key: str, default: int) -> int:
    """The config's ``parameters { key: ... }`` as an integer, ``default`` when absent.

    Whitespace around the number is accepted, as Triton accepts it (its backends parse
    these with ``std::stoi``, which skips leading whitespace and stops at trailing; see
    ``ParseIntValue`` in triton-inference-server/backend ``src/backend_common.cc``). Text
    after the number is refused rather than ignored as ``stoi`` would: ``"4 threads"`` is
    more likely a mistake than a 4. The error quotes the value as written.
    """
    if key not in config.parameters:
        return default
    raw = config.parameters[key].string_value
    try:
        return int(raw.strip())
    except ValueError:
        raise ModelLoadError(
            f"model '{config.name}': parameters '{key}' must be an integer, got '{raw}'"
        ) from None


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices the driver shows this process (honours CUDA_VISIBLE_DEVICES).

    Asked of the driver library itself, so no CUDA toolkit or runtime is needed to ask.
    """
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def gpu_device(model: str, instance: str, device: int, available: tuple[bool, str]) -> int:
    """The GPU a KIND_GPU ``instance`` of ``model`` runs on (``device``): a load error when
    its backend cannot use a GPU here (``available``, the backend's own check and why
    not) or no such device is visible."""
    ok, reason = available
    if not ok:
        raise ModelLoadError(f"model '{model}' asks for KIND_GPU but {reason}")
    if device >= cuda_device_count():
        raise ModelLoadError(
            f"model '{model}' instance '{instance}' asks for GPU {device} "
            f"but {cuda_device_count()} GPU(s) are visible"
        )
    return device


# -- auto-complete ------------------------------------------------------------------------


class ModelTensor(Protocol):
    """One input or output as the model declares it."""

    @property
    def name(self) -> str: ...

    @property
    def dtype(self) -> str:  # the config data type name, e.g. "TYPE_FP32"
        ...

    @property
    def shape(self) -> Sequence[int]:  # -1 for a dimension the model leaves open
        ...


class Hooks:
    """What a backend adds to ``check_and_fill``; these defaults add nothing."""

    def filled_max_batch_size(self, default_max_batch_size: int) -> int:
        """``max_batch_size`` for a config that leaves it out, when the model can batch."""
        return default_max_batch_size

    def check_batching(self, config: ModelConfig) -> None:
        """More checks once ``max_batch_size`` (> 0) is known to fit the model's shapes."""

    def dims_fit(self, tensor: Any, have: list[int], batched: bool) -> bool:
        """Whether config dims ``have`` that agree with the model's shape also fit otherwise."""
        return True

    def shape_note(self, tensor: Any) -> str:
        """Appended to a dims mismatch, after the model's shape."""
        return ""


def check_and_fill(
    config: ModelConfig,
    inputs: Sequence[ModelTensor],
    outputs: Sequence[ModelTensor],
    *,
    fill: bool,
    default_max_batch_size: int,
    source: str,
    hooks: Hooks | None = None,
) -> None:
    """Check the config against the model's tensors; with ``fill``, add what it leaves out.

    ``source`` names the model in messages ("the ONNX model", "the engine"). Raises
    ``ModelLoadError`` naming the model and the tensor.
    """
    hooks = hooks or Hooks()
    model = config.name
    tensors = [*inputs, *outputs]
    can_batch = bool(tensors) and all(t.shape and t.shape[0] < 0 for t in tensors)

    if fill and config.max_batch_size == 0 and can_batch and default_max_batch_size > 0:
        # Triton's rule: a model whose every input and output starts with a variable
        # dimension batches. An existing entry whose dims already cover the full shape
        # says the author meant max_batch_size 0, so keep it.
        full_rank = any(
            len(entry.dims) == len(t.shape)
            for entries, group in ((config.input, inputs), (config.output, outputs))
            for entry in entries
            for t in group
            if entry.name == t.name and entry.dims and not entry.HasField("reshape")
        )
        if not full_rank:
            config.max_batch_size = hooks.filled_max_batch_size(default_max_batch_size)

    if config.max_batch_size > 0:
        fixed = next((t for t in tensors if not t.shape or t.shape[0] >= 0), None)
        if fixed is not None:
            first = (
                "has no dimensions" if not fixed.shape else f"has first dimension {fixed.shape[0]}"
            )
            raise ModelLoadError(
                f"model '{model}': max_batch_size is {config.max_batch_size} but {source} "
                f"cannot batch: tensor '{fixed.name}' {first}, not a dynamic batch dimension; "
                "set max_batch_size: 0"
            )
        hooks.check_batching(config)
        if fill and config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            # These backends turn on Triton's dynamic batcher for a model that batches
            # and names no scheduler (the Python and PyTorch backends do not).
            config.dynamic_batching.SetInParent()

    batched = config.max_batch_size > 0
    for what, entries, group in (
        ("input", config.input, inputs),
        ("output", config.output, outputs),
    ):
        by_name = {t.name: t for t in group}
        for entry in entries:
            t = by_name.get(entry.name)
            if t is None:
                raise ModelLoadError(
                    f"model '{model}': config {what} '{entry.name}' is not an {what} of "
                    f"{source} (it has {sorted(by_name)})"
                )
            _check_entry(config, what, entry, t, fill=fill, source=source, hooks=hooks)
        present = {entry.name for entry in entries}
        for t in group:
            if t.name in present:
                continue
            if not fill:
                if what == "input":
                    raise ModelLoadError(
                        f"model '{model}': {source} has input '{t.name}', which the config "
                        "does not list"
                    )
                continue
            entry = entries.add()
            entry.name = t.name
            entry.data_type = type_value(t.dtype)
            set_dims(entry, list(t.shape[1:] if batched else t.shape))


def _check_entry(
    config: ModelConfig,
    what: str,
    entry: ModelInput | ModelOutput,
    t: ModelTensor,
    *,
    fill: bool,
    source: str,
    hooks: Hooks,
) -> None:
    """One config input or output against the model's tensor of that name."""
    model = config.name
    batched = config.max_batch_size > 0
    if entry.data_type == 0 and fill:
        entry.data_type = type_value(t.dtype)
    elif type_name(entry.data_type) != t.dtype:
        raise ModelLoadError(
            f"model '{model}': {what} '{entry.name}' field data_type is "
            f"{type_name(entry.data_type)} but {source} has {t.dtype}"
        )
    want = list(t.shape[1:] if batched else t.shape)
    if not entry.dims and fill and not entry.HasField("reshape"):
        set_dims(entry, want)
        return
    have = list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)
    field = "reshape.shape" if entry.HasField("reshape") else "dims"
    ok = len(have) == len(want) and all(m == -1 or h == m for h, m in zip(have, want, strict=True))
    if not (ok and hooks.dims_fit(t, have, batched)):
        batch = (
            f" after the batch dimension (max_batch_size {config.max_batch_size})"
            if batched
            else ""
        )
        raise ModelLoadError(
            f"model '{model}': {what} '{entry.name}' field {field} is {have} but "
            f"{source}'s shape{batch} is {want}{hooks.shape_note(t)}"
        )


__all__ = [
    "Hooks",
    "ModelTensor",
    "check_and_fill",
    "cuda_device_count",
    "int_parameter",
    "set_dims",
    "type_name",
    "type_value",
]
