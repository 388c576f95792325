"""The method table: a request's ``:path`` → the servicer's method, the protobuf classes of
its messages, and whether each side streams. Both transports route by it.

It is read from the services' descriptors (``protos``: Triton's
``inference.GRPCInferenceService`` and ``grpc.health.v1.Health``), so every RPC the
``.proto`` declares is routed, with its kind; one the servicer does not define answers
UNIMPLEMENTED, as a generated servicer's base class would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import FileDescriptor

from conch.frontend.grpc.call_context import ServicerContext
from conch.frontend.grpc.grpc_framing import Status
from conch.frontend.grpc.protos import HEALTH_SERVICE, TRITON_SERVICE, health_file, triton_file


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: its handler ``(request or request iterator, context) -> response or
    response iterator``, how its request is parsed, and which sides stream."""

    name: str
    handler: Callable[..., Any]
    parse: Callable[[bytes], Any]
    client_streaming: bool
    server_streaming: bool
    service: str = ""  # its service's full name: inference.GRPCInferenceService


def _unimplemented(name: str) -> Callable[..., Any]:
    def handler(request: Any, context: ServicerContext) -> Any:
        context.abort(Status.UNIMPLEMENTED, "Method not implemented!")

    return handler


def _service(file: FileDescriptor, service: str, servicer: object) -> dict[bytes, Method]:
    table = {}
    full_name = file.services_by_name[service].full_name
    for method in file.services_by_name[service].methods:
        request = message_factory.GetMessageClass(method.input_type)
        table[f"/{full_name}/{method.name}".encode()] = Method(
            name=method.name,
            handler=getattr(servicer, method.name, None) or _unimplemented(method.name),
            parse=request.FromString,
            client_streaming=method.client_streaming,
            server_streaming=method.server_streaming,
            service=full_name,
        )
    return table


def method_table(inference: object, health: object) -> dict[bytes, Method]:
    """Every RPC of Triton's inference service and of the health service, by ``:path``."""
    return {
        **_service(triton_file(), TRITON_SERVICE, inference),
        **_service(health_file(), HEALTH_SERVICE, health),
    }


__all__ = ["Method", "method_table"]
