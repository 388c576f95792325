"""The schemas the gRPC services speak, with no grpcio in the process.

Triton's ``inference.GRPCInferenceService`` is the ``grpc_service.proto`` that tritonclient's
wheel ships compiled (``tritonclient/grpc/service_pb2.py``), as ``core.model_config`` reads
``model_config.proto`` from it. Importing that module would import ``tritonclient.grpc``,
whose package imports grpcio and the whole client, so the serialized file descriptor is
read out of the module's source instead (its one ``AddSerializedFile`` argument, a bytes
literal: parsed, never run) and added to protobuf's default pool. The message classes are
then the very classes ``tritonclient.grpc.service_pb2`` has, where both are loaded.

gRPC's health protocol (``grpc.health.v1.Health``) is small and fixed by gRPC's own
specification; its schema is declared here, in a pool of its own, so that it never meets
``grpcio-health-checking``'s copy of the same names in a process that has both (a client
in the tests).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from types import SimpleNamespace

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor

from conch.core.model_config import model_config_pb2

TRITON_SERVICE = "GRPCInferenceService"
HEALTH_SERVICE = "Health"

_Field = descriptor_pb2.FieldDescriptorProto


def _tritonclient_module(name: str) -> Path:
    spec = importlib.util.find_spec("tritonclient")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "grpc" / name
        if path.is_file():
            return path
    raise ImportError(
        f"conch's gRPC frontend serves Triton's service from tritonclient's {name}, which is "
        "not installed here (pip install 'tritonclient>=2.50')"
    )


def serialized_file(source: str) -> bytes:
    """The serialized ``FileDescriptorProto`` a protoc-generated module adds to the pool."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
            and len(node.args) == 1
        ):
            try:
                value = ast.literal_eval(node.args[0])
            except ValueError:  # not a literal: nothing to read without running it
                continue
            if isinstance(value, bytes):
                return value
    raise ImportError("no AddSerializedFile(b'...') call in the generated module")


@functools.cache
def triton_file() -> FileDescriptor:
    """``grpc_service.proto``, in protobuf's default pool beside ``model_config.proto``."""
    model_config_pb2()  # its dependency, added to the default pool first
    path = _tritonclient_module("service_pb2.py")
    try:
        data = serialized_file(path.read_text(encoding="utf-8"))
    except (ImportError, SyntaxError) as exc:
        raise ImportError(f"cannot read Triton's gRPC service from {path}: {exc}") from None
    return descriptor_pool.Default().AddSerializedFile(data)


def _health_schema() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="conch/grpc/health/v1/health.proto", package="grpc.health.v1", syntax="proto3"
    )
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(
        name="service", number=1, type=_Field.TYPE_STRING, label=_Field.LABEL_OPTIONAL
    )
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(
        name="status",
        number=1,
        type=_Field.TYPE_ENUM,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
        label=_Field.LABEL_OPTIONAL,
    )
    service = proto.service.add(name=HEALTH_SERVICE)
    for name, streams in (("Check", False), ("Watch", True)):
        service.method.add(
            name=name,
            input_type=".grpc.health.v1.HealthCheckRequest",
            output_type=".grpc.health.v1.HealthCheckResponse",
            server_streaming=streams,
        )
    return proto


@functools.cache
def health_file() -> FileDescriptor:
    """``grpc.health.v1``, in a pool of its own (see the module docstring)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_health_schema())
    return pool.FindFileByName(_health_schema().name)


def messages(file: FileDescriptor) -> SimpleNamespace:
    """The file's top-level message classes by name (``pb.ModelInferRequest``)."""
    return SimpleNamespace(
        **{
            name: message_factory.GetMessageClass(message)
            for name, message in file.message_types_by_name.items()
        }
    )


@functools.cache
def triton_messages() -> SimpleNamespace:
    """Triton's service messages (``inference.ModelInferRequest``, ...) by name."""
    return messages(triton_file())


@functools.cache
def health_messages() -> SimpleNamespace:
    """``HealthCheckRequest`` and ``HealthCheckResponse``."""
    return messages(health_file())


__all__ = [
    "HEALTH_SERVICE",
    "TRITON_SERVICE",
    "health_file",
    "health_messages",
    "messages",
    "serialized_file",
    "triton_file",
    "triton_messages",
]
