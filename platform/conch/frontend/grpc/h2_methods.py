"""The ``h2`` transport's method table: a request's ``:path`` → the servicer's method, the
protobuf classes of its messages, and whether each side streams.

grpcio learns this from the generated ``*_pb2_grpc`` registration functions; here it is
read from the services' descriptors (``service_pb2`` for Triton's
``inference.GRPCInferenceService``, ``health_pb2`` for ``grpc.health.v1.Health``), so
every RPC the ``.proto`` declares is routed, with its kind, and a method the servicer
leaves to its generated base class answers as that base class says (UNIMPLEMENTED).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import FileDescriptor
from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: its handler ``(request or request iterator, context) -> response or
    response iterator``, how its request is parsed, and which sides stream."""

    name: str
    handler: Callable[..., Any]
    parse: Callable[[bytes], Any]
    client_streaming: bool
    server_streaming: bool


def _service(file: FileDescriptor, service: str, servicer: object) -> dict[bytes, Method]:
    table = {}
    for method in file.services_by_name[service].methods:
        request = message_factory.GetMessageClass(method.input_type)
        table[f"/{method.full_name.rpartition('.')[0]}/{method.name}".encode()] = Method(
            name=method.name,
            handler=getattr(servicer, method.name),
            parse=request.FromString,
            client_streaming=method.client_streaming,
            server_streaming=method.server_streaming,
        )
    return table


def method_table(inference: object, health: object) -> dict[bytes, Method]:
    """Every RPC of Triton's inference service and of the health service, by ``:path``."""
    return {
        **_service(service_pb2.DESCRIPTOR, "GRPCInferenceService", inference),
        **_service(health_pb2.DESCRIPTOR, "Health", health),
    }


__all__ = ["Method", "method_table"]
