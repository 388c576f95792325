"""Tensor encodings: raw (Triton binary) <-> numpy <-> JSON, for every datatype."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from conch.core.errors import InvalidArgument
from conch.core.tensors import (
    element_count,
    from_numpy,
    json_to_raw,
    raw_size_ok,
    raw_to_json,
    to_numpy,
    wire_view,
)

FIXED_SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255], [7, 8, 9]], dtype=np.uint8),
    "UINT16": np.array([[0, 1, 65535], [7, 8, 9]], dtype=np.uint16),
    "UINT32": np.array([[0, 1, 2**32 - 1], [7, 8, 9]], dtype=np.uint32),
    "UINT64": np.array([[0, 1, 2**64 - 1], [7, 8, 9]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127], [7, -8, 9]], dtype=np.int8),
    "INT16": np.array([[-(2**15), 0, 2**15 - 1], [7, -8, 9]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1], [7, -8, 9]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [7, -8, 9]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 65504.0], [0.0, 3.0, -2.0]], dtype=np.float16),
    "FP32": np.array([[0.1, -1.5, 3.4e38], [1e-30, 0.0, -7.25]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.5, 1e300], [1e-300, 0.0, -7.25]], dtype=np.float64),
}
JSON_TYPES = [t for t in FIXED_SAMPLES if t not in ("FP16",)]
BYTES_SAMPLE = np.array(
    [[b"", b"abc", "héllo wörld ✓".encode()], [b"\x00\xff\xfe", b"x" * 300, b""]], dtype=object
)


def test_element_count() -> None:
    assert element_count([]) == 1
    assert element_count([2, 3, 4]) == 24
    assert element_count([5, 0]) == 0


@pytest.mark.parametrize("datatype", list(FIXED_SAMPLES))
def test_fixed_numpy_round_trip(datatype: str) -> None:
    arr = FIXED_SAMPLES[datatype]
    dt, raw = from_numpy(arr)
    assert dt == datatype
    assert raw == arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    raw_size_ok(dt, arr.shape, raw, "X")
    back = to_numpy(dt, arr.shape, raw)
    assert back.dtype == arr.dtype.newbyteorder("<") or back.dtype == arr.dtype
    assert back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)


@pytest.mark.parametrize("datatype", list(FIXED_SAMPLES))
@pytest.mark.parametrize("shape", [(0,), (1, 0), (0, 3), (2, 0, 4)])
def test_an_empty_array_is_no_bytes_viewed_or_copied(datatype: str, shape: tuple) -> None:
    """A 0 anywhere in the shape (L0_infer_zero): a memoryview cannot cast such an
    array's view, so wire_view casts its flattened one."""
    arr = np.zeros(shape, FIXED_SAMPLES[datatype].dtype)
    assert from_numpy(arr, datatype) == (datatype, b"")
    dt, raw = wire_view(arr, datatype)
    assert dt == datatype and bytes(raw) == b""
    assert to_numpy(dt, shape, raw).shape == shape


def test_wire_view_views_a_wire_form_array() -> None:
    arr = FIXED_SAMPLES["INT32"].copy()
    _, raw = wire_view(arr, "INT32")
    assert isinstance(raw, memoryview) and raw.format == "B"
    arr[0, 0] = 5  # a view: it sees the change
    assert bytes(raw) == arr.tobytes()


def test_to_numpy_is_zero_copy() -> None:
    raw = np.arange(12, dtype="<f4").tobytes()
    arr = to_numpy("FP32", (3, 4), raw)
    assert not arr.flags.owndata
    assert not arr.flags.writeable
    assert arr[2, 3] == 11.0


def test_bool_is_one_byte_zero_or_one() -> None:
    _, raw = from_numpy(np.array([True, False, True]))
    assert raw == b"\x01\x00\x01"


def test_from_numpy_big_endian_and_non_contiguous() -> None:
    big = np.arange(6, dtype=">i4").reshape(2, 3)
    dt, raw = from_numpy(big)
    assert dt == "INT32"
    assert raw == np.arange(6, dtype="<i4").tobytes()
    view = np.arange(12, dtype=np.float32).reshape(3, 4).T  # Fortran-ordered view
    dt, raw = from_numpy(view)
    np.testing.assert_array_equal(to_numpy(dt, view.shape, raw), view)


def test_from_numpy_casts_within_kind_only() -> None:
    dt, raw = from_numpy(np.array([1.5, 2.5]), "FP32")
    assert dt == "FP32" and raw == np.array([1.5, 2.5], dtype="<f4").tobytes()
    dt, raw = from_numpy(np.array([1, 2], dtype=np.int64), "INT32")
    assert raw == np.array([1, 2], dtype="<i4").tobytes()
    with pytest.raises(InvalidArgument, match="as INT32"):
        from_numpy(np.array([1.5]), "INT32")
    with pytest.raises(InvalidArgument, match="invalid datatype"):
        from_numpy(np.array([1]), "FP8")


def test_from_numpy_unknown_dtype() -> None:
    with pytest.raises(InvalidArgument):
        from_numpy(np.array([1 + 2j]))


def test_bytes_round_trip_and_client_compat() -> None:
    dt, raw = from_numpy(BYTES_SAMPLE)
    assert dt == "BYTES"
    # The same bytes tritonclient produces, and it reads ours back.
    assert raw == serialize_byte_tensor(BYTES_SAMPLE).item()
    np.testing.assert_array_equal(deserialize_bytes_tensor(raw).reshape(2, 3), BYTES_SAMPLE)
    raw_size_ok("BYTES", (2, 3), raw, "S")
    back = to_numpy("BYTES", (2, 3), raw)
    assert back.dtype == object and back.shape == (2, 3)
    assert back.tolist() == BYTES_SAMPLE.tolist()
    assert all(type(x) is bytes for x in back.ravel())


def test_bytes_from_str_and_fixed_width_arrays() -> None:
    _, raw = from_numpy(np.array(["", "ü", "ab"], dtype=object))
    assert raw == b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\xc3\xbc" + b"\x02\x00\x00\x00ab"
    dt, raw_u = from_numpy(np.array(["", "ü", "ab"]))  # numpy "<U2"
    assert dt == "BYTES" and raw_u == raw
    dt, raw_s = from_numpy(np.array([b"a", b"bcd"]))  # numpy "S3": padding is not sent
    assert dt == "BYTES" and to_numpy(dt, [2], raw_s).tolist() == [b"a", b"bcd"]


def test_bytes_empty_tensor() -> None:
    dt, raw = from_numpy(np.empty((0, 3), dtype=object))
    assert dt == "BYTES" and raw == b""
    assert to_numpy("BYTES", (0, 3), b"").shape == (0, 3)


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"\x03\x00\x00\x00ab", "claims 3 bytes"),
        (b"\x01\x00\x00\x00a\x01\x00", "ends after 1 of 2"),
        (b"\x01\x00\x00\x00a\x01\x00\x00\x00bXYZ", "3 bytes left over"),
        (b"", "ends after 0 of 2"),
    ],
)
def test_bytes_malformed(raw: bytes, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match) as e:
        raw_size_ok("BYTES", [2], raw, "TEXT")
    assert "'TEXT'" in e.value.message
    with pytest.raises(InvalidArgument, match=match):
        to_numpy("BYTES", [2], raw)


def test_fixed_size_mismatch_names_input() -> None:
    with pytest.raises(InvalidArgument, match=r"input 'IN'.*expected 24 bytes.*got 20") as e:
        raw_size_ok("FP32", [2, 3], b"\x00" * 20, "IN")
    assert e.value.status == 400
    with pytest.raises(InvalidArgument):
        to_numpy("INT64", [2], b"\x00" * 15)
    with pytest.raises(InvalidArgument, match="invalid datatype"):
        raw_size_ok("FLOAT", [1], b"\x00" * 4, "IN")


def test_bf16_bits() -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    dt, raw = from_numpy(values, "BF16")
    assert dt == "BF16"
    expected = (values.view("<u4") >> 16).astype("<u2")
    assert raw == expected.tobytes()
    assert raw[:2] == b"\x80\x3f"  # 1.0f = 0x3F800000 -> upper half 0x3F80, little-endian
    back = to_numpy("BF16", [4], raw)
    assert back.dtype == np.dtype("<u2")
    np.testing.assert_array_equal(back, expected)
    # uint16 bit patterns pass through unchanged
    assert from_numpy(expected, "BF16") == ("BF16", raw)
    # JSON output shows the floats they stand for
    assert raw_to_json("BF16", [4], raw) == [1.0, -2.5, 3.140625, 0.0]


def test_bf16_from_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    arr = np.array([1.0, -2.5], dtype=ml_dtypes.bfloat16)
    assert from_numpy(arr) == ("BF16", arr.view("<u2").tobytes())


def test_fp16_json_output_is_float() -> None:
    arr = FIXED_SAMPLES["FP16"]
    _, raw = from_numpy(arr)
    assert raw_to_json("FP16", arr.shape, raw) == arr.astype(float).ravel().tolist()


@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_json_round_trip(datatype: str) -> None:
    arr = FIXED_SAMPLES[datatype]
    flat = arr.ravel().tolist()
    raw = json_to_raw(datatype, arr.shape, flat, "X")
    assert raw == from_numpy(arr)[1]
    back = raw_to_json(datatype, arr.shape, raw)
    assert back == flat
    assert [type(v) for v in back] == [type(v) for v in flat]
    # nested data is row-major
    assert json_to_raw(datatype, arr.shape, arr.tolist()) == raw


def test_json_bytes_round_trip() -> None:
    data = ["", "abc", "héllo ✓", "日本語", "", "x"]
    raw = json_to_raw("BYTES", [2, 3], data, "S")
    assert to_numpy("BYTES", [2, 3], raw).ravel().tolist() == [s.encode() for s in data]
    assert raw_to_json("BYTES", [2, 3], raw) == data
    assert json_to_raw("BYTES", [0], []) == b""


def test_raw_to_json_invalid_utf8_is_replaced() -> None:
    _, raw = from_numpy(np.array([b"ok", b"\xff\xfe"], dtype=object))
    assert raw_to_json("BYTES", [2], raw) == ["ok", "\ufffd\ufffd"]


def test_json_scalar_and_empty() -> None:
    assert json_to_raw("INT32", [], 7) == struct.pack("<i", 7)
    assert json_to_raw("FP32", [0, 4], []) == b""


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_json_half_types_refused(datatype: str) -> None:
    with pytest.raises(InvalidArgument, match=f"sending {datatype} data via JSON is not supported"):
        json_to_raw(datatype, [1], [1.0], "H")


@pytest.mark.parametrize(
    "datatype, shape, data, match",
    [
        ("FP32", [2], [1.0], "shape \\[2\\] needs 2, 'data' has 1"),
        ("FP32", [2, 2], [[1.0, 2.0], [3.0]], "needs 4, 'data' has 3"),
        ("FP32", [2], [1.0, "2"], "must be JSON numbers, got number, string"),
        ("FP32", [1], [True], "must be JSON numbers"),
        ("FP64", [1], [None], "got null"),
        ("FP64", [1], [10**400], "out of range"),
        ("INT32", [2], [1, 2.0], "must be JSON integers"),
        ("INT32", [1], [True], "must be JSON integers, got boolean"),
        ("INT32", [1], [2**31], "out of range"),
        ("INT8", [2], [-129, 0], "-129 is not in"),
        ("UINT8", [1], [256], "256 is not in"),
        ("UINT8", [1], [-1], "out of range"),
        ("UINT64", [1], [2**64], "out of range"),
        ("INT64", [1], [-(2**63) - 1], "out of range"),
        ("BOOL", [2], [True, 1], "must be JSON true/false"),
        ("BOOL", [1], ["true"], "must be JSON true/false"),
        ("BYTES", [2], ["a", 1], "must be JSON strings"),
        ("BYTES", [1], [{"b64": "AA=="}], "got object"),
        ("BYTES", [1], ["\ud800"], "not valid unicode"),
        ("FLOAT32", [1], [1.0], "invalid datatype"),
    ],
)
def test_json_bad_data(datatype: str, shape: list[int], data: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match) as e:
        json_to_raw(datatype, shape, data, "IN0")
    assert "'IN0'" in e.value.message
    assert e.value.status == 400


def test_json_extreme_ints_exact() -> None:
    raw = json_to_raw("UINT64", [2], [2**64 - 1, 0])
    assert to_numpy("UINT64", [2], raw).tolist() == [2**64 - 1, 0]
    raw = json_to_raw("INT64", [2], [-(2**63), 2**63 - 1])
    assert to_numpy("INT64", [2], raw).tolist() == [-(2**63), 2**63 - 1]


def test_large_bytes_tensor_matches_client() -> None:
    items = [bytes([i % 256]) * (i % 37) for i in range(5000)] + ["ü" * 3, ""]
    arr = np.array(items, dtype=object)
    dt, raw = from_numpy(arr)
    assert raw == serialize_byte_tensor(arr).item()
    back = to_numpy(dt, [len(items)], raw).tolist()
    assert back == [x.encode() if isinstance(x, str) else x for x in items]
