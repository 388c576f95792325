"""Triton datatypes: wire names, config enum names and numpy dtypes, in one table.

BF16 has no numpy dtype; conch carries it as its raw 16-bit patterns (``uint16``) and
keeps the wire name beside the array wherever the difference matters.
"""

from __future__ import annotations

import numpy as np

# wire name -> numpy dtype (little-endian, as Triton's binary format is)
WIRE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "BYTES": np.dtype(object),
}

WIRE_TYPES = frozenset(WIRE_TO_NUMPY)

# Element size in bytes on the wire; BYTES is variable.
ITEMSIZE: dict[str, int] = {k: v.itemsize for k, v in WIRE_TO_NUMPY.items() if k != "BYTES"}

_NUMPY_TO_WIRE: dict[str, str] = {
    np.dtype(np.bool_).str: "BOOL",
    "|u1": "UINT8",
    "<u2": "UINT16",
    "<u4": "UINT32",
    "<u8": "UINT64",
    "|i1": "INT8",
    "<i2": "INT16",
    "<i4": "INT32",
    "<i8": "INT64",
    "<f2": "FP16",
    "<f4": "FP32",
    "<f8": "FP64",
}


def config_to_wire(type_name: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``."""
    name = type_name.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def wire_to_config(wire: str) -> str:
    return "TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}"


def numpy_to_wire(dtype: np.dtype) -> str:
    """The wire name for a numpy dtype; object and string arrays are BYTES."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "BYTES"
    wire = _NUMPY_TO_WIRE.get(dtype.newbyteorder("<").str if dtype.byteorder == ">" else dtype.str)
    if wire is None:
        raise ValueError(f"numpy dtype {dtype} has no Triton datatype")
    return wire
