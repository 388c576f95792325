"""HTTP infer framing: bodies from the stock tritonclient decode, our bodies decode in it."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_inference_request

from conch.core.errors import Internal, InvalidArgument
from conch.core.inference import InferRequest, InputTensor, OutputTensor, RequestedOutput
from conch.core.tensors import from_numpy, to_numpy
from conch.frontend import v2_json
from conch.frontend.http.http_codec import (
    HEADER_LENGTH,
    decode_request,
    encode_response,
    error_body,
    too_large,
)
from conch.frontend.v2_json import classify

MAX = 64 * 1024 * 1024

try:
    import ml_dtypes

    BF16_DTYPE: Any = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover - ml_dtypes comes with tritonclient
    BF16_DTYPE = None

SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, True, True]]),
    "UINT8": np.array([[0, 1, 255], [3, 4, 5]], dtype=np.uint8),
    "UINT16": np.array([[0, 1, 65535], [3, 4, 5]], dtype=np.uint16),
    "UINT32": np.array([[0, 1, 2**32 - 1], [3, 4, 5]], dtype=np.uint32),
    "UINT64": np.array([[0, 1, 2**64 - 1], [3, 4, 5]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127], [3, -4, 5]], dtype=np.int8),
    "INT16": np.array([[-(2**15), 0, 2**15 - 1], [3, -4, 5]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1], [3, -4, 5]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [3, -4, 5]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 65504.0], [0.0, 3.0, -2.0]], dtype=np.float16),
    "FP32": np.array([[0.1, -1.5, 3.4e38], [1e-30, 0.0, -7.25]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.5, 1e300], [1e-300, 0.0, -7.25]], dtype=np.float64),
    "BYTES": np.array(
        [[b"", b"abc", "héllo ✓".encode()], [b"x" * 70, b"", b"\xe6\x97\xa5"]], dtype=object
    ),
}
if BF16_DTYPE is not None:
    SAMPLES["BF16"] = np.array([[1.0, -2.5, 0.0], [3.140625, 256.0, -0.5]], dtype=BF16_DTYPE)

JSON_OK = [t for t in SAMPLES if t not in ("FP16", "BF16")]


def client_body(
    inputs: list[httpclient.InferInput],
    outputs: list[httpclient.InferRequestedOutput] | None = None,
    **kw: Any,
) -> tuple[bytes, str | None]:
    """A request body exactly as tritonclient.http builds it, and its header value."""
    args: dict[str, Any] = {
        "request_id": "",
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
        "custom_parameters": None,
    }
    args.update(kw)
    body, json_size = _get_inference_request(inputs=inputs, outputs=outputs, **args)
    return body, None if json_size is None else str(json_size)


def client_input(name: str, datatype: str, arr: np.ndarray, binary: bool) -> httpclient.InferInput:
    inp = httpclient.InferInput(name, list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=binary)
    return inp


def wire_bytes(datatype: str, arr: np.ndarray) -> bytes:
    """What the raw bytes of ``arr`` must be (BF16 via its bit patterns)."""
    if datatype == "BF16":
        return arr.view("<u2").tobytes()
    return from_numpy(arr, datatype)[1]


def json_doc(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def decode(
    body: bytes, header: str | None = None, enc: str | None = None, max_body: int = MAX
) -> InferRequest:
    return decode_request(body, header, enc, max_body_bytes=max_body)


def simple_input(**over: Any) -> dict[str, Any]:
    entry = {"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}
    entry.update(over)
    return entry


# ------------------------------------------------------------------ requests from the client


@pytest.mark.parametrize(
    "datatype, binary",
    [(t, True) for t in SAMPLES] + [(t, False) for t in JSON_OK],  # FP16/BF16 are binary-only
)
def test_decode_client_request_each_datatype(datatype: str, binary: bool) -> None:
    arr = SAMPLES[datatype]
    body, header = client_body([client_input("IN", datatype, arr, binary)])
    assert (header is not None) == binary
    req = decode(body, header)
    assert req.id == ""
    assert req.outputs is None and req.binary_data_output is True
    (t,) = req.inputs
    assert (t.name, t.datatype, t.shape) == ("IN", datatype, (2, 3))
    assert t.raw == wire_bytes(datatype, arr)
    if datatype not in ("BF16",):
        np.testing.assert_array_equal(to_numpy(datatype, t.shape, t.raw), arr)


def test_decode_client_request_mixed_inputs_outputs_and_params() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([b"one", b"", "twö".encode()], dtype=object)
    c = np.array([[1, 2]], dtype=np.int64)
    empty = np.empty((0,), dtype=object)
    inputs = [
        client_input("A", "FP32", a, True),
        client_input("B", "BYTES", b, False),
        client_input("C", "INT64", c, True),
        client_input("E", "BYTES", empty, True),
    ]
    outputs = [
        httpclient.InferRequestedOutput("Y", binary_data=False),
        httpclient.InferRequestedOutput("X", binary_data=True, class_count=3),
    ]
    body, header = client_body(
        inputs,
        outputs,
        request_id="req-7",
        sequence_id=42,
        sequence_start=True,
        sequence_end=False,
        priority=2,
        timeout=1500,
        custom_parameters={"alpha": "x", "beta": 3, "gamma": True, "delta": 0.5},
    )
    req = decode(body, header)
    assert req.id == "req-7"
    assert [t.name for t in req.inputs] == ["A", "B", "C", "E"]
    np.testing.assert_array_equal(to_numpy("FP32", req.inputs[0].shape, req.inputs[0].raw), a)
    assert to_numpy("BYTES", (3,), req.inputs[1].raw).tolist() == b.tolist()
    np.testing.assert_array_equal(to_numpy("INT64", (1, 2), req.inputs[2].raw), c)
    assert req.inputs[3].shape == (0,) and req.inputs[3].raw == b""
    assert req.outputs == [RequestedOutput("Y", False, 0), RequestedOutput("X", True, 3)]
    assert req.binary_data_output is False
    assert req.parameters == {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 2,
        "timeout": 1500,
        "alpha": "x",
        "beta": 3,
        "gamma": True,
        "delta": 0.5,
    }


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_decode_compressed_client_request(encoding: str) -> None:
    arr = np.arange(1000, dtype=np.int32)
    body, header = client_body([client_input("IN", "INT32", arr, True)])
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    req = decode(packed, header, encoding)
    np.testing.assert_array_equal(to_numpy("INT32", (1000,), req.inputs[0].raw), arr)
    req = decode(packed, header, encoding.upper())
    assert req.inputs[0].raw == arr.tobytes()


def test_header_length_on_all_json_request_is_accepted() -> None:
    body = json_doc({"inputs": [simple_input()]})
    req = decode(body, str(len(body)))
    assert req.inputs[0].raw == np.array([1, 2], dtype="<i4").tobytes()


def test_outputs_defaults() -> None:
    body = json_doc(
        {
            "inputs": [simple_input()],
            "parameters": {"binary_data_output": True},
            "outputs": [{"name": "A"}, {"name": "B", "parameters": {"binary_data": True}}],
        }
    )
    req = decode(body)
    assert req.outputs == [RequestedOutput("A", False), RequestedOutput("B", True)]
    assert req.binary_data_output is True
    req = decode(json_doc({"inputs": [simple_input()], "outputs": []}))
    assert req.outputs is None and req.binary_data_output is False


def test_zero_byte_binary_input() -> None:
    body = json_doc(
        {
            "inputs": [
                {
                    "name": "S",
                    "datatype": "BYTES",
                    "shape": [0],
                    "parameters": {"binary_data_size": 0},
                }
            ]
        }
    )
    req = decode(body, str(len(body)))
    assert req.inputs[0].raw == b""


def test_body_may_be_bytearray_or_memoryview() -> None:
    body, header = client_body([client_input("IN", "FP32", np.ones(4, np.float32), True)])
    assert decode(bytearray(body), header).inputs[0].raw == np.ones(4, "<f4").tobytes()  # type: ignore[arg-type]
    assert decode(memoryview(body), header).inputs[0].raw == np.ones(4, "<f4").tobytes()  # type: ignore[arg-type]


# --------------------------------------------------------------------------- bad requests


def binary_body(entries: list[dict[str, Any]], tail: bytes) -> tuple[bytes, str]:
    head = json_doc({"inputs": entries})
    return head + tail, str(len(head))


def expect_400(
    match: str, body: bytes, header: str | None = None, enc: str | None = None, max_body: int = MAX
) -> InvalidArgument:
    with pytest.raises(InvalidArgument, match=match) as e:
        decode(body, header, enc, max_body)
    assert e.value.status == 400
    return e.value


def test_bad_json() -> None:
    expect_400("failed to parse the request JSON", b'{"inputs": [')
    expect_400("failed to parse the request JSON", b"\xff\xfe{}")
    expect_400("must be an object", b"[1, 2]")


def test_json_depth_limit() -> None:
    ok = {"inputs": [simple_input()], "parameters": {"x": "y"}}
    decode(json_doc(ok))
    deep: Any = "x"
    for _ in range(120):
        deep = [deep]
    expect_400(
        r"JSON nesting depth exceeds maximum allowed limit \(100\)",
        json_doc({"inputs": [simple_input(data=deep)]}),
    )
    expect_400(
        r"JSON nesting depth exceeds maximum allowed limit \(100\)", b"[" * 100000 + b"]" * 100000
    )
    nested_ok = np.arange(16).reshape(2, 2, 2, 2).tolist()
    req = decode(json_doc({"inputs": [simple_input(shape=[2, 2, 2, 2], data=nested_ok)]}))
    assert to_numpy("INT32", (2, 2, 2, 2), req.inputs[0].raw).ravel().tolist() == list(range(16))
    # Many brackets but shallow: the walk runs (more than 100 opening brackets) and passes.
    rows = [[i] for i in range(300)]
    req = decode(json_doc({"inputs": [simple_input(shape=[300, 1], data=rows)]}))
    assert to_numpy("INT32", (300, 1), req.inputs[0].raw).ravel().tolist() == list(range(300))
    # Exactly at the limit, counted as Triton counts (the document is level 1), is allowed.
    at_limit: Any = 1
    for _ in range(97):  # inside the document, "inputs" and the input: levels 4 to 100
        at_limit = [at_limit]
    decode(json_doc({"inputs": [simple_input(shape=[1] * 97, data=at_limit)]}))
    expect_400(
        r"JSON nesting depth exceeds maximum allowed limit \(100\)",
        json_doc({"inputs": [simple_input(shape=[1] * 98, data=[at_limit])]}),
    )
    # A document that is one scalar has no depth to refuse (its caller refuses a non-object).
    for scalar in (None, 3, 2.5, "x", True):
        v2_json.check_depth(scalar)


def test_json_the_fast_parser_refuses_is_read_as_the_standard_parser_reads_it() -> None:
    # NaN and Infinity literals, an integer past 64 bits, a lone surrogate: orjson refuses
    # each; the request is then parsed by json.loads, as it always was.
    body = (
        b'{"inputs": [{"name": "IN", "datatype": "FP32", "shape": [3], '
        b'"data": [NaN, Infinity, 1.5]}], '
        b'"parameters": {"big": 123456789012345678901234567890, "s": "\\ud800"}}'
    )
    req = decode(body)
    got = to_numpy("FP32", (3,), req.inputs[0].raw)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 1.5
    assert req.parameters["big"] == 123456789012345678901234567890
    assert req.parameters["s"] == "\ud800"


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "999999"])
def test_bad_header_length(value: str) -> None:
    body = json_doc({"inputs": [simple_input()]})
    expect_400(HEADER_LENGTH, body, value)


def test_a_raw_binary_request_needs_a_model_config() -> None:
    # Raw binary requests (header 0) are decoded against the model's config
    # (tests/unit/frontend/http/test_raw_binary.py); a caller with none refuses them.
    expect_400("raw binary requests", b"\x00" * 8, "0")


def test_header_length_too_short_cuts_json() -> None:
    body = json_doc({"inputs": [simple_input()]})
    expect_400("failed to parse", body, str(len(body) - 3))


def test_leftover_and_missing_binary() -> None:
    entry = {"name": "B", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
    body, header = binary_body([entry], b"\x00" * 12)
    expect_400("unexpected additional input data", body, header)
    body, header = binary_body([entry], b"\x00" * 5)
    err = expect_400("unexpected size for input 'B'", body, header)
    assert "binary_data_size is 8" in err.message
    # bytes after a JSON-only body are also extra
    head = json_doc({"inputs": [simple_input()]})
    expect_400("unexpected additional input data", head + b"junk", str(len(head)))


def test_binary_size_does_not_match_shape() -> None:
    entry = {"name": "B", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 8}}
    body, header = binary_body([entry], b"\x00" * 8)
    expect_400("unexpected size for input 'B'", body, header)
    entry = {"name": "S", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 6}}
    body, header = binary_body([entry], b"\x02\x00\x00\x00ab")
    expect_400("input 'S'", body, header)


def test_binary_slices_in_input_order() -> None:
    entries = [
        {"name": "X", "datatype": "INT8", "shape": [3], "parameters": {"binary_data_size": 3}},
        simple_input(name="J"),
        {"name": "Y", "datatype": "UINT8", "shape": [2], "parameters": {"binary_data_size": 2}},
    ]
    body, header = binary_body(entries, b"\x01\x02\x03\x04\x05")
    req = decode(body, header)
    assert [t.raw for t in req.inputs] == [
        b"\x01\x02\x03",
        np.array([1, 2], "<i4").tobytes(),
        b"\x04\x05",
    ]


@pytest.mark.parametrize(
    "entry, match",
    [
        (simple_input(datatype="FP8"), "invalid datatype 'FP8' for input 'IN'"),
        (simple_input(datatype=5), "input 'IN' must have a string 'datatype'"),
        (simple_input(shape=[-1]), "input 'IN' must have a 'shape'"),
        (simple_input(shape=[2.0]), "input 'IN' must have a 'shape'"),
        (simple_input(shape=[True, 2]), "input 'IN' must have a 'shape'"),
        (simple_input(shape="2"), "input 'IN' must have a 'shape'"),
        (simple_input(name=""), r"inputs\[0\] must have a non-empty string 'name'"),
        (simple_input(name=3), r"inputs\[0\] must have"),
        ("IN", r"inputs\[0\] must be a JSON object"),
        (simple_input(parameters={"binary_data_size": 8}), "input 'IN' must set only one of"),
        ({"name": "IN", "datatype": "INT32", "shape": [2]}, "input 'IN' must set only one of"),
        (
            simple_input(data=None, parameters={"shared_memory_region": "r"}),
            "input 'IN' must set only one",
        ),
        (
            {
                "name": "IN",
                "datatype": "INT32",
                "shape": [2],
                "parameters": {"shared_memory_region": "r"},
            },
            "input 'IN': shared memory is not supported",
        ),
        (
            {
                "name": "IN",
                "datatype": "INT32",
                "shape": [2],
                "parameters": {"binary_data_size": -8},
            },
            "'binary_data_size' of input 'IN' must be a non-negative integer",
        ),
        (simple_input(parameters=[]), "'parameters' of input 'IN' must be a JSON object"),
        (simple_input(data=[1, "2"]), "INT32 data for input 'IN' must be JSON integers"),
        (simple_input(data=[1]), "for input 'IN'"),
        (
            simple_input(datatype="FP16", data=[1.0, 2.0]),
            "sending FP16 data via JSON is not supported",
        ),
    ],
)
def test_bad_input_entries(entry: Any, match: str) -> None:
    expect_400(match, json_doc({"inputs": [entry]}))


def test_bad_request_level_fields() -> None:
    # As Triton: 'inputs' must be there, and may be empty (the model's config decides).
    assert decode(json_doc({"inputs": []})).inputs == []
    expect_400("Unable to parse 'inputs'", json_doc({}))
    expect_400("Unable to parse 'inputs'", json_doc({"inputs": {}}))
    expect_400("'id' must be a string", json_doc({"id": 5, "inputs": [simple_input()]}))
    expect_400(
        "reserved for Triton", json_doc({"inputs": [simple_input()], "parameters": {"triton_x": 1}})
    )
    expect_400(
        "'parameters' must be a JSON object",
        json_doc({"inputs": [simple_input()], "parameters": [1]}),
    )
    expect_400(
        "parameter 'priority'",
        json_doc({"inputs": [simple_input()], "parameters": {"priority": -1}}),
    )
    expect_400(
        "parameter 'timeout'",
        json_doc({"inputs": [simple_input()], "parameters": {"timeout": "5"}}),
    )
    expect_400(
        "binary_data_output",
        json_doc({"inputs": [simple_input()], "parameters": {"binary_data_output": 1}}),
    )
    expect_400(
        "parameter 'custom' has invalid type",
        json_doc({"inputs": [simple_input()], "parameters": {"custom": [1]}}),
    )
    expect_400(
        "input 'IN' already exists in request",
        json_doc({"inputs": [simple_input(), simple_input()]}),
    )
    # sequence ids may be strings
    req = decode(json_doc({"inputs": [simple_input()], "parameters": {"sequence_id": "abc"}}))
    assert req.parameters["sequence_id"] == "abc"


def test_a_negative_dimension_is_the_clients_400() -> None:
    """L0_http's test_negative_dimensions expects Triton's 500, which only says that its JSON
    reader failed first (reading 'shape' as unsigned, its errors carry INTERNAL). The shape
    is the client's mistake: the same frontend's own check a step later answers a negative
    dimension with INVALID_ARG ("contains one or more invalid dimensions"), a 400. So conch
    keeps the 400."""
    body = json_doc({"inputs": [simple_input(datatype="FP32", shape=[2, -5], data=[1.0])]})
    expect_400(re.escape("input 'IN' must have a 'shape' that is a list of non-negative"), body)


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        # [16, 2**60 + 2] holds 2**64 + 32 elements: more than an int64 counts.
        (
            [16, 2**60 + 2],
            "invalid shape for input 'IN': shape [16,1152921504606846978] causes total element "
            "count to exceed maximum size of 9223372036854775807",
        ),
        # [4, 2**60 + 2] has 2**62 + 8 elements, which fit, but not their FP32 bytes.
        (
            [4, 2**60 + 2],
            "byte size overflow for input 'IN': element count (4611686018427387912) * data "
            "type size (4) exceeds maximum allowed size (9223372036854775807)",
        ),
    ],
)
def test_a_shape_past_int64_is_refused_in_tritons_words(shape: list[int], words: str) -> None:
    """L0_http's test_buffer_size_overflow: the shape is refused before the one element of
    'data' is counted against it."""
    body = json_doc({"inputs": [simple_input(datatype="FP32", shape=shape, data=[1.0])]})
    assert expect_400(re.escape(words), body).message == words


@pytest.mark.parametrize(
    "outputs, match",
    [
        ({"name": "A"}, "'outputs' must be a JSON array"),
        ([{"name": "A"}, {"name": "A"}], "output 'A' already exists in request"),
        (["A"], r"outputs\[0\] must be a JSON object"),
        ([{"parameters": {}}], r"outputs\[0\] must have a non-empty string 'name'"),
        ([{"name": "A", "parameters": {"binary_data": "yes"}}], "'binary_data' of output 'A'"),
        ([{"name": "A", "parameters": {"classification": -1}}], "'classification' of output 'A'"),
        ([{"name": "A", "parameters": {"shared_memory_region": "r"}}], "output 'A': shared memory"),
    ],
)
def test_bad_outputs(outputs: Any, match: str) -> None:
    expect_400(match, json_doc({"inputs": [simple_input()], "outputs": outputs}))


def test_unknown_content_encoding() -> None:
    expect_400(
        "unsupported Content-Encoding 'br'", json_doc({"inputs": [simple_input()]}), None, "br"
    )


def test_corrupt_and_truncated_compression() -> None:
    body = json_doc({"inputs": [simple_input()]})
    expect_400("failed to decompress gzip", b"not gzip at all", None, "gzip")
    expect_400("truncated", gzip.compress(body)[:-12], None, "gzip")
    expect_400("failed to decompress deflate", gzip.compress(body), None, "deflate")
    expect_400("follow the compressed stream", gzip.compress(body) + b"junk", None, "gzip")


def test_gzip_bomb_is_bounded() -> None:
    bomb = gzip.compress(b"\x00" * (64 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < 1024 * 1024
    expect_400(
        "Decompressed data size exceeds the maximum allowed value of 1048576 bytes",
        bomb,
        None,
        "gzip",
        max_body=1024 * 1024,
    )


def test_body_over_limit() -> None:
    body = json_doc({"inputs": [simple_input()]})
    limit = len(body) - 1
    expect_400(f"request JSON size of {len(body)} bytes", body, None, None, max_body=limit)
    decode(body, max_body=len(body))


@pytest.mark.parametrize(
    ("header_length", "words"),
    [
        (
            "0",
            "Raw input has a byte_size (100 bytes) that exceeds the maximum allowed value of 10 bytes",
        ),
        (None, "request JSON size of 100 bytes exceeds the maximum allowed input size of 10 bytes"),
        ("40", "request JSON size of 40 bytes exceeds the maximum allowed input size of 10 bytes"),
        ("5", "request body of 100 bytes exceeds the maximum allowed input size of 10 bytes"),
    ],
    ids=["raw", "json", "json-part", "binary-part"],
)
def test_a_body_over_the_limit_in_tritons_words(header_length: str | None, words: str) -> None:
    """Triton's words for what is over: a raw binary request's input, the JSON document
    (the whole body, or the JSON part of one with binary tensors); conch's, in the same
    form, where only the binary tensors are."""
    message = too_large(100, 10, header_length).message
    assert message == f"{words}. Use --http-max-input-size to increase the limit."


# ------------------------------------------------------------------------------ responses


def make_request(
    outputs: list[RequestedOutput] | None, binary_data_output: bool = False, rid: str = ""
) -> InferRequest:
    return InferRequest(rid, [], outputs, binary_data_output, {})


def output_of(name: str, datatype: str, arr: np.ndarray) -> OutputTensor:
    return OutputTensor(name, datatype, tuple(arr.shape), wire_bytes(datatype, arr))


def client_result(body: bytes, headers: dict[str, str]) -> httpclient.InferResult:
    header = headers.get(HEADER_LENGTH)
    return httpclient.InferResult.from_response_body(
        body,
        header_length=None if header is None else int(header),
        content_encoding=headers.get("Content-Encoding"),
    )


def expected_json_numpy(datatype: str, arr: np.ndarray) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([b.decode() for b in arr.ravel()], dtype=object).reshape(arr.shape)
    return arr


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_client_reads_each_datatype(datatype: str, binary: bool) -> None:
    arr = SAMPLES[datatype]
    req = make_request([RequestedOutput("OUT", binary)])
    body, headers = encode_response(
        model_name="m",
        model_version="1",
        request_id="",
        outputs=[output_of("OUT", datatype, arr)],
        request=req,
    )
    assert (HEADER_LENGTH in headers) == binary
    result = client_result(body, headers)
    got = result.as_numpy("OUT")
    assert got.shape == arr.shape
    if binary:
        assert got.dtype == arr.dtype
        if datatype == "BYTES":
            assert got.tolist() == arr.tolist()
        else:
            np.testing.assert_array_equal(got, arr)
    else:
        want = expected_json_numpy(datatype, arr)
        if datatype == "BYTES":
            assert got.tolist() == want.tolist()
        else:
            np.testing.assert_array_equal(got.astype(arr.dtype), want)


def test_binary_layout_and_headers() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([b"xy", b""], dtype=object)
    e = np.empty((0, 2), dtype=np.int32)
    req = make_request(
        [RequestedOutput("B", True), RequestedOutput("E", True), RequestedOutput("A", True)],
        rid="r1",
    )
    outs = [output_of("A", "FP32", a), output_of("B", "BYTES", b), output_of("E", "INT32", e)]
    body, headers = encode_response(
        model_name="m", model_version="3", request_id="r1", outputs=outs, request=req
    )
    assert headers["Content-Type"] == "application/octet-stream"
    n = int(headers[HEADER_LENGTH])
    doc = json.loads(body[:n])
    assert doc["id"] == "r1" and doc["model_name"] == "m" and doc["model_version"] == "3"
    assert [o["name"] for o in doc["outputs"]] == ["B", "E", "A"]
    for o in doc["outputs"]:
        assert o["parameters"] == {
            "binary_data_size": len(dict((x.name, x.raw) for x in outs)[o["name"]])
        }
        assert "data" not in o
    assert body[n:] == outs[1].raw + outs[0].raw
    result = client_result(body, headers)
    np.testing.assert_array_equal(result.as_numpy("A"), a)
    assert result.as_numpy("B").tolist() == [b"xy", b""]
    assert result.as_numpy("E").shape == (0, 2)


def test_all_json_response_has_no_header_and_no_parameters() -> None:
    a = np.arange(3, dtype=np.int32)
    req = make_request([RequestedOutput("A", False)])
    body, headers = encode_response(
        model_name="m",
        model_version="1",
        request_id="",
        outputs=[output_of("A", "INT32", a)],
        request=req,
    )
    assert headers == {"Content-Type": "application/json"}
    doc = json.loads(body)
    assert "id" not in doc
    assert doc["outputs"] == [{"name": "A", "datatype": "INT32", "shape": [3], "data": [0, 1, 2]}]


def test_output_selection_rules() -> None:
    outs = [
        output_of("A", "INT32", np.arange(2, dtype=np.int32)),
        output_of("B", "FP32", np.ones(2, np.float32)),
    ]
    # no list: all outputs in model order, binary per binary_data_output
    for flag in (True, False):
        body, headers = encode_response(
            model_name="m",
            model_version="1",
            request_id="",
            outputs=outs,
            request=make_request(None, flag),
        )
        n = int(headers.get(HEADER_LENGTH, len(body)))
        doc = json.loads(body[:n])
        assert [o["name"] for o in doc["outputs"]] == ["A", "B"]
        assert all(("parameters" in o) == flag for o in doc["outputs"])
    # listed output without binary_data is JSON even when binary_data_output is true
    req = make_request([RequestedOutput("B", False)], binary_data_output=True)
    body, headers = encode_response(
        model_name="m", model_version="1", request_id="", outputs=outs, request=req
    )
    doc = json.loads(body)
    assert HEADER_LENGTH not in headers
    assert doc["outputs"] == [{"name": "B", "datatype": "FP32", "shape": [2], "data": [1.0, 1.0]}]


def test_missing_output_is_internal() -> None:
    with pytest.raises(Internal, match="did not produce output 'Z'"):
        encode_response(
            model_name="m",
            model_version="1",
            request_id="",
            outputs=[],
            request=make_request([RequestedOutput("Z", True)]),
        )


@pytest.mark.parametrize(
    "encoding, accept",
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip", "deflate, gzip;q=0.5"),
        ("deflate", "gzip;q=0, deflate"),
    ],
)
def test_response_compression(encoding: str, accept: str) -> None:
    a = np.arange(1000, dtype=np.int64)
    j = np.arange(4, dtype=np.int32)
    req = make_request([RequestedOutput("A", True), RequestedOutput("J", False)])
    plain, plain_headers = encode_response(
        model_name="m",
        model_version="1",
        request_id="",
        outputs=[output_of("A", "INT64", a), output_of("J", "INT32", j)],
        request=req,
    )
    body, headers = encode_response(
        model_name="m",
        model_version="1",
        request_id="",
        outputs=[output_of("A", "INT64", a), output_of("J", "INT32", j)],
        request=req,
        accept_encoding=accept,
    )
    assert headers["Content-Encoding"] == encoding
    assert headers[HEADER_LENGTH] == plain_headers[HEADER_LENGTH]  # uncompressed JSON length
    assert len(body) < len(plain)
    result = client_result(body, headers)
    np.testing.assert_array_equal(result.as_numpy("A"), a)
    np.testing.assert_array_equal(result.as_numpy("J"), j)


def test_no_compression_when_not_accepted() -> None:
    req = make_request(None)
    outs = [output_of("A", "INT32", np.arange(2, dtype=np.int32))]
    for accept in (None, "", "br", "identity", "gzip;q=0"):
        _, headers = encode_response(
            model_name="m",
            model_version="1",
            request_id="",
            outputs=outs,
            request=req,
            accept_encoding=accept,
        )
        assert "Content-Encoding" not in headers


def test_classification_unbatched_with_labels() -> None:
    scores = np.array([0.1, 3.3, 0.5, 3.3, 2.0], dtype=np.float32)
    req = make_request([RequestedOutput("P", False, class_count=3)])
    labels = {"P": ["zero", "one", "two", "three"]}  # no label for index 4
    body, _ = encode_response(
        model_name="m",
        model_version="1",
        request_id="",
        outputs=[output_of("P", "FP32", scores)],
        request=req,
        labels=labels,
    )
    (out,) = json.loads(body)["outputs"]
    assert out["datatype"] == "BYTES" and out["shape"] == [3]
    assert out["data"] == ["3.300000:1:one", "3.300000:3:three", "2.000000:4"]
    assert set(out) == {"name", "datatype", "shape", "data"}


def test_classification_batched_binary_and_k_over_n() -> None:
    scores = np.array([[1, 5, 3], [9, 2, 9]], dtype=np.int32)
    req = make_request([RequestedOutput("P", True, class_count=10)])
    body, headers = encode_response(
        model_name="m",
        model_version="1",
        request_id="",
        outputs=[output_of("P", "INT32", scores)],
        request=req,
        batched=True,
    )
    got = client_result(body, headers).as_numpy("P")
    assert got.shape == (2, 3)
    assert got.tolist() == [[b"5:1", b"3:2", b"1:0"], [b"9:0", b"9:2", b"2:1"]]


def test_classification_of_bytes_refused() -> None:
    req = make_request([RequestedOutput("S", False, class_count=1)])
    with pytest.raises(InvalidArgument, match="class result not available"):
        encode_response(
            model_name="m",
            model_version="1",
            request_id="",
            outputs=[output_of("S", "BYTES", np.array([b"a"], dtype=object))],
            request=req,
        )


def test_round_trip_decode_then_encode() -> None:
    a = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    body, header = client_body(
        [client_input("IN", "FP32", a, True)],
        [httpclient.InferRequestedOutput("OUT", binary_data=True)],
        request_id="abc",
    )
    req = decode(body, header)
    echoed = [OutputTensor("OUT", t.datatype, t.shape, t.raw) for t in req.inputs]
    out_body, headers = encode_response(
        model_name="m", model_version="1", request_id=req.id, outputs=echoed, request=req
    )
    result = client_result(out_body, headers)
    assert result.get_response()["id"] == "abc"
    np.testing.assert_array_equal(result.as_numpy("OUT"), a)


def test_error_body() -> None:
    assert json.loads(error_body('bad "input" ✓')) == {"error": 'bad "input" ✓'}


def test_input_tensor_fields() -> None:
    t = InputTensor("A", "INT8", (1,), b"\x01")
    assert (t.name, t.datatype, t.shape, t.raw) == ("A", "INT8", (1,), b"\x01")


def test_classify_other_types_and_empty_batch() -> None:
    bf16 = OutputTensor("P", "BF16", (3,), np.array([0x3F80, 0x4000, 0xBF80], np.uint16).tobytes())
    out = classify(bf16, 2, None, False)
    assert (out.datatype, out.shape) == ("BYTES", (2,))
    assert to_numpy("BYTES", out.shape, out.raw).tolist() == [b"2.000000:1", b"1.000000:0"]
    big = OutputTensor("P", "UINT64", (3,), np.array([2**64 - 1, 0, 5], np.uint64).tobytes())
    out = classify(big, 5, None, False)
    assert to_numpy("BYTES", out.shape, out.raw).tolist() == [
        b"18446744073709551615:0",
        b"5:2",
        b"0:1",
    ]
    empty = OutputTensor("P", "FP32", (0, 5), b"")
    assert classify(empty, 3, None, True).shape == (0, 3)


def test_a_json_line_has_no_binary_tensor_extension() -> None:
    # Batch-job lines are documents alone: binary data has nowhere to come from.
    line = json.dumps(
        {
            "inputs": [
                {
                    "name": "B",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ]
        }
    ).encode()
    with pytest.raises(InvalidArgument, match="binary tensor extension"):
        v2_json.decode_request(line)
    assert (
        decode_request(line + b"\0\0\x80?", str(len(line)), None, max_body_bytes=MAX).inputs[0].raw
        == b"\0\0\x80?"
    )
