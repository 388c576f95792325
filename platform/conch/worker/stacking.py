"""A batch's inputs stacked from raw bytes, and its outputs split back as raw bytes.

For a backend that runs stacked tensors (``TensorBackend``), the runner makes one array
per input for the whole batch: the requests' raw bytes joined once and read with
``np.frombuffer``, not one array per request concatenated afterwards. Each output is
encoded once (``tensors.from_numpy``) and each request's reply takes a view of its rows'
bytes. Per request, nothing is made beyond what its reply carries.

``stack`` declines (returns None) when the requests do not share their inputs' names,
datatypes and inner shapes, or carry BYTES (whose rows have no fixed size); the runner
then takes the per-request path (``BackendRequest``, ``TensorBackend.execute``), which
groups such requests. The Python backend always takes that path: it gets one request
object per request, as Triton's does. There ``request_inputs`` still reads the batch as
a batch: each input's bytes are joined once for all the requests, and each request's
array is a view of its part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conch.core import tensors
from conch.core.datatypes import ITEMSIZE, WIRE_TO_NUMPY
from conch.core.errors import ConchError, InvalidArgument
from conch.wire.messages import WireTensor
from conch.worker.admission import Item

# A request's stacking key: each input's (name, datatype, inner shape), by name.
_Key = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(slots=True)
class Stack:
    """A batch ready to run: the requests that can, their rows, and one array per input."""

    items: list[Item]
    rows: list[int]
    inputs: dict[str, np.ndarray]
    # Requests whose input bytes do not fit their shape: answered with the error, not run.
    refused: list[tuple[Item, ConchError]] = field(default_factory=list)

    @property
    def wanted(self) -> list[str]:
        """Every output some request asks for, as ``TensorBackend.execute`` asks them."""
        return sorted({name for item in self.items for name in item.msg.outputs})


def _key(inputs: list[WireTensor]) -> tuple[_Key, int] | None:
    """A request's stacking key and rows, or None when it cannot be stacked."""
    key = tuple(sorted((name, dt, shape[1:]) for name, dt, shape, _raw in inputs))
    rows = {shape[0] if shape else -1 for _name, _dt, shape, _raw in inputs}
    if len(rows) != 1 or -1 in rows or len({k[0] for k in key}) != len(key):
        return None  # a scalar, inputs of different rows, or a name given twice
    if any(dt == "BYTES" for _name, dt, _inner in key):
        return None
    return key, rows.pop()


def stack(items: list[Item]) -> Stack | None:
    """``items`` stacked, or None when they cannot all be (see the module's docstring).

    A request whose bytes do not fit its shape is refused with the error
    ``tensors.to_numpy`` gives it, and the others run without it.
    """
    refused: list[tuple[Item, ConchError]] = []
    runnable: list[Item] = []
    rows: list[int] = []
    common: _Key | None = None
    for item in items:
        keyed = _key(item.msg.inputs)
        if keyed is None:
            return None
        try:
            for _name, dt, shape, raw in item.msg.inputs:
                tensors.raw_size_ok(dt, shape, raw)
        except ConchError as exc:
            refused.append((item, exc))
            continue
        key, n = keyed
        if common is None:
            common = key
        elif key != common:
            return None
        runnable.append(item)
        rows.append(n)
    arrays: dict[str, np.ndarray] = {}
    if common is not None:
        total = sum(rows)
        by_name = [sorted(item.msg.inputs) for item in runnable]
        for k, (name, dt, inner) in enumerate(common):
            parts = [inputs[k].raw for inputs in by_name]
            # A bytearray: a stacked batch is writable, as np.concatenate made it.
            raw = parts[0] if len(parts) == 1 else bytearray().join(parts)
            arrays[name] = np.frombuffer(raw, dtype=WIRE_TO_NUMPY[dt]).reshape((total, *inner))
    return Stack(runnable, rows, arrays, refused)


def split(
    outputs: dict[str, np.ndarray], stacked: Stack, types: dict[str, str]
) -> dict[str, list[WireTensor] | Exception]:
    """Each output of ``stacked.wanted`` encoded once, as ``types`` declares it, and cut
    into each request's rows.

    By output name: one wire tensor per request, whose bytes are a view of the output's,
    or the exception that encoding or cutting it raised (a ``KeyError`` for an output
    the model did not produce).
    """
    rows = stacked.rows
    out: dict[str, list[WireTensor] | Exception] = {}
    for name in stacked.wanted:
        arr = outputs.get(name)
        if arr is None:  # the model did not produce it, which is the model's fault
            out[name] = KeyError(name)
            continue
        try:
            arr = np.asarray(arr)
            datatype, raw = tensors.wire_view(arr, types.get(name))
            view = raw if isinstance(raw, memoryview) else memoryview(raw)
            parts = tensors.split_rows(datatype, arr.shape, view, rows, name)
        except Exception as exc:
            out[name] = exc
            continue
        inner = tuple(int(d) for d in arr.shape[1:])
        out[name] = [
            WireTensor(name, datatype, (n, *inner), part)
            for n, part in zip(rows, parts, strict=True)
        ]
    return out


# Where one request's fixed-size input goes once its buffer is joined: the request's
# arrays, and the input's name and shape (its offset follows from the parts before it).
_Place = tuple[dict[str, Any], str, tuple[int, ...]]
_DTYPES = {dt: np.dtype(np_type) for dt, np_type in WIRE_TO_NUMPY.items()}


def request_inputs(items: list[Item]) -> list[dict[str, np.ndarray] | ConchError]:
    """Each request's inputs as arrays by name (in the order it sent them), or the error
    its inputs make, for a backend that takes one request at a time.

    The fixed-size inputs of one name and datatype are joined into one buffer for the
    whole batch (one copy) and each request's array is a view of its part, writable: a
    model may change its inputs in place, as Triton lets it, with no copy of its own
    (``pb_utils.Tensor.as_numpy`` copies only a read-only array). BYTES inputs, and
    bytes that do not fit their shape, go through ``tensors.to_numpy`` one by one.
    """
    out: list[dict[str, np.ndarray] | ConchError] = []
    joined: dict[tuple[str, str], tuple[list[bytes], list[_Place]]] = {}
    for item in items:
        arrays: dict[str, Any] = {}
        try:
            for name, dt, shape, raw in item.msg.inputs:
                size = ITEMSIZE.get(dt)
                if size is None or len(raw) != math.prod(shape) * size:
                    arrays[name] = tensors.to_numpy(dt, shape, raw)  # BYTES, or why not
                    continue
                arrays[name] = None  # its view, once the buffer is joined
                group = joined.get((name, dt))
                if group is None:
                    group = joined[name, dt] = ([], [])
                group[0].append(raw)
                group[1].append((arrays, name, shape))
        except ConchError as exc:  # its parts joined already are left unread
            out.append(exc)
            continue
        except Exception as exc:
            out.append(InvalidArgument(f"bad input tensor: {exc}"))
            continue
        out.append(arrays)
    for (_name, dt), (parts, places) in joined.items():
        buffer = bytearray().join(parts)
        dtype = _DTYPES[dt]
        offset = 0
        for (arrays, name, shape), raw in zip(places, parts, strict=True):
            arrays[name] = np.ndarray(shape, dtype, buffer, offset)
            offset += len(raw)
    return out
