"""Triton's generate extension, JSON ↔ tensors (``conch.frontend.http.generate``), with
no server: fields to inputs or parameters, shapes, Triton's errors, outputs to fields."""

from __future__ import annotations

import numpy as np
import pytest

from conch.core import tensors
from conch.core.errors import InvalidArgument
from conch.core.inference import InferRequest, OutputTensor
from conch.frontend.dataplane import InferOutcome
from conch.frontend.http import generate as g
from conch.wire.stream_log import Position

INPUTS = [
    {"name": "PROMPT", "datatype": "BYTES", "shape": [1]},
    {"name": "STREAM", "datatype": "BOOL", "shape": [1]},
    {"name": "IDS", "datatype": "INT32", "shape": [-1]},
    {"name": "TEMP", "datatype": "FP32", "shape": [-1, 1]},
]


def decode(body: str, inputs=INPUTS, limit: int = 0) -> InferRequest:
    return g.decode_request(g.parse_body(body.encode()), inputs, max_input_bytes=limit)


def refused(body: str, inputs=INPUTS, limit: int = 0) -> str:
    with pytest.raises(InvalidArgument) as info:
        decode(body, inputs, limit)
    return info.value.message


def test_fields_become_inputs_by_name_and_the_rest_parameters() -> None:
    req = decode(
        '{"id": "42", "PROMPT": "hi", "STREAM": true, "IDS": [1, 2, 3], "TEMP": 0.5,'
        ' "top_k": 5, "mode": "fast", "greedy": false, "p": 0.9}'
    )
    by_name = {t.name: t for t in req.inputs}
    assert [t.name for t in req.inputs] == ["PROMPT", "STREAM", "IDS", "TEMP"]
    assert by_name["PROMPT"].shape == (1,)
    assert tensors.to_numpy("BYTES", (1,), by_name["PROMPT"].raw).tolist() == [b"hi"]
    assert by_name["STREAM"].shape == (1,) and by_name["STREAM"].raw == b"\x01"
    assert by_name["IDS"].shape == (3,)
    assert np.frombuffer(by_name["IDS"].raw, "<i4").tolist() == [1, 2, 3]
    assert by_name["TEMP"].shape == (1, 1)  # the outer variable dimension is 1
    assert np.frombuffer(by_name["TEMP"].raw, "<f4").tolist() == [0.5]
    assert req.id == "42"
    assert req.outputs is None and req.binary_data_output is False
    assert req.parameters == {"id": "42", "top_k": 5, "mode": "fast", "greedy": False, "p": 0.9}


def test_the_parameters_object_holds_parameters_and_inputs() -> None:
    req = decode('{"PROMPT": "x", "parameters": {"STREAM": false, "temperature": 0}}')
    assert [t.name for t in req.inputs] == ["PROMPT", "STREAM"]
    assert req.parameters == {"temperature": 0}


def test_a_body_that_names_no_input_has_none() -> None:
    assert decode("{}").inputs == []
    assert decode("").inputs == []  # an empty body is an empty object, as in Triton
    req = decode('{"abc": 123}')
    assert req.inputs == [] and req.parameters == {"abc": 123}


@pytest.mark.parametrize(
    ("count", "shape", "expected"),
    [
        (1, [1], (1,)),
        (3, [-1], (3,)),
        (6, [-1, 3], (2, 3)),
        (4, [-1, -1], (1, 4)),
        (4, [2, -1], (2, 2)),
        (2, [2], (2,)),
        (1, [], ()),
    ],
)
def test_elements_spread_over_the_shape_as_triton_does(count, shape, expected) -> None:
    assert g.spread(count, shape, "X") == expected


@pytest.mark.parametrize(("count", "shape"), [(3, [2]), (2, [1]), (4, [3, -1]), (2, [])])
def test_elements_that_fit_no_shape_are_refused(count, shape) -> None:
    with pytest.raises(InvalidArgument) as info:
        g.spread(count, shape, "X")
    assert info.value.message == "The schema can not convert input 'X' to tensor with proper shape"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"PROMPT": 123, "STREAM": false}', "attempt to access JSON non-string as string"),
        ('{"PROMPT": "hi", "STREAM": "false"}', "attempt to access JSON non-boolean as boolean"),
        ('{"PROMPT": true, "STREAM": 123}', "attempt to access JSON non-string as string"),
        ('{"STREAM": 123, "PROMPT": true}', "attempt to access JSON non-boolean as boolean"),
        ('{"IDS": [1, 2.5]}', "non-signed-integer as signed-integer"),
        ('{"TEMP": "hot"}', "non-number as double"),
        ('{"PROMPT": {"USER": "hi"}}', "attempt to access JSON non-string as string"),
        ('{"PROMPT": "a", "STREAM": false, "PROMPT": "b"}', "input 'PROMPT' already exists"),
        ('{"PARAMS": {"a": 0}}', "parameter 'PARAMS' has invalid type"),
        ('{"x": null}', "parameter 'x' has invalid type"),
        ('{"parameters": 1}', "Expected JSON object for keyword: 'parameters'"),
        (
            '{"parameters": {"nested": {"twice": 1}}}',
            "Converting keyword: 'parameters': parameter 'nested' has invalid type.",
        ),
        ('{"id": 7}', "Unable to parse 'id'"),
        ('{"priority": -1}', "parameter 'priority' must be an unsigned integer"),
        ('{"triton_x": 1}', "reserved for Triton usage"),
        ("[1]", "must be an object"),
        ("{", "failed to parse the request JSON buffer"),
    ],
)
def test_tritons_errors_in_its_order(body: str, message: str) -> None:
    assert message in refused(body)


def test_an_input_named_parameters_clashes_with_the_keyword() -> None:
    inputs = [{"name": "parameters", "datatype": "INT32", "shape": [1]}]
    assert refused('{"parameters": {}}', inputs) == (
        "Keyword 'parameters' for nested schema also given as input tensor name"
    )


def test_half_floats_are_refused_in_json() -> None:
    inputs = [{"name": "H", "datatype": "FP16", "shape": [1]}]
    assert "receiving FP16 data via JSON is not supported" in refused('{"H": 1.0}', inputs)


def test_the_input_size_limit_counts_every_input() -> None:
    message = refused('{"IDS": [1, 2, 3, 4], "TEMP": [1.0, 2.0]}', limit=20)
    assert message.startswith("request size of 16 bytes with input 'TEMP' of size 8 bytes")
    assert "exceeds the maximum allowed input size of 20" in message


def outcome(outputs: list[OutputTensor], request_id: str = "") -> InferOutcome:
    req = InferRequest(request_id, [], None, False, {})
    return InferOutcome("llm", 3, req, outputs, None, False)


def test_outputs_become_fields_scalars_bare_and_sorted() -> None:
    text = OutputTensor("TEXT", "BYTES", (1,), tensors.encode_bytes_elements(["hello"]))
    ids = OutputTensor("IDS", "INT32", (1, 3), np.array([[4, 5, 6]], "<i4").tobytes())
    empty = OutputTensor("NONE", "FP32", (0,), b"")
    doc = g.response_document(outcome([text, ids, empty], "42"))
    assert doc == {
        "IDS": [4, 5, 6],
        "NONE": [],
        "TEXT": "hello",
        "id": "42",
        "model_name": "llm",
        "model_version": "3",
    }
    assert list(doc) == sorted(doc)
    assert "id" not in g.response_document(outcome([text]))  # no id asked, none answered


def test_an_output_named_like_a_reserved_field_does_not_replace_it() -> None:
    clash = OutputTensor("model_name", "INT32", (1,), np.array([1], "<i4").tobytes())
    assert g.response_document(outcome([clash]))["model_name"] == "llm"


def test_an_event_is_one_data_line_and_a_blank_line() -> None:
    text = OutputTensor("TEXT", "BYTES", (1,), tensors.encode_bytes_elements(["a"]))
    assert g.sse_event(g.Event(outcome([text]))) == (
        b'data: {"TEXT":"a","model_name":"llm","model_version":"3"}\n\n'
    )
    assert g.sse_event(g.Event(InvalidArgument("boom"))) == b'data: {"error":"boom"}\n\n'


def test_a_kept_streams_event_has_its_id_and_a_restart_comes_before_it() -> None:
    text = OutputTensor("TEXT", "BYTES", (1,), tensors.encode_bytes_elements(["a"]))
    assert g.sse_event(g.Event(outcome([text]), Position(1, 4))) == (
        b'id: 1-4\ndata: {"TEXT":"a","model_name":"llm","model_version":"3"}\n\n'
    )
    assert g.sse_event(g.Event(outcome([text]), Position(2, 0), restarted=True)) == (
        b"event: restart\ndata: {}\n\n"
        b'id: 2-0\ndata: {"TEXT":"a","model_name":"llm","model_version":"3"}\n\n'
    )
    # An error is no event to resume after: it ends the stream.
    assert g.sse_event(g.Event(InvalidArgument("boom"), Position(1, 5))) == (
        b'data: {"error":"boom"}\n\n'
    )
