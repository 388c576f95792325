"""One tensor's encodings: Triton binary bytes ("raw"), numpy, and JSON ``data``.

Raw bytes are conch's canonical in-flight form of a tensor: they are what the binary
tensor extension carries, so a binary request can reach a backend and a binary response
can leave it without re-encoding. Raw is little-endian and row-major; BOOL is one byte,
BF16 is the upper two bytes of the fp32 value, and BYTES is, per element, a uint32-LE
length followed by the element's bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from itertools import accumulate, chain
from typing import Any, NamedTuple

import numpy as np

from conch.core.datatypes import ITEMSIZE, WIRE_TO_NUMPY, WIRE_TYPES, numpy_to_wire
from conch.core.errors import InvalidArgument

_U32 = struct.Struct("<I")
_VECTOR_MIN = 256  # BYTES tensors at least this long are length-prefixed with numpy
_unpack_u32 = _U32.unpack_from
_pack_u32 = _U32.pack

# Which Python types JSON ``data`` may hold for each datatype (bool is not an int here:
# Triton's JSON reader rejects true for an integer input and 1 for a BOOL input).
_INT_TYPES = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
_HALF_TYPES = frozenset({"FP16", "BF16"})
_NUMBER = frozenset({int, float})


class WireTensor(NamedTuple):
    """A tensor as a request or reply carries it: raw bytes with their datatype and shape.

    A tuple, so it travels as msgpack's ``[name, datatype, shape, raw]`` array and
    unpacks as one; the names are for reading one field of it. It is built here and where
    a message is read (``conch.wire.messages``) so that both sides name the same fields.
    """

    name: str
    datatype: str  # a wire datatype (``conch.core.datatypes.WIRE_TYPES``)
    shape: tuple[int, ...]
    raw: bytes  # Triton binary bytes (a view of them in a stacked batch's reply)


def _label(name: str) -> str:
    return f" for input '{name}'" if name else ""


def element_count(shape: Sequence[int]) -> int:
    """prod(shape) as a Python int (1 for a scalar shape ``[]``)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


# The most elements, and bytes, a tensor may have: Triton counts both in a signed 64-bit
# integer and refuses a shape whose count would not fit.
INT64_MAX = 2**63 - 1


def shape_text(shape: Sequence[int]) -> str:
    """A shape as Triton writes one in its messages: ``[2,3]``."""
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def check_countable(datatype: str, shape: Sequence[int], name: str) -> None:
    """Refuse, in Triton's words, a shape whose element count or byte size is past what a
    signed 64-bit integer holds, before any data is read against it."""
    count = element_count(shape)
    if count > INT64_MAX:
        raise InvalidArgument(
            f"invalid shape for input '{name}': shape {shape_text(shape)} causes total element "
            f"count to exceed maximum size of {INT64_MAX}"
        )
    size = ITEMSIZE.get(datatype, 0)
    if size > 1 and count > INT64_MAX // size:
        raise InvalidArgument(
            f"byte size overflow for input '{name}': element count ({count}) * data type "
            f"size ({size}) exceeds maximum allowed size ({INT64_MAX})"
        )


def check_datatype(datatype: str, name: str) -> None:
    """Refuse a datatype Triton does not have, naming input ``name``."""
    if datatype not in WIRE_TYPES:
        raise InvalidArgument(
            f"invalid datatype '{datatype}' for input '{name}'; expected one of "
            f"{', '.join(WIRE_TO_NUMPY)}"
        )


def _bytes_error(raw: bytes | memoryview, count: int, name: str) -> InvalidArgument:
    """The precise reason BYTES data does not hold ``count`` elements (slow path only)."""
    size = len(raw)
    off = 0
    for i in range(count):
        if off + 4 > size:
            return InvalidArgument(
                f"unexpected size{_label(name)}: BYTES data ends after {i} of {count} elements"
            )
        (length,) = _unpack_u32(raw, off)
        start = off + 4
        off = start + length
        if off > size:
            return InvalidArgument(
                f"unexpected size{_label(name)}: BYTES element {i} claims {length} bytes "
                f"but only {size - start} remain"
            )
    return InvalidArgument(
        f"unexpected size{_label(name)}: {size - off} bytes left over after {count} BYTES elements"
    )


def _bytes_end(raw: bytes | memoryview, count: int) -> int:
    """Offset just past ``count`` length-prefixed elements, or -1 if they overrun ``raw``."""
    off = 0
    unpack = _unpack_u32
    try:
        for _ in range(count):
            off += 4 + unpack(raw, off)[0]
    except struct.error:
        return -1
    return off


def _split_bytes(raw: bytes | memoryview, count: int, name: str) -> list[bytes]:
    """The ``count`` elements of BYTES data, which must fill ``raw`` exactly."""
    data = raw if isinstance(raw, bytes) else bytes(raw)  # slicing bytes yields bytes
    out: list[bytes] = []
    append = out.append
    unpack = _unpack_u32
    off = 0
    try:
        for _ in range(count):
            start = off + 4
            off = start + unpack(data, off)[0]
            append(data[start:off])
    except struct.error:
        raise _bytes_error(raw, count, name) from None
    if off != len(data):
        raise _bytes_error(raw, count, name)
    return out


def split_rows(
    datatype: str, shape: Sequence[int], raw: bytes, rows: Sequence[int], name: str = ""
) -> list[bytes]:
    """Raw bytes of a batched tensor cut along its first dimension into parts of ``rows``
    rows each (they must add up to ``shape[0]``): what each request of a stack gets back."""
    if not shape or int(shape[0]) != sum(rows):
        raise InvalidArgument(
            f"tensor '{name}' of shape {list(shape)} does not have the {sum(rows)} rows sent"
        )
    per_row = element_count(shape[1:])
    if datatype == "BYTES":
        ends, off, view = [], 0, memoryview(raw)
        for r in rows:
            step = _bytes_end(view[off:], r * per_row)
            if step < 0:
                raise _bytes_error(raw, element_count(shape), name)
            off += step
            ends.append(off)
        if off != len(raw):
            raise _bytes_error(raw, element_count(shape), name)
    else:
        raw_size_ok(datatype, shape, raw, name)
        row_bytes = per_row * ITEMSIZE[datatype]
        ends = list(accumulate(r * row_bytes for r in rows))
    return [raw[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def raw_size_ok(
    datatype: str, shape: Sequence[int], raw: bytes | memoryview, name: str = ""
) -> None:
    """Reject raw bytes that do not hold exactly prod(shape) elements of ``datatype``.

    Checked before anything trusts the bytes, so a short or padded buffer is a 400 that
    names the input rather than a reshape error deep in a worker.
    """
    count = element_count(shape)
    if datatype == "BYTES":
        if _bytes_end(raw, count) != len(raw):
            raise _bytes_error(raw, count, name)
        return
    itemsize = ITEMSIZE.get(datatype)
    if itemsize is None:
        raise InvalidArgument(f"invalid datatype '{datatype}'{_label(name)}")
    expected = count * itemsize
    if len(raw) != expected:
        raise InvalidArgument(
            f"unexpected size{_label(name)}: expected {expected} bytes for {datatype} "
            f"shape {list(shape)}, got {len(raw)}"
        )


def to_numpy(
    datatype: str, shape: Sequence[int], raw: bytes | memoryview, name: str = ""
) -> np.ndarray:
    """Raw bytes as an array of ``shape``.

    Fixed-size types are a zero-copy, read-only view of ``raw``. BYTES becomes an object
    array of ``bytes``; BF16 stays as its uint16 bit patterns (numpy has no bfloat16).
    """
    shape = tuple(int(d) for d in shape)
    if datatype == "BYTES":
        count = element_count(shape)
        items = _split_bytes(raw, count, name)  # first, so a bogus shape allocates nothing
        out = np.empty(count, dtype=object)
        out[:] = items
        return out.reshape(shape)
    dtype = WIRE_TO_NUMPY.get(datatype)
    if dtype is None:
        raise InvalidArgument(f"invalid datatype '{datatype}'{_label(name)}")
    raw_size_ok(datatype, shape, raw, name)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _bytes_element(x: Any) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    if isinstance(x, bytearray | memoryview):
        return bytes(x)
    return str(x).encode("utf-8")


def encode_bytes_elements(items: Sequence[Any]) -> bytes:
    """Length-prefix each element (bytes as is, str as UTF-8, anything else as str(x))."""
    if set(map(type, items)) - {bytes}:
        items = [_bytes_element(x) for x in items]
    n = len(items)
    if n < _VECTOR_MIN:
        return b"".join(
            chain.from_iterable(zip(map(_pack_u32, map(len, items)), items, strict=True))
        )
    # Large tensors: scatter the prefixes and the joined payload with numpy, faster than
    # joining 2n small bytes objects (bench/README.md, "Measurements the code cites").
    lens = np.fromiter(map(len, items), dtype="<u4", count=n)
    payload = np.frombuffer(b"".join(items), dtype=np.uint8)
    out = np.empty(payload.size + 4 * n, dtype=np.uint8)
    steps = lens.astype(np.int64) + 4
    prefix_at = (np.cumsum(steps) - steps)[:, None] + np.arange(4)
    out[prefix_at] = lens.view(np.uint8).reshape(n, 4)
    is_payload = np.ones(out.size, dtype=bool)
    is_payload[prefix_at] = False
    out[is_payload] = payload
    return out.tobytes()


def named_outputs(
    result: Mapping[str, np.ndarray], names: Sequence[str], declared: Mapping[str, str]
) -> list[WireTensor]:
    """The outputs ``names`` of a model's ``result``, as a reply carries them, in the
    datatypes the config declares (``declared``)."""
    out = []
    for name in names:
        datatype, raw = from_numpy(result[name], declared.get(name))
        out.append(WireTensor(name, datatype, tuple(result[name].shape), raw))
    return out


def from_numpy(arr: np.ndarray, datatype: str | None = None) -> tuple[str, bytes]:
    """An array as ``(datatype, raw)``.

    With no ``datatype`` it is inferred (object/str/bytes arrays are BYTES). With one, a
    same-kind cast is applied (e.g. float64 -> FP32, so a backend's output matches its
    config); a cross-kind mismatch such as float -> INT32 is refused. For BF16, a uint16
    array is taken as bit patterns, an ``ml_dtypes.bfloat16`` array as itself, and a float
    array is truncated to its upper 16 bits.
    """
    arr = np.asarray(arr)
    # (dtype.name is slow to compute; ml_dtypes' types are kind "V", numpy's numbers never)
    if arr.dtype.kind == "V" and arr.dtype.name == "bfloat16" and datatype in (None, "BF16"):
        # ml_dtypes.bfloat16 (what tritonclient uses): its bits are already the wire form.
        return "BF16", arr.view("<u2").tobytes()
    if datatype is None:
        try:
            datatype = numpy_to_wire(arr.dtype)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
    elif datatype not in WIRE_TYPES:
        raise InvalidArgument(f"invalid datatype '{datatype}'")

    if datatype == "BYTES":
        # tolist() on an "S" array strips numpy's trailing NUL padding, as clients expect.
        return datatype, encode_bytes_elements(arr.ravel().tolist())

    if datatype == "BF16":
        if arr.dtype.kind == "f":
            bits = np.ascontiguousarray(arr, dtype="<f4").view("<u4") >> 16
            return datatype, bits.astype("<u2").tobytes()
        if arr.dtype.kind not in "ui" or arr.dtype.itemsize != 2:
            raise InvalidArgument(f"cannot send a {arr.dtype} array as BF16")
        return datatype, arr.astype("<u2", copy=False).tobytes()  # bit patterns

    target = WIRE_TO_NUMPY[datatype]
    if arr.dtype != target:
        if arr.dtype.kind == "O" or not np.can_cast(arr.dtype, target, casting="same_kind"):
            raise InvalidArgument(f"cannot send a {arr.dtype} array as {datatype}")
        arr = arr.astype(target)
    # tobytes() always writes C order, so a transposed or sliced view needs no extra copy.
    return datatype, arr.tobytes()


def wire_view(arr: np.ndarray, datatype: str | None = None) -> tuple[str, bytes | memoryview]:
    """``from_numpy``, but an array that already is its wire form (C order, little-endian,
    of ``datatype``'s own dtype) is viewed, not copied.

    For a whole batch's output, whose bytes each reply then views in part: the copy a
    reply needs is made once, when it is packed. The view holds ``arr``'s memory, so
    ``arr`` must not change until then.
    """
    arr = np.asarray(arr)
    wire_form = datatype in ITEMSIZE and datatype != "BF16" and arr.flags.c_contiguous
    if wire_form and arr.dtype == WIRE_TO_NUMPY[datatype]:
        # Flattened first: a memoryview cannot cast a view with a 0 in its shape (an
        # empty tensor), but a one-dimensional one of no elements casts to no bytes.
        return datatype, memoryview(arr.reshape(-1)).cast("B")
    return from_numpy(arr, datatype)


def _flatten(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def json_to_raw(datatype: str, shape: Sequence[int], data: Any, name: str = "") -> bytes:
    """JSON ``data`` (flat or nested, row-major) as raw bytes, checking element types.

    Bad data is the client's mistake, so every failure is a 400 naming the input.
    """
    label = _label(name)
    if datatype in _HALF_TYPES:
        raise InvalidArgument(f"sending {datatype} data via JSON is not supported{label}")
    if datatype not in WIRE_TYPES:
        raise InvalidArgument(f"invalid datatype '{datatype}'{label}")
    check_countable(datatype, shape, name)
    if not isinstance(data, list):
        data = [data]  # a bare scalar, as some clients send for shape [1] or []
    types = set(map(type, data))
    if list in types:
        data = _flatten(data)
        types = set(map(type, data))
    count = element_count(shape)
    if len(data) != count:
        raise InvalidArgument(
            f"unexpected number of elements{label}: shape {list(shape)} needs {count}, "
            f"'data' has {len(data)}"
        )
    if not data:
        return b""

    if datatype == "BYTES":
        if types != {str}:
            raise InvalidArgument(f"BYTES data{label} must be JSON strings, got {_names(types)}")
        try:
            return encode_bytes_elements(data)
        except UnicodeEncodeError as e:
            raise InvalidArgument(f"BYTES data{label} is not valid unicode: {e}") from None

    if datatype == "BOOL":
        if types != {bool}:
            raise InvalidArgument(f"BOOL data{label} must be JSON true/false, got {_names(types)}")
        return np.array(data, dtype=np.bool_).tobytes()

    dtype = WIRE_TO_NUMPY[datatype]
    if datatype in _INT_TYPES:
        if types != {int}:
            raise InvalidArgument(
                f"{datatype} data{label} must be JSON integers, got {_names(types)}"
            )
        info = np.iinfo(dtype)
        lo, hi = min(data), max(data)
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise InvalidArgument(
                f"{datatype} data{label} out of range: {bad} is not in [{info.min}, {info.max}]"
            )
        return np.array(data, dtype=dtype).tobytes()

    # FP32 / FP64
    if not types <= _NUMBER:
        raise InvalidArgument(f"{datatype} data{label} must be JSON numbers, got {_names(types)}")
    try:
        return np.array(data, dtype=dtype).tobytes()
    except OverflowError as e:  # an int too large even for float64
        raise InvalidArgument(f"{datatype} data{label} out of range: {e}") from None


def _names(types: set[type]) -> str:
    json_names = {
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        dict: "object",
        list: "array",
        type(None): "null",
    }
    return ", ".join(sorted(json_names.get(t, t.__name__) for t in types))


def raw_to_json(
    datatype: str, shape: Sequence[int], raw: bytes | memoryview, name: str = ""
) -> list[Any]:
    """Raw bytes as the flat list a JSON response's ``data`` holds.

    BYTES elements are decoded as UTF-8 with invalid sequences replaced by U+FFFD, so the
    body is always valid JSON a client can read; a client that needs the exact bytes asks
    for binary output. FP16 and BF16 (which Triton cannot put in JSON) are written as
    the floats they represent. Non-finite floats come out as NaN/Infinity, which Python's
    json (and so tritonclient) reads back.
    """
    if datatype == "BYTES":
        arr = to_numpy(datatype, shape, raw, name)
        return [b.decode("utf-8", errors="replace") for b in arr.ravel().tolist()]
    arr = to_numpy(datatype, shape, raw, name).ravel()
    if datatype == "BF16":
        arr = (arr.astype("<u4") << 16).view("<f4")
    elif datatype == "FP16":
        arr = arr.astype("<f4")
    return arr.tolist()
