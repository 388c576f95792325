"""The services' schemas as conch loads them, with no grpcio: the same as the generated
modules grpcio's users have, on the wire and (Triton's) class for class."""

from __future__ import annotations

import subprocess
import sys

import pytest
from grpc_health.v1 import health_pb2

from conch.frontend.grpc import protos


@pytest.mark.parametrize("tritonclient_first", [True, False])
def test_tritons_messages_are_tritonclients_own_classes(tritonclient_first: bool) -> None:
    """Either import order in one process gives one schema and the same classes."""
    steps = [
        "from tritonclient.grpc import service_pb2 as tc",
        "from conch.frontend.grpc import protos; pb = protos.triton_messages()",
    ]
    code = "; ".join(steps if tritonclient_first else steps[::-1]) + (
        "; assert pb.ModelInferRequest is tc.ModelInferRequest"
        "; assert pb.ModelConfigResponse is tc.ModelConfigResponse"
        "; r = pb.ModelConfigResponse(); r.config.max_batch_size = 2"
        "; assert tc.ModelConfigResponse.FromString(r.SerializeToString()) == r"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_rpc_of_tritons_service_is_there() -> None:
    service = protos.triton_file().services_by_name[protos.TRITON_SERVICE]
    assert service.full_name == "inference.GRPCInferenceService"
    names = {m.name for m in service.methods}
    assert {"ModelInfer", "ModelStreamInfer", "RepositoryModelLoad", "LogSettings"} <= names
    assert len(names) == 20


def test_the_health_messages_match_grpcio_health_checkings_on_the_wire() -> None:
    ours = protos.health_messages()
    request = ours.HealthCheckRequest(service="add").SerializeToString()
    assert health_pb2.HealthCheckRequest.FromString(request).service == "add"
    theirs = health_pb2.HealthCheckResponse
    for name in ("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"):
        value = getattr(ours.HealthCheckResponse, name)
        assert value == getattr(theirs, name)
        sent = ours.HealthCheckResponse(status=value).SerializeToString()
        assert sent == theirs(status=value).SerializeToString()
    service = protos.health_file().services_by_name[protos.HEALTH_SERVICE]
    assert service.full_name == "grpc.health.v1.Health"
    assert [(m.name, m.server_streaming) for m in service.methods] == [
        ("Check", False),
        ("Watch", True),
    ]


def test_a_module_without_a_serialized_file_is_refused() -> None:
    assert (
        protos.serialized_file("x = f(b'abc')\nDESCRIPTOR = p.AddSerializedFile(b'\\n\\x01')")
        == b"\n\x01"
    )
    with pytest.raises(ImportError, match="AddSerializedFile"):
        protos.serialized_file("DESCRIPTOR = load()")
    with pytest.raises(ImportError, match="AddSerializedFile"):
        protos.serialized_file("DESCRIPTOR = p.AddSerializedFile(open('x').read())")
