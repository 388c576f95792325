"""``triton_python_backend_utils`` for conch: what a Triton Python model imports as ``pb_utils``.

The python backend registers this module in ``sys.modules`` under Triton's name before it
imports a ``model.py``, so ``import triton_python_backend_utils as pb_utils`` works in
model files written for Triton. It is written from the API as Triton documents it:
tensors, requests and responses, errors, the config helpers, ``ModelConfig`` for
``auto_complete_config``, ``Logger`` and custom metrics (``MetricFamily``). Where Triton's
bindings take a string, ``bytes`` holding UTF-8 text is taken too, as they take it (a BLS
model often names its target with an element of a TYPE_STRING input).

Differences from Triton, all of them because conch runs the model inside its worker
process rather than in a stub process with shared memory:

- Tensors always live in CPU memory (``is_cpu()`` is True). ``Tensor.from_dlpack`` copies
  a GPU tensor to the CPU (through its ``cpu()`` method) or refuses it.
- BF16 tensors are Triton's: ``as_numpy()`` refuses them (numpy has no bfloat16) and
  ``to_dlpack``/``from_dlpack`` carry them to and from torch's ``bfloat16`` (torch does
  the conversion); ``triton_to_numpy_type`` has no numpy type for BF16. Inside, conch
  holds their ``uint16`` bit patterns, as it carries BF16 everywhere, and a model may
  still return a ``Tensor`` of such bits for a BF16 output.
- Business logic scripting (``InferenceRequest(model_name=...).exec()`` and
  ``async_exec``) goes through the named model's queue, by the BLS port the worker hands
  the model (``ModelSpec.bls``, ``conch.frontend.bls``'s client), which the python backend
  makes current (``BLS_PORT``) while ``initialize``, ``execute`` and ``finalize`` run. It
  answers every failure with an error response, as
  Triton does; a call to a model already waiting on the caller (itself, or A -> B -> A)
  is refused at once instead of deadlocking. ``exec(decoupled=True)`` returns a
  ``ResponseIterator`` of the called model's responses as they come (a caller that drops
  it before the last one cancels the request, where Triton's would wait for the rest;
  the called model's first error response is its last, as conch ends a decoupled
  request there). ``is_model_ready`` reads the workers' registry;
  ``load_model`` and ``unload_model`` do what the model control API does (explicit mode
  only, as in Triton) and raise ``TritonModelException`` when it fails.
- Response ``parameters`` are accepted and kept on the object; the HTTP reply does not
  carry them.
- The response sender (``request.get_response_sender()``) follows Triton's rules and
  errors, with two differences. A decoupled model's request ends at its first error
  response, whatever its flags (conch's replies carry no error in mid-stream), and the
  sender is closed from then on. A model that is not decoupled must send its response
  and the final flag before ``execute`` returns.
- Custom metrics live in the worker process (``conch.core.custom_metrics``), which
  publishes them for the gateways' metrics port; ``Metric.value()`` is that worker's part
  of the sum ``/metrics`` shows when several workers serve the model.

The module imports nothing from conch but the core (Triton's error codes, the BLS request,
the custom metrics registry), so it can be read and tested on its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import enum
import functools
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from conch.core import custom_metrics
from conch.core.errors import TRITON_CODES, ConchError, InvalidArgument, triton_code
from conch.core.model_spec import BlsRequest

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "LogLevel",
    "Logger",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

# -- flags and memory kinds ---------------------------------------------------------------

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

_NO_WORKER = (
    "business logic scripting (calling another model from a Python model) needs a conch "
    "worker, and this process has no Python model loaded by one (BLS runs from a model's "
    "initialize, execute or finalize, or from threads the model starts, in a conch worker)"
)

# The BLS port of the model instance running now (``conch.core.model_spec.BlsPort``: the
# worker's ``conch.frontend.bls.BlsClient``, with ``infer``, ``is_ready``, ``load`` and
# ``unload``). The python backend sets it around initialize, execute and finalize, from the
# spec it was given; async_exec's threads get it with the caller's context. No process-wide
# client: a model reaches only the port it was handed.
_UNSET: Any = object()
BLS_PORT: contextvars.ContextVar[Any] = contextvars.ContextVar("conch_bls_port", default=_UNSET)

# A thread the model starts itself (a ThreadPoolExecutor issuing BLS calls, say) runs in a
# fresh context, without BLS_PORT: Triton serves such calls, so conch does too, through the
# port the worker handed this process's Python backends (one BlsClient per worker process;
# they all carry the same one). Such a call inherits no deadline and no call chain (the
# client logs a warning saying so). A backend with no port (outside a worker) sets
# BLS_PORT to None explicitly, so its calls never fall back to another instance's port.
_thread_port: Any = None
_port_users: dict[int, int] = {}  # id(port) -> instances loaded with it
_port_lock = threading.Lock()


def offer_port_to_threads(port: Any) -> None:
    """An instance with a BLS port loaded: its model's own threads may use the port."""
    global _thread_port
    if port is None:
        return
    with _port_lock:
        _port_users[id(port)] = _port_users.get(id(port), 0) + 1
        _thread_port = port


def withdraw_port_from_threads(port: Any) -> None:
    """That instance unloaded: once no loaded instance has the port, threads lose it."""
    global _thread_port
    if port is None:
        return
    with _port_lock:
        left = _port_users.get(id(port), 0) - 1
        if left > 0:
            _port_users[id(port)] = left
            return
        _port_users.pop(id(port), None)
        if _thread_port is port:
            _thread_port = None


def _current_port() -> Any:
    port = BLS_PORT.get()
    return _thread_port if port is _UNSET else port


# The threads async_exec waits in. Unlike the port, this is a resource of the process, not
# a client: every instance's async_exec calls share one bounded pool (BLS_THREADS blocked
# waits at most), and each call carries its own caller's context (and port) into it.
_bls_pool: ThreadPoolExecutor | None = None
_bls_pool_lock = threading.Lock()
BLS_THREADS = 64  # async_exec calls in flight at once, per worker process


def _bls_threads() -> ThreadPoolExecutor:
    """The threads ``async_exec`` waits in (a BLS call blocks until its reply)."""
    global _bls_pool
    if _bls_pool is None:
        with _bls_pool_lock:
            if _bls_pool is None:
                _bls_pool = ThreadPoolExecutor(BLS_THREADS, thread_name_prefix="conch-bls")
    return _bls_pool


def _parameters_json(parameters: dict[str, Any] | str | None) -> str:
    """Parameters as the JSON text ``parameters()`` returns (``"{}"`` for none)."""
    if isinstance(parameters, str):
        return parameters
    return json.dumps(parameters) if parameters else "{}"


def _text(value: Any, what: str) -> str:
    """A string argument as Triton's bindings take it: ``str``, or ``bytes`` holding UTF-8
    text (what a BYTES tensor's ``as_numpy()`` elements are, e.g. a model name sent as a
    TYPE_STRING input)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError(f"{what} must be UTF-8 text, got the bytes {bytes(value)!r}") from None
    raise TypeError(f"{what} must be a string, got {type(value).__name__} {value!r}")


def _texts(values: Iterable[Any], what: str) -> list[str]:
    """A list of strings given as a list, tuple or other iterable (not one bare string)."""
    if isinstance(values, str | bytes | bytearray | memoryview):
        raise TypeError(f"{what} must be a list of strings, not the single string {values!r}")
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{what} must be a list of strings, got {type(values).__name__}") from None
    return [_text(v, f"each of {what}") for v in items]


class PreferredMemory:
    """Where a BLS caller would like output tensors (accepted; conch keeps them on the CPU)."""

    def __init__(
        self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0
    ) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


# -- datatypes ----------------------------------------------------------------------------

# Triton's data type enum (the config's TYPE_* values are the same numbers).
_TYPES: tuple[tuple[str, int, Any], ...] = (
    ("TYPE_BOOL", 1, np.bool_),
    ("TYPE_UINT8", 2, np.uint8),
    ("TYPE_UINT16", 3, np.uint16),
    ("TYPE_UINT32", 4, np.uint32),
    ("TYPE_UINT64", 5, np.uint64),
    ("TYPE_INT8", 6, np.int8),
    ("TYPE_INT16", 7, np.int16),
    ("TYPE_INT32", 8, np.int32),
    ("TYPE_INT64", 9, np.int64),
    ("TYPE_FP16", 10, np.float16),
    ("TYPE_FP32", 11, np.float32),
    ("TYPE_FP64", 12, np.float64),
    ("TYPE_STRING", 13, np.object_),
    ("TYPE_BF16", 14, None),  # numpy has no bfloat16; conch carries it as uint16 bits
)
_NAME_TO_NUMPY = {name: np_type for name, _, np_type in _TYPES}
_VALUE_TO_NUMPY = {value: np_type for _, value, np_type in _TYPES}
_NAME_TO_VALUE = {name: value for name, value, _ in _TYPES}
_NUMPY_TO_VALUE = {
    np.dtype(np_type): value for _, value, np_type in _TYPES if np_type not in (None, np.object_)
}
_BYTES_VALUE = 13


def _type_name(data_type: str) -> str:
    """``TYPE_FP32``, ``FP32`` or ``BYTES`` as the config's enum name."""
    if not isinstance(data_type, str):
        raise TypeError(f"a data type name is a string such as 'TYPE_FP32', got {data_type!r}")
    name = data_type.strip().upper()
    if not name.startswith("TYPE_"):
        name = "TYPE_" + name
    if name == "TYPE_BYTES":
        name = "TYPE_STRING"
    if name not in _NAME_TO_VALUE:
        raise ValueError(
            f"unknown data type '{data_type}'; expected one of {sorted(_NAME_TO_VALUE)}"
        )
    return name


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type for a config data type name: ``"TYPE_FP32"`` -> ``np.float32``.

    ``TYPE_STRING`` (BYTES) is ``np.object_``; ``TYPE_BF16`` has no numpy type (None).
    """
    return _NAME_TO_NUMPY[_type_name(triton_type_string)]


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type for Triton's numeric data type (``11`` -> ``np.float32``), else None."""
    return _VALUE_TO_NUMPY.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """Triton's numeric data type for a numpy type or dtype; strings and objects are BYTES."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OSU":
        return _BYTES_VALUE
    return _NUMPY_TO_VALUE.get(dtype.newbyteorder("=") if dtype.byteorder == ">" else dtype)


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    """BYTES elements as Triton's raw form: a uint32 little-endian length, then the bytes.

    Returns a 0-d object array holding the serialized ``bytes`` (an empty object array
    for an empty input), as tritonclient's function of the same name does.
    """
    arr = np.asarray(input_tensor)
    if arr.size == 0:
        return np.empty([0], dtype=np.object_)
    if arr.dtype.kind not in "OSU":
        raise TypeError(f"cannot serialize a {arr.dtype} tensor as BYTES")
    parts = []
    for item in arr.ravel(order="C"):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif isinstance(item, bytearray | memoryview | np.bytes_):
            item = bytes(item)
        elif not isinstance(item, bytes):
            item = str(item).encode("utf-8")
        parts.append(len(item).to_bytes(4, "little"))
        parts.append(item)
    return np.asarray(b"".join(parts), dtype=np.object_)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Triton's raw BYTES form back to a 1-D object array of ``bytes``."""
    data = bytes(
        encoded_tensor.item() if isinstance(encoded_tensor, np.ndarray) else encoded_tensor
    )
    items: list[bytes] = []
    offset = 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise ValueError("truncated BYTES tensor: a length prefix is cut short")
        length = int.from_bytes(data[offset : offset + 4], "little")
        offset += 4
        if offset + length > len(data):
            raise ValueError(f"truncated BYTES tensor: an element claims {length} bytes")
        items.append(data[offset : offset + length])
        offset += length
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


# -- errors -------------------------------------------------------------------------------


class TritonModelException(Exception):
    """The exception a model raises from ``initialize``, ``execute`` or ``finalize``."""


class TritonError(Exception):
    """An error for one response: ``InferenceResponse(error=TritonError("...", code))``."""

    # Triton's codes, from the core's table (conch.core.errors.TRITON_CODES).
    UNKNOWN = TRITON_CODES["UNKNOWN"]
    INTERNAL = TRITON_CODES["INTERNAL"]
    NOT_FOUND = TRITON_CODES["NOT_FOUND"]
    INVALID_ARG = TRITON_CODES["INVALID_ARG"]
    UNAVAILABLE = TRITON_CODES["UNAVAILABLE"]
    UNSUPPORTED = TRITON_CODES["UNSUPPORTED"]
    ALREADY_EXISTS = TRITON_CODES["ALREADY_EXISTS"]
    CANCELLED = TRITON_CODES["CANCELLED"]

    _NAMES = tuple(sorted(TRITON_CODES, key=TRITON_CODES.__getitem__))

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        message = _text(message, "a TritonError message")
        super().__init__(message)
        code = int(code)
        if not 0 <= code < len(self._NAMES):
            raise ValueError(f"unknown TritonError code {code}")
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def code_name(self) -> str:
        """The code's name, e.g. ``"INVALID_ARG"`` (conch addition)."""
        return self._NAMES[self._code]

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code=TritonError.{self.code_name()})"


# -- tensors ------------------------------------------------------------------------------

_CAPSULE_GET_POINTER = ctypes.pythonapi.PyCapsule_GetPointer
_CAPSULE_GET_POINTER.restype = ctypes.c_void_p
_CAPSULE_GET_POINTER.argtypes = [ctypes.py_object, ctypes.c_char_p]
_CAPSULE_GET_NAME = ctypes.pythonapi.PyCapsule_GetName
_CAPSULE_GET_NAME.restype = ctypes.c_char_p
_CAPSULE_GET_NAME.argtypes = [ctypes.py_object]
_DL_CPU = 1  # kDLCPU
_DL_CPU_PINNED = 3  # kDLCUDAHost: host memory, readable as CPU memory
_DL_BFLOAT = 4  # kDLBfloat, the dtype code of bfloat16 (16 bits)
_BF16 = 14  # Triton's TYPE_BF16


class _Capsule:
    """Hands a raw DLPack capsule to ``np.from_dlpack``, which wants a ``__dlpack__`` object."""

    def __init__(self, capsule: Any, device: tuple[int, int]) -> None:
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def _capsule_head(capsule: Any) -> tuple[int, int, int, int]:
    """The (device type, device id, dtype code, dtype bits) written in a DLPack capsule,
    read with ctypes."""
    name = _CAPSULE_GET_NAME(capsule)
    if name == b"dltensor":
        offset = 0  # DLManagedTensor starts with its DLTensor
    elif name == b"dltensor_versioned":
        offset = 32  # version (8), manager_ctx (8), deleter (8), flags (8), then DLTensor
    else:
        raise TritonModelException(
            f"Tensor.from_dlpack needs a DLPack capsule ('dltensor'), got one named {name!r} "
            "(it may have been consumed already)"
        )
    pointer = _CAPSULE_GET_POINTER(capsule, name)
    # DLTensor: void* data, DLDevice {int32 device_type, int32 device_id}, int32 ndim,
    # then DLDataType {uint8 code, uint8 bits, uint16 lanes}.
    start = pointer + offset + ctypes.sizeof(ctypes.c_void_p)
    device = (ctypes.c_int32 * 2).from_address(start)
    dtype = (ctypes.c_uint8 * 2).from_address(start + 12)
    return int(device[0]), int(device[1]), int(dtype[0]), int(dtype[1])


def _torch() -> Any:
    try:
        import torch
        import torch.utils.dlpack
    except ImportError:
        raise TritonModelException(
            "a BF16 tensor goes to and from DLPack through torch, which is not installed here"
        ) from None
    return torch


def _bf16_bits(source: Any) -> np.ndarray | None:
    """A bfloat16 tensor's bit patterns as ``uint16`` (None: ``source`` is not bfloat16):
    a torch tensor, a numpy array of ml_dtypes' bfloat16, or a DLPack capsule of one."""
    if type(source).__name__ == "PyCapsule":
        if _capsule_head(source)[2:] != (_DL_BFLOAT, 16):
            return None
        source = _torch().utils.dlpack.from_dlpack(source)
    dtype = str(getattr(source, "dtype", ""))
    if dtype == "torch.bfloat16":
        torch = _torch()
        return source.detach().contiguous().view(torch.int16).numpy().view(np.uint16)
    if dtype == "bfloat16" and isinstance(source, np.ndarray):
        return np.ascontiguousarray(source).view(np.uint16)
    return None


class Tensor:
    """A named tensor: ``Tensor(name, numpy_array)``. BYTES are object arrays of ``bytes``.
    A BF16 tensor (``_bf16``) holds its bit patterns as ``uint16``."""

    def __init__(self, name: str, numpy_array: Any) -> None:
        name = _text(name, "a tensor name")
        if not isinstance(numpy_array, np.ndarray):
            numpy_array = np.asarray(numpy_array)
        self._name = name
        self._array = numpy_array
        self._bf16 = False

    @classmethod
    def _received(cls, name: str, array: np.ndarray, bf16: bool = False) -> Tensor:
        """A request's input as the backend hands it to ``execute``: a name and an array
        the worker made, taken as they are (no checks: they were checked on the way in)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._bf16 = bf16
        return tensor

    @classmethod
    def _bfloat16(cls, name: str, bits: np.ndarray) -> Tensor:
        """A BF16 tensor of these ``uint16`` bit patterns."""
        tensor = cls(name, bits)
        tensor._bf16 = True
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The tensor's array. Arrays that arrived read-only are copied once, so a model may
        change them in place as it can under Triton. A BF16 tensor has none (numpy has no
        bfloat16): Triton's error, which says to use DLPack."""
        if self._bf16:
            raise TritonModelException(
                f"tensor '{self._name}': tensor dtype is BF16 and cannot be converted to "
                "numpy; use to_dlpack() (e.g. into torch.bfloat16) instead"
            )
        if not self._array.flags.writeable:
            self._array = self._array.copy()
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        """Triton's numeric data type, e.g. 11 for FP32, 13 for BYTES and 14 for BF16."""
        return _BF16 if self._bf16 else numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing this tensor's memory (not for BYTES tensors).

        A request's inputs arrive read-only, which numpy will not export (DLPack before
        1.0 cannot say so); like ``as_numpy`` this makes the tensor's own writable copy
        once, so the consumer shares memory with the tensor as it does under Triton.
        """
        if self._array.dtype.kind in "OSU":
            raise TritonModelException(
                f"tensor '{self._name}' holds BYTES, which DLPack cannot describe"
            )
        if self._bf16:  # numpy cannot say bfloat16: torch's view of the same bits can
            if not self._array.flags.writeable or not self._array.flags.c_contiguous:
                self._array = np.array(self._array, copy=True, order="C")
            torch = _torch()
            shared = torch.from_numpy(self._array.view(np.int16)).view(torch.bfloat16)
            return torch.utils.dlpack.to_dlpack(shared)
        self._array = np.ascontiguousarray(self.as_numpy())
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A tensor from a DLPack capsule or an object with ``__dlpack__`` (e.g. a torch
        tensor). A GPU tensor is copied to the CPU through its ``cpu()`` method. A
        bfloat16 one becomes a BF16 tensor."""
        source = dlpack_tensor
        if hasattr(source, "__dlpack__"):
            device = source.__dlpack_device__() if hasattr(source, "__dlpack_device__") else None
            if device is not None and int(device[0]) not in (_DL_CPU, _DL_CPU_PINNED):
                if not hasattr(source, "cpu"):
                    raise TritonModelException(
                        f"tensor '{name}': conch's python backend keeps tensors in CPU memory "
                        "and cannot copy this device tensor there; move it to the CPU first"
                    )
                source = source.cpu()
        elif type(source).__name__ == "PyCapsule":
            device = _capsule_head(source)
            if device[0] not in (_DL_CPU, _DL_CPU_PINNED):
                raise TritonModelException(
                    f"tensor '{name}': the DLPack capsule holds device memory (device type "
                    f"{device[0]}); conch's python backend takes CPU tensors only, so move "
                    "it to the CPU first"
                )
            if device[2:] == (_DL_BFLOAT, 16):
                return Tensor._bfloat16(name, _bf16_bits(source))  # type: ignore[arg-type]
            source = _Capsule(source, device[:2])
        else:
            raise TritonModelException(
                f"Tensor.from_dlpack('{name}', ...) needs a DLPack capsule or an object with "
                f"__dlpack__, got {type(dlpack_tensor).__name__}"
            )
        bits = _bf16_bits(source)
        if bits is not None:
            return Tensor._bfloat16(name, bits)
        return Tensor(name, np.from_dlpack(source))

    def __repr__(self) -> str:
        dtype = "BF16" if self._bf16 else self._array.dtype
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={dtype})"


def get_input_tensor_by_name(inference_request: Any, name: str) -> Tensor | None:
    """The request's input tensor called ``name``, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: Any, name: str) -> Tensor | None:
    """The response's output tensor called ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


# -- requests and responses ---------------------------------------------------------------


class InferenceResponse:
    """One response: output tensors, or an error (then the tensors are ignored)."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list | tuple):
            raise TypeError(
                "InferenceResponse output_tensors must be a list of pb_utils.Tensor, got "
                f"{type(output_tensors).__name__}"
            )
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._output_tensors = list(output_tensors)
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON string."""
        return self._parameters


# Hands one response on (None: only the final flag) and says whether the request ended.
Deliver = Callable[[InferenceResponse | None, bool], bool]


class InferenceResponseSender:
    """Sends one request's responses as the model makes them (Triton's
    ``InferenceResponseSender``), from ``execute`` or from any thread, even after
    ``execute`` returned (decoupled models).

    The python backend makes one per request and hands each response to ``deliver``
    (``Deliver``), in order: sends from several threads go one at a time. A decoupled
    model sends any number of responses, the last with
    ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; any other model sends exactly one, with
    the final flag or followed by it. The errors are Triton's, raised as
    ``TritonModelException``.
    """

    def __init__(
        self,
        deliver: Deliver,
        *,
        decoupled: bool,
        about: str = "",
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self._deliver = deliver
        self._cancelled = cancelled  # asks whether the caller went away; None: never
        self._decoupled = decoupled
        self._about = about  # which model and request, for the log
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(
                "send(): incompatible function arguments: response must be a "
                f"pb_utils.InferenceResponse or None, not {type(response).__name__}"
            )
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            self._count(response, final)
            if self._deliver(response, final):
                self._closed = True

    def is_cancelled(self) -> bool:
        return self._cancelled is not None and self._cancelled()

    def _count(self, response: InferenceResponse | None, final: bool) -> None:
        """Triton's checks before a response goes, and its counts (the caller holds the
        lock, or is the backend checking what ``execute`` returned)."""
        if not self._decoupled:
            if response is not None and self._sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than "
                    "one response."
                )
            if response is None and final and self._sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete "
                    "final before sending a response."
                )
        if self._closed:
            _log.error("%s: a response sent after the final one", self._about or "a model")
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if final:
            self._closed = True
        self._sent += 1

    def _close(self) -> bool:
        """Close the sender (``execute`` failed); whether it was still open."""
        with self._lock:
            was_open, self._closed = not self._closed, True
            return was_open

    @property
    def _done(self) -> bool:
        return self._closed


# Guards making a request's sender on first use (the model's threads may ask at once).
_SENDERS = threading.Lock()


def _retired_sender(
    factory: Callable[[], InferenceResponseSender], answered: bool
) -> InferenceResponseSender:
    """A sender made after its request's ``execute`` returned: closed, as it would be."""
    sender = factory()
    sender._closed = True
    if answered:
        sender._sent = max(sender._sent, 1)
    return sender


class InferenceRequest:
    """A request: the ones ``execute`` receives, or (for BLS) one a model builds itself.

    ``parameters()`` is a JSON string, as in Triton. ``exec()`` sends a request a model
    built to ``model_name`` and waits for its response; ``await async_exec()`` does the
    same without blocking the model's event loop.
    """

    def __init__(
        self,
        model_name: str = "",
        requested_output_names: Iterable[str] = (),
        inputs: Iterable[Tensor] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        # Strings may come as bytes, as Triton's bindings accept them: a BLS model often
        # names its target with the bytes a TYPE_STRING input holds.
        self._model_name = _text(model_name, "InferenceRequest model_name")
        self._requested_output_names = _texts(
            requested_output_names, "InferenceRequest requested_output_names"
        )
        self._inputs = list(inputs)
        self._request_id = _text(request_id, "InferenceRequest request_id")
        self._correlation_id = correlation_id
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory
        self._trace = trace
        self._parameters = _parameters_json(parameters)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._sender: InferenceResponseSender | None = None  # set by the python backend
        # Or the python backend's maker of it, run when the model first asks for it.
        self._sender_factory: Callable[[], InferenceResponseSender] | None = None

    @classmethod
    def _received(
        cls,
        model_name: str,
        model_version: int,
        requested_output_names: list[str],
        inputs: list[Tensor],
        request_id: str,
        correlation_id: int | str,
        flags: int,
        timeout: int,
        parameters: str,
    ) -> InferenceRequest:
        """A request ``execute`` receives, built by the backend from what the worker
        checked already: the same object as ``__init__`` makes, without its checks of a
        model's arguments."""
        request = cls.__new__(cls)
        request._model_name = model_name
        request._requested_output_names = requested_output_names
        request._inputs = inputs
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._model_version = model_version
        request._flags = flags
        request._timeout = timeout
        request._preferred_memory = None
        request._trace = None
        request._parameters = parameters
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        request._sender = None
        request._sender_factory = None
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        """The request's timeout in microseconds; 0 when it has none."""
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as a JSON string (``json.loads`` it)."""
        return self._parameters

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def trace(self) -> Any:
        return self._trace

    def is_cancelled(self) -> bool:
        sender = self._response_sender()
        return sender is not None and sender.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender of this request's responses (``InferenceResponseSender``): only for
        the requests ``execute`` receives, not for one a model builds itself."""
        sender = self._response_sender()
        if sender is None:
            raise TritonModelException(
                "Unable to get the response sender: this request was not given to execute "
                "by a conch worker (a request a model builds for BLS has none)"
            )
        return sender

    def _response_sender(self) -> InferenceResponseSender | None:
        """The request's sender, made the first time anyone asks (from any thread)."""
        sender = self._sender
        if sender is None and self._sender_factory is not None:
            with _SENDERS:
                if self._sender is None:
                    self._sender = self._sender_factory()
                sender = self._sender
        return sender

    def _retire(self, answered: bool) -> InferenceResponseSender | None:
        """``execute`` returned: the sender the model made, or None if it made none. A
        sender made from then on comes closed, as one that sent the request's response
        (``answered``) or that closed when ``execute`` ended without it."""
        with _SENDERS:
            factory = self._sender_factory
            if self._sender is None and factory is not None:
                self._sender_factory = functools.partial(_retired_sender, factory, answered)
            return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(
                "request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) is not "
                "supported by conch"
            )
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """Run this request on model ``model_name`` and return its response, or with
        ``decoupled`` a ``ResponseIterator`` of its responses, once the first has come
        (any number from a decoupled model, one from any other).

        Failures (unknown model, bad inputs, the model's own error, timeouts, a call that
        would wait on itself) come back as a response with ``has_error()`` True; nothing
        is raised. Without ``decoupled``, a decoupled model is such a failure, as in
        Triton. The call inherits the deadline of the request being executed, which
        ``timeout`` (microseconds) can only shorten.
        """
        client = _current_port()
        if client is None:
            failed = InferenceResponse(
                error=TritonError(
                    f"{_NO_WORKER}: InferenceRequest(model_name='{self._model_name}').exec() "
                    "cannot run",
                    TritonError.UNAVAILABLE,
                )
            )
            return ResponseIterator.of(failed) if decoupled else failed
        if decoupled:
            return self._stream(client)
        try:
            outputs = client.infer(bls_request(self), False)
        except ConchError as exc:
            return error_response(exc, str(self._model_name))
        except Exception as exc:  # the port answers failures as ConchErrors; a last resort
            return self._broken(exc)
        return InferenceResponse(output_tensors=[Tensor(name, arr) for name, arr in outputs])

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """``exec`` in a worker thread, so several calls from one ``execute`` overlap. With
        ``decoupled`` the iterator comes once the first response has; iterating it blocks
        the thread that iterates while it waits for each later one, as Triton's does."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # the caller's deadline, call chain and port
        return await loop.run_in_executor(_bls_threads(), context.run, self.exec, decoupled)

    def _stream(self, client: Any) -> ResponseIterator:
        """``exec(decoupled=True)`` on ``client``: Triton's exec returns once the first
        response has come, so the first is read here."""
        try:
            source = client.stream(bls_request(self))
        except ConchError as exc:
            return ResponseIterator.of(error_response(exc, str(self._model_name)))
        except Exception as exc:
            return ResponseIterator.of(self._broken(exc))
        responses = ResponseIterator(str(self._model_name), source)
        responses._read_ahead()
        return responses

    def _broken(self, exc: Exception) -> InferenceResponse:
        """The answer when the port fails otherwise than with a ``ConchError`` (a bug)."""
        _log.error("BLS request to model '%s' failed", self._model_name, exc_info=exc)
        return InferenceResponse(
            error=TritonError(
                f"BLS request to model '{self._model_name}' failed: {type(exc).__name__}: {exc}",
                TritonError.INTERNAL,
            )
        )

    def __repr__(self) -> str:
        names = [t.name() for t in self._inputs]
        return f"InferenceRequest(id={self._request_id!r}, inputs={names})"


class _Source:
    """A ``ResponseIterator``'s feed (the port's ``BlsResponses``), apart from the iterator
    so that the iterator's finalizer can cancel it without keeping the iterator alive."""

    __slots__ = ("cancelled", "done", "responses")

    def __init__(self, responses: Any) -> None:
        self.responses = responses
        self.done = False  # the last response was read
        self.cancelled = False

    def cancel(self) -> None:
        if self.done or self.cancelled:
            return
        self.cancelled = True
        try:
            self.responses.cancel()
        except Exception:  # the port cancels quietly; a last resort, from a finalizer too
            _log.exception("cancelling a BLS request failed")


class ResponseIterator:
    """What ``exec(decoupled=True)`` returns (Triton's ``ResponseIterator``): the called
    model's responses, each an ``InferenceResponse`` as it comes, the last included.

    As in Triton: a decoupled model's final flag sent alone comes as a last response with
    no outputs; a model that is not decoupled answers once; a failure comes as a response
    with ``has_error()`` True. Once the last response has come, iterating again starts
    over from the first. ``cancel()`` cancels the request while it runs: the next
    response is then an error with ``TritonError.CANCELLED``, and the last.

    Unlike Triton, an error response is always the last (conch ends a decoupled request
    at its first error), and an iterator dropped before its last response cancels the
    request (Triton's waits for the rest): a model that breaks out of the loop leaves no
    work running for it.
    """

    def __init__(self, model: str, responses: Any = None) -> None:
        self._model = model
        self._source = _Source(responses)
        self._seen: list[InferenceResponse] = []
        self._index = 0  # of the next response handed out
        self._ended = responses is None  # the last response is in ``_seen``
        self._lock = threading.Lock()  # one reader at a time
        if responses is not None:
            # Not at interpreter exit: the worker is going, and the lease lapses on its own.
            weakref.finalize(self, self._source.cancel).atexit = False

    @classmethod
    def of(cls, response: InferenceResponse) -> ResponseIterator:
        """A call answered at once, with one response (a failure, usually)."""
        responses = cls("")
        responses._seen.append(response)
        return responses

    def __iter__(self) -> ResponseIterator:
        with self._lock:
            if self._ended and self._index >= len(self._seen):
                self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        with self._lock:
            if self._index >= len(self._seen):
                if self._ended:
                    raise StopIteration
                self._read()
                if self._index >= len(self._seen):
                    raise StopIteration
            response = self._seen[self._index]
            self._index += 1
            return response

    def cancel(self) -> None:
        """Cancel the request unless its last response came: taken back if no worker has
        it yet, else the called model's ``is_cancelled()`` turns true."""
        if not self._ended:
            self._source.cancel()

    def _read_ahead(self) -> None:
        """Wait for the next response without handing it out (``exec`` waits for the first)."""
        with self._lock:
            if not self._ended and self._index >= len(self._seen):
                self._read()

    def _read(self) -> None:
        """The next response from the port into ``_seen`` (the caller holds the lock)."""
        source = self._source
        response: InferenceResponse | None
        try:
            got = next(source.responses)
        except StopIteration:
            response, last = None, True
        except ConchError as exc:
            # What ended the call, unchanged: the called model's own error as it sent it
            # (as Triton shows it), or the deadline, an outage, a cancel.
            ended = TritonError(exc.message, triton_code(exc.code))
            response, last = InferenceResponse(error=ended), True
        except Exception as exc:  # the port ends a call with a ConchError; a last resort
            _log.error("BLS request to model '%s' failed", self._model, exc_info=exc)
            source.cancel()
            failed = TritonError(
                f"BLS request to model '{self._model}' failed: {type(exc).__name__}: {exc}",
                TritonError.INTERNAL,
            )
            response, last = InferenceResponse(error=failed), True
        else:
            tensors = [Tensor(name, arr) for name, arr in got.outputs]
            response, last = InferenceResponse(output_tensors=tensors), bool(got.final)
        if response is not None:
            self._seen.append(response)
        if last:
            self._ended = source.done = True


def _model_control(what: str, model_name: str, call: Callable[[Any], None]) -> None:
    client = _current_port()
    if client is None:
        raise TritonModelException(f"{_NO_WORKER}: {what}('{model_name}') cannot run")
    try:
        call(client)
    except Exception as exc:
        raise TritonModelException(str(getattr(exc, "message", exc))) from None


def load_model(model_name: str, config: str = "", files: Any = None) -> None:
    """Load (or reload) a model, with an optional config (JSON) and ``file:`` contents;
    returns once a worker serves it. Explicit model control mode only."""
    _model_control("load_model", model_name, lambda c: c.load(model_name, config, files))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model; returns once no worker serves it. Explicit model control mode only."""
    _model_control("unload_model", model_name, lambda c: c.unload(model_name, unload_dependents))


def bls_request(request: InferenceRequest) -> BlsRequest:
    """What the BLS port is handed for ``request``: its fields as the model set them, with
    ``pb_utils.Tensor`` inputs as numpy arrays (anything else is refused here, the one place
    that knows this module's ``Tensor``)."""
    inputs = []
    for tensor in request.inputs():
        if not isinstance(tensor, Tensor):
            raise InvalidArgument(
                f"BLS request to model '{request.model_name()}': inputs must be "
                f"pb_utils.Tensor, got {type(tensor).__name__}"
            )
        inputs.append((tensor.name(), tensor._array))
    return BlsRequest(
        model_name=request.model_name(),
        model_version=request.model_version(),
        request_id=request.request_id(),
        inputs=inputs,
        requested_output_names=list(request.requested_output_names()),
        parameters=request.parameters(),
        timeout=request.timeout(),
    )


def error_response(error: ConchError, model: str) -> InferenceResponse:
    """A BLS response carrying ``error``, whose message names ``model``."""
    message = error.message
    if f"'{model}'" not in message:
        message = f"BLS request to model '{model}' failed: {message}"
    return InferenceResponse(error=TritonError(message, triton_code(error.code)))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether a live worker has ``model_name`` (``model_version``, "" = latest) ready."""
    client = _current_port()
    if client is None:
        raise TritonModelException(f"{_NO_WORKER}: is_model_ready('{model_name}') cannot run")
    return bool(client.is_ready(model_name, model_version))


# -- the model configuration --------------------------------------------------------------


def _config_entry(model_config: Any, kind: str, name: str) -> dict[str, Any] | None:
    if isinstance(model_config, ModelConfig):
        model_config = model_config.as_dict()
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    for entry in model_config.get(kind) or ():
        if entry.get("name") == name:
            return entry
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config's entry for input ``name`` (``model_config`` is the parsed JSON), or None."""
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config's entry for output ``name`` (``model_config`` is the parsed JSON), or None."""
    return _config_entry(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether the config (parsed JSON) sets ``model_transaction_policy { decoupled: true }``."""
    if isinstance(model_config, ModelConfig):
        model_config = model_config.as_dict()
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


_IO_FIELDS = {
    "input": frozenset(
        {
            "name",
            "data_type",
            "format",
            "dims",
            "reshape",
            "is_shape_tensor",
            "allow_ragged_batch",
            "optional",
            "is_non_linear_format_io",
        }
    ),
    "output": frozenset(
        {
            "name",
            "data_type",
            "dims",
            "reshape",
            "label_filename",
            "is_shape_tensor",
            "is_non_linear_format_io",
        }
    ),
}


class ModelConfig:
    """The model configuration as Triton's JSON dict, given to ``auto_complete_config``.

    ``as_dict()`` returns the dict itself. The setters check what they are given against
    what the configuration already says and raise ``ValueError`` on a conflict.
    """

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        if isinstance(model_config, str):
            model_config = json.loads(model_config)
        if not isinstance(model_config, dict):
            raise TypeError("ModelConfig wraps the model configuration as a dict")
        self._model_config = model_config

    def _model(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int | np.integer):
            raise TypeError(f"max_batch_size must be an integer, got {max_batch_size!r}")
        max_batch_size = int(max_batch_size)
        if max_batch_size < 0:
            raise ValueError(f"max_batch_size must be >= 0, got {max_batch_size}")
        current = int(self._model_config.get("max_batch_size", 0) or 0)
        if current and current != max_batch_size:
            raise ValueError(
                f"the configuration of model '{self._model()}' sets max_batch_size {current}, "
                f"but its auto_complete_config sets max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"model '{self._model()}' already uses {other}; it cannot also have "
                    "dynamic_batching"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        if not isinstance(transaction_policy_dict, dict):
            raise TypeError("the model transaction policy is a dict such as {'decoupled': True}")
        unknown = set(transaction_policy_dict) - {"decoupled"}
        if unknown:
            raise ValueError(
                f"model transaction policy of model '{self._model()}' has unknown key(s) "
                f"{sorted(unknown)}; only 'decoupled' is allowed"
            )
        decoupled = transaction_policy_dict.get("decoupled", False)
        if not isinstance(decoupled, bool):
            raise TypeError(f"'decoupled' must be True or False, got {decoupled!r}")
        self._model_config["model_transaction_policy"] = {"decoupled": decoupled}

    def _add(self, kind: str, entry: dict[str, Any]) -> None:
        model = self._model()
        if not isinstance(entry, dict):
            raise TypeError(
                f"add_{kind} takes a dict such as {{'name': ..., 'data_type': ..., 'dims': [...]}}"
            )
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"an {kind} added by auto_complete_config of model '{model}' has no 'name'"
            )
        unknown = set(entry) - _IO_FIELDS[kind]
        if unknown:
            raise ValueError(
                f"{kind} '{name}' added by auto_complete_config of model '{model}' has unknown "
                f"field(s) {sorted(unknown)}"
            )
        new = dict(entry)
        if "data_type" in new:
            new["data_type"] = _type_name(new["data_type"])
        if "dims" in new:
            dims = new["dims"]
            if not isinstance(dims, list | tuple) or not all(
                isinstance(d, int | np.integer) and not isinstance(d, bool) for d in dims
            ):
                raise ValueError(
                    f"{kind} '{name}' of model '{model}': 'dims' must be a list of integers, "
                    f"got {dims!r}"
                )
            new["dims"] = [int(d) for d in dims]
        entries = self._model_config.setdefault(kind, [])
        existing = next((e for e in entries if e.get("name") == name), None)
        if existing is None:
            for required in ("data_type", "dims"):
                if required not in new:
                    raise ValueError(
                        f"{kind} '{name}' added by auto_complete_config of model '{model}' "
                        f"has no '{required}'"
                    )
            entries.append(new)
            return
        # The name is taken: Triton accepts it when it agrees with what is there.
        have_type = existing.get("data_type", "TYPE_INVALID")
        if (
            "data_type" in new
            and have_type not in ("", "TYPE_INVALID")
            and have_type != new["data_type"]
        ):
            raise ValueError(
                f"{kind} '{name}' of model '{model}' is already in the configuration with "
                f"data_type {have_type}; auto_complete_config adds it with data_type "
                f"{new['data_type']}"
            )
        have_dims = [int(d) for d in existing.get("dims") or []]
        if "dims" in new and have_dims and have_dims != new["dims"]:
            raise ValueError(
                f"{kind} '{name}' of model '{model}' is already in the configuration with "
                f"dims {have_dims}; auto_complete_config adds it with dims {new['dims']}"
            )
        for key, value in new.items():
            if key == "data_type" and have_type not in ("", "TYPE_INVALID"):
                continue
            if key == "dims" and have_dims:
                continue
            existing[key] = value


# -- custom metrics -----------------------------------------------------------------------


# Triton's numbering, which is also the order of ``custom_metrics.KINDS``.
MetricKind = enum.IntEnum("MetricKind", ["COUNTER", "GAUGE", "HISTOGRAM"], start=0)


def _metrics_call(what: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ConchError as exc:
        raise TritonModelException(f"{what}: {exc.message}") from None


class Metric:
    """One metric of a family, for one set of labels: ``family.Metric(labels={...})``.

    Metrics with the same family and labels are one metric, whoever made them; it goes
    away when the last ``Metric`` object for it (or its family) is gone.
    """

    def __init__(self, family: str, labels: custom_metrics.Labels) -> None:
        self._family = family
        self._labels = labels
        self._release = weakref.finalize(self, custom_metrics.REGISTRY.drop_metric, family, labels)

    def increment(self, value: float) -> None:
        """Add ``value``: >= 0 for a counter, any sign for a gauge."""
        _metrics_call(
            "Failed to increment metric value",
            lambda: custom_metrics.REGISTRY.increment(self._family, self._labels, float(value)),
        )

    def set(self, value: float) -> None:
        """Set a gauge to ``value`` (counters and histograms cannot be set)."""
        _metrics_call(
            "Failed to set metric value",
            lambda: custom_metrics.REGISTRY.set(self._family, self._labels, float(value)),
        )

    def observe(self, value: float) -> None:
        """Count ``value`` in a histogram."""
        _metrics_call(
            "Failed to observe metric value",
            lambda: custom_metrics.REGISTRY.observe(self._family, self._labels, float(value)),
        )

    def value(self) -> float:
        """This worker's value of the metric (what ``/metrics`` sums over workers)."""
        return _metrics_call(
            "Failed to get metric value",
            lambda: custom_metrics.REGISTRY.value(self._family, self._labels),
        )


class MetricFamily:
    """A custom metric family: ``MetricFamily(name, description, kind)``, then
    ``.Metric(labels)`` for each set of labels. Its metrics appear on the metrics port
    (``GET /metrics``) with Triton's own, summed over the workers that serve the model."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        name = _text(name, "a metric family name")
        description = _text(description, "a metric family description")
        try:
            kind_name = custom_metrics.KINDS[MetricKind(kind)]
        except ValueError:
            raise TritonModelException(
                f"Error when creating MetricFamily: unknown kind {kind!r}; use "
                "MetricFamily.COUNTER, GAUGE or HISTOGRAM"
            ) from None
        _metrics_call(
            "Error when creating MetricFamily",
            lambda: custom_metrics.REGISTRY.hold_family(name, description, kind_name),
        )
        self._name = name
        self._kind = MetricKind(kind)
        self._release = weakref.finalize(self, custom_metrics.REGISTRY.drop_family, name)

    def Metric(  # Triton's name for it, capitalised
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None and not isinstance(buckets, list):
            raise TritonModelException("Failed to create metric. Buckets must be a list.")
        try:
            pairs = {
                _text(k, "a metric label name"): _text(v, f"metric label '{k}'")
                for k, v in (labels or {}).items()
            }
        except TypeError as exc:
            raise TritonModelException(f"Failed to create metric. {exc}") from None
        key = _metrics_call("Failed to create metric", lambda: custom_metrics.labels_key(pairs))
        _metrics_call(
            "Failed to create metric",
            lambda: custom_metrics.REGISTRY.hold_metric(self._name, key, buckets),
        )
        return Metric(self._name, key)


# -- logging ------------------------------------------------------------------------------

_log = logging.getLogger("conch.python_model")


class LogLevel:
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


class Logger:
    """``pb_utils.Logger.log_info("...")``: messages go to the worker's Python logging
    (logger ``conch.python_model``; VERBOSE is DEBUG)."""

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        _log.log(_LEVELS.get(level, logging.INFO), "%s", message, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message, stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message, stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message, stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message, stacklevel=2)
