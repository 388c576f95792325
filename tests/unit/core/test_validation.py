"""Request checks against Triton's ModelConfig protobuf."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import text_format

from conch.core.errors import InvalidArgument
from conch.core.inference import InferRequest, InputTensor, RequestedOutput
from conch.core.validation import validate_request


def _load_pb2() -> ModuleType:
    """tritonclient's compiled ModelConfig schema, without importing tritonclient.grpc."""
    spec = importlib.util.find_spec("tritonclient")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    mod_spec = importlib.util.spec_from_file_location("_test_model_config_pb2", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


PB2 = _load_pb2()


def config(text: str) -> Any:
    return text_format.Parse(text, PB2.ModelConfig())


BATCHING = config(
    """
    name: "bm"
    max_batch_size: 8
    input [
      { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 16 ] },
      { name: "INPUT1" data_type: TYPE_STRING dims: [ 1 ] },
      { name: "OPT" data_type: TYPE_INT64 dims: [ 2 ] optional: true }
    ]
    output [
      { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
      { name: "OUTPUT1" data_type: TYPE_BF16 dims: [ 1 ] }
    ]
    """
)

NON_BATCHING = config(
    """
    name: "nm"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_BOOL dims: [ 2, -1 ] } ]
    output [ { name: "Y" data_type: TYPE_BOOL dims: [ 2, -1 ] } ]
    """
)

RAGGED = config(
    """
    name: "rm"
    max_batch_size: 4
    input [
      { name: "A" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true },
      { name: "B" data_type: TYPE_INT32 dims: [ 1 ] }
    ]
    output [ { name: "O" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """
)


def tensor(name: str, datatype: str, shape: tuple[int, ...]) -> InputTensor:
    return InputTensor(name, datatype, shape, b"")  # validation never reads the bytes


def request(
    *inputs: InputTensor, outputs: list[RequestedOutput] | None = None, rid: str = ""
) -> InferRequest:
    return InferRequest(rid, list(inputs), outputs, False, {})


def good_batching(batch: int = 2) -> list[InputTensor]:
    return [tensor("INPUT0", "FP32", (batch, 5, 16)), tensor("INPUT1", "BYTES", (batch, 1))]


def expect_400(match: str, req: InferRequest, cfg: Any = BATCHING) -> str:
    with pytest.raises(InvalidArgument, match=match) as e:
        validate_request(req, cfg)
    assert e.value.status == 400
    return e.value.message


def test_valid_batching_request_returns_batch() -> None:
    assert validate_request(request(*good_batching(3)), BATCHING) == 3
    assert (
        validate_request(request(*good_batching(8), tensor("OPT", "INT64", (8, 2))), BATCHING) == 8
    )
    outs = [RequestedOutput("OUTPUT1", True), RequestedOutput("OUTPUT0", False, 2)]
    assert validate_request(request(*good_batching(1), outputs=outs), BATCHING) == 1


def test_valid_non_batching_request_returns_one() -> None:
    assert validate_request(request(tensor("X", "BOOL", (2, 7))), NON_BATCHING) == 1
    assert validate_request(request(tensor("X", "BOOL", (2, 0))), NON_BATCHING) == 1


def test_unknown_input_lists_expected() -> None:
    msg = expect_400(
        "unexpected inference input 'NOPE' for model 'bm'",
        request(*good_batching(), tensor("NOPE", "FP32", (2,))),
    )
    assert "'INPUT0', 'INPUT1', 'OPT'" in msg


def test_missing_required_input() -> None:
    msg = expect_400("missing required input", request(tensor("INPUT0", "FP32", (1, 1, 16))))
    assert "'INPUT1'" in msg and "'OPT'" not in msg and "'bm'" in msg
    # With optional inputs Triton gives the range it takes.
    assert "expected number of inputs between 2 and 3 but got 1 inputs" in msg
    expect_400("expected 1 inputs but got 0 inputs", request(), NON_BATCHING)


def test_no_inputs_at_all_when_every_input_is_optional() -> None:
    cfg = config(
        """
        name: "opt"
        max_batch_size: 4
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
        output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]
        """
    )
    assert validate_request(request(), cfg) == 1


def test_datatype_mismatch() -> None:
    req = request(tensor("INPUT0", "FP64", (1, 1, 16)), tensor("INPUT1", "BYTES", (1, 1)), rid="r9")
    msg = expect_400(
        "inference input 'INPUT0' data-type is 'FP64', but model 'bm' expects 'FP32'", req
    )
    assert msg.startswith("[request id: r9] ")
    expect_400(
        "expects 'BYTES'",
        request(tensor("INPUT0", "FP32", (1, 1, 16)), tensor("INPUT1", "UINT8", (1, 1))),
    )


def test_shape_mismatch_message() -> None:
    req = request(tensor("INPUT0", "FP32", (2, 8)), tensor("INPUT1", "BYTES", (2, 1)), rid="X")
    expect_400(
        r"\[request id: X\] unexpected shape for input 'INPUT0' for model 'bm'\. Expected \[-1,-1,16\], got \[2,8\]",
        req,
    )
    expect_400(
        r"Expected \[-1,-1,16\], got \[2,3,15\]",
        request(tensor("INPUT0", "FP32", (2, 3, 15)), tensor("INPUT1", "BYTES", (2, 1))),
    )


def test_batch_size_bounds_and_agreement() -> None:
    expect_400("batch-size must be <= 8", request(*good_batching(9)))
    expect_400("batch-size must be <= 8 and >= 1", request(*good_batching(0)))
    expect_400(
        "does not match",
        request(tensor("INPUT0", "FP32", (2, 1, 16)), tensor("INPUT1", "BYTES", (3, 1))),
    )
    expect_400(
        "has no batch dimension",
        request(tensor("INPUT0", "FP32", ()), tensor("INPUT1", "BYTES", (1, 1))),
    )


def test_non_batching_full_shape() -> None:
    expect_400(
        r"unexpected shape for input 'X' for model 'nm'\. Expected \[2,-1\], got \[1,2,3\]",
        request(tensor("X", "BOOL", (1, 2, 3))),
        NON_BATCHING,
    )
    expect_400(
        r"Expected \[2,-1\], got \[3,3\]", request(tensor("X", "BOOL", (3, 3))), NON_BATCHING
    )


def test_unknown_output() -> None:
    req = request(
        *good_batching(),
        outputs=[RequestedOutput("OUTPUT0", True), RequestedOutput("MISSING", True)],
    )
    expect_400("unexpected inference output 'MISSING' for model 'bm'", req)


def test_ragged_inputs_skip_batch_agreement() -> None:
    req = request(tensor("A", "INT32", (1, 7)), tensor("B", "INT32", (3, 1)))
    assert validate_request(req, RAGGED) == 3
    assert (
        validate_request(
            request(tensor("A", "INT32", (2, 7)), tensor("B", "INT32", (2, 1))), RAGGED
        )
        == 2
    )


def test_model_name_override() -> None:
    req = request(tensor("X", "BOOL", (3, 3)))
    with pytest.raises(InvalidArgument, match="for model 'alias'"):
        validate_request(req, NON_BATCHING, model_name="alias")
