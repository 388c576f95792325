"""The gRPC adapter's own logic: decoding typed and raw tensors, the status table, and
Triton's model_config schema loaded beside tritonclient.grpc in one process."""

from __future__ import annotations

import subprocess
import sys

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from conch.core import errors
from conch.core.errors import InvalidArgument
from conch.frontend.grpc import codec
from conch.frontend.grpc.service import STATUS, status_code


def _request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id="7")
    request.inputs.add(name="X", datatype="INT16", shape=[2]).contents.int_contents.extend([1, -2])
    request.inputs.add(name="Y", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"ab")
    request.parameters["priority"].uint64_param = 2
    request.parameters["custom"].double_param = 0.5
    out = request.outputs.add(name="Z")
    out.parameters["classification"].int64_param = 3
    return request


def test_typed_contents_become_raw_tensors_and_parameters_values() -> None:
    decoded = codec.decode_request(_request())
    x, y = decoded.inputs
    assert (x.name, x.datatype, x.shape) == ("X", "INT16", (2,))
    assert np.frombuffer(x.raw, "<i2").tolist() == [1, -2]
    assert y.raw == b"\x02\x00\x00\x00ab"
    assert decoded.parameters == {"priority": 2, "custom": 0.5}
    assert decoded.custom_parameters() == {"custom": 0.5}
    assert [(o.name, o.binary, o.class_count) for o in decoded.outputs] == [("Z", True, 3)]


def test_raw_and_contents_together_are_refused() -> None:
    request = _request()
    request.raw_input_contents.append(b"\0\0\0\0")
    with pytest.raises(InvalidArgument, match="contents field must not be specified"):
        codec.decode_request(request)


@pytest.mark.parametrize(
    ("datatype", "values", "message"),
    [
        ("INT8", [300], "out of range"),
        ("UINT8", [1, 2], "unexpected number of elements"),
        ("FP16", [1.0], "of type 'FP32', expected datatype 'FP16'"),
    ],
)
def test_typed_contents_use_the_shared_checks(datatype: str, values: list, message: str) -> None:
    request = pb.ModelInferRequest(model_name="m")
    field = codec.CONTENTS_FIELD.get(datatype, "fp32_contents")
    tensor = request.inputs.add(name="X", datatype=datatype, shape=[1])
    getattr(tensor.contents, field).extend(values)
    with pytest.raises(InvalidArgument, match=message):
        codec.decode_request(request)


def test_a_tensor_named_twice_is_refused_in_tritons_words() -> None:
    request = _request()
    request.outputs.add(name="Z")
    with pytest.raises(InvalidArgument, match=r"^output 'Z' already exists in request$"):
        codec.decode_request(request)
    request = _request()
    request.inputs.add().CopyFrom(request.inputs[0])
    with pytest.raises(InvalidArgument, match=r"^input 'X' already exists in request$"):
        codec.decode_request(request)


def test_negative_timeout_is_refused() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.parameters["timeout"].int64_param = -1
    with pytest.raises(InvalidArgument, match="invalid value for 'timeout'"):
        codec.decode_request(request)


def test_every_triton_code_has_tritons_grpc_status() -> None:
    assert set(STATUS) == set(errors.TRITON_CODES)
    assert status_code(errors.InvalidArgument("x")) == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert status_code(errors.NotFound("x")) == grpc.StatusCode.NOT_FOUND.value[0]
    assert status_code(errors.Unavailable("x")) == grpc.StatusCode.UNAVAILABLE.value[0]
    assert status_code(errors.Unsupported("x")) == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert status_code(errors.Internal("x")) == grpc.StatusCode.INTERNAL.value[0]
    assert status_code(errors.AlreadyExists("x")) == grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert status_code(errors.Cancelled("x")) == grpc.StatusCode.CANCELLED.value[0]
    assert status_code(errors.Forbidden("x")) == grpc.StatusCode.UNAVAILABLE.value[0]


@pytest.mark.parametrize("tritonclient_first", [True, False])
def test_model_config_schema_loads_beside_tritonclient_grpc(tritonclient_first: bool) -> None:
    """conch loads Triton's model_config_pb2 by path; tritonclient.grpc imports the same
    file as a module. Either order in one process must work, with one schema."""
    steps = [
        "import tritonclient.grpc.model_config_pb2 as tc",
        "from conch.core import model_config as mc; conch = mc.model_config_pb2()",
    ]
    code = "; ".join(steps if tritonclient_first else steps[::-1]) + (
        "; assert conch.ModelConfig.DESCRIPTOR.full_name == tc.ModelConfig.DESCRIPTOR.full_name"
        "; m = conch.ModelConfig(name='x', max_batch_size=2)"
        "; r = __import__('tritonclient.grpc.service_pb2', fromlist=['x']).ModelConfigResponse()"
        "; r.config.CopyFrom(tc.ModelConfig.FromString(m.SerializeToString()))"
        "; assert r.config.max_batch_size == 2"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
