"""Raw binary requests (``Inference-Header-Content-Length: 0``): the one input built from
the model's config, with Triton's rules and error messages (its core's request
normalization; qa/L0_http/http_test.py's raw-binary tests send these)."""

from __future__ import annotations

import gzip
import struct
import textwrap
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from conch.core.errors import InvalidArgument
from conch.core.model_config import parse_config
from conch.frontend.http import fast_path
from conch.frontend.http.http_codec import HEADER_LENGTH, decode_request

MAX = 1 << 20


def config(max_batch: int, *inputs: tuple[str, str, list[int]]) -> Any:
    rows = ", ".join(
        f'{{ name: "{n}" data_type: {t} dims: [ {", ".join(map(str, d))} ] }}' for n, t, d in inputs
    )
    text = f"""
        name: "m"
        max_batch_size: {max_batch}
        input [ {rows} ]
        output [ {{ name: "OUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    """
    return parse_config(textwrap.dedent(text), model="m", source="config.pbtxt")


def raw(body: bytes, cfg: Any, header: str | None = "0", enc: str | None = None) -> Any:
    return decode_request(body, header, enc, max_body_bytes=MAX, config=cfg, model_name="m")


def refused(match: str, body: bytes, cfg: Any) -> str:
    with pytest.raises(InvalidArgument, match=match) as e:
        raw(body, cfg)
    assert e.value.status == 400
    return e.value.message


def test_a_batching_models_variable_dim_takes_the_bodys_size_behind_a_batch_of_one() -> None:
    data = np.arange(8, dtype=np.float32).tobytes()
    req = raw(data, config(8, ("INPUT0", "TYPE_FP32", [-1])))
    assert req.id == "" and req.parameters == {}
    assert req.outputs is None and req.binary_data_output  # every output, in binary
    (tensor,) = req.inputs
    assert (tensor.name, tensor.datatype, tensor.shape, tensor.raw) == (
        "INPUT0",
        "FP32",
        (1, 8),
        data,
    )


def test_fixed_dims_and_a_model_without_batching() -> None:
    data = np.arange(6, dtype=np.int16).tobytes()
    req = raw(data, config(0, ("X", "TYPE_INT16", [2, 3])))
    assert (req.inputs[0].datatype, req.inputs[0].shape) == ("INT16", (2, 3))
    # one variable dim among fixed ones: what the fixed ones leave
    req = raw(np.zeros(12, np.float64).tobytes(), config(4, ("X", "TYPE_FP64", [3, -1])))
    assert req.inputs[0].shape == (1, 3, 4)


def test_the_wrong_byte_count_is_tritons_size_mismatch() -> None:
    message = refused(
        "input byte size mismatch",
        np.zeros(5, np.float32).tobytes(),
        config(0, ("X", "TYPE_FP32", [4])),
    )
    assert message == "input byte size mismatch for input 'X' for model 'm'. Expected 16, got 20"
    # a variable dim's share that is not whole elements
    message = refused("input byte size mismatch", b"\x00" * 10, config(8, ("X", "TYPE_FP32", [-1])))
    assert message.endswith("Expected 8, got 10")


def test_more_than_one_input_is_refused_with_tritons_message() -> None:
    cfg = config(8, ("A", "TYPE_FP32", [-1]), ("B", "TYPE_FP32", [-1]), ("C", "TYPE_FP32", [-1]))
    message = refused("Raw request", np.zeros(24, np.float32).tobytes(), cfg)
    assert message == (
        "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs "
        "in 'm' model configuration"
    )


def test_two_variable_dims_cannot_be_deduced() -> None:
    message = refused(
        "can not be deduced", b"\x00" * 8, config(8, ("INPUT0", "TYPE_FP16", [-1, -1]))
    )
    assert message == (
        "The shape of the raw input 'INPUT0' can not be deduced because there are more than "
        "one variable-sized dimension"
    )


def test_a_bytes_input_is_the_whole_body_as_one_element() -> None:
    req = raw(b"427", config(8, ("INPUT0", "TYPE_STRING", [1])))
    (tensor,) = req.inputs
    assert (tensor.datatype, tensor.shape) == ("BYTES", (1, 1))
    assert tensor.raw == struct.pack("<I", 3) + b"427"
    for dims in ([-1], [2], [1, -1]):
        message = refused("BYTE datatype", b"427", config(8, ("INPUT0", "TYPE_STRING", dims)))
        assert message == (
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"
        )
    # Triton checks the variable dims first, whatever the datatype.
    refused("can not be deduced", b"427", config(8, ("INPUT0", "TYPE_STRING", [-1, -1])))


def test_an_empty_body_without_the_header_is_raw_too_as_triton_reads_it() -> None:
    req = raw(b"", config(8, ("X", "TYPE_FP32", [-1])), header=None)
    assert req.inputs[0].shape == (1, 0) and req.inputs[0].raw == b""
    refused("input byte size mismatch", b"", config(0, ("X", "TYPE_FP32", [2])))


def test_a_compressed_raw_body_is_its_inflated_bytes() -> None:
    data = np.arange(4, dtype=np.int32).tobytes()
    req = raw(gzip.compress(data), config(0, ("X", "TYPE_INT32", [4])), enc="gzip")
    assert req.inputs[0].raw == data


def test_a_json_body_is_not_raw() -> None:
    body = b'{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [7]}]}'
    req = raw(body, config(0, ("X", "TYPE_INT32", [1]), ("Y", "TYPE_INT32", [1])), header=None)
    assert not req.binary_data_output and req.inputs[0].shape == (1,)


def test_an_oversized_raw_body_is_refused_in_tritons_words() -> None:
    settings = SimpleNamespace(http_restricted_api=SimpleNamespace(rules=()), max_input_bytes=10)
    plane = SimpleNamespace(settings=settings)
    call = fast_path.infer_call("POST", "/v2/models/m/infer")
    assert call is not None
    headers = {HEADER_LENGTH: "0"}
    status, _, body = fast_path.serve_infer(
        plane,
        call,
        length=11,
        read=lambda _n: b"",
        header=headers.get,  # type: ignore[arg-type]
    )
    assert status == 400
    assert b"Raw input has a byte_size (11 bytes) that exceeds the maximum allowed value" in body
