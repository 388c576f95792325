"""``conch grpc`` on ``--grpc-transport grpcio``: Triton's gRPC frontend in a process of its own.

Process model: grpcio's synchronous server, a thread per RPC in flight from a pool of
``--grpc-infer-thread-count`` (and as many for the requests of streams). Each infer call
waits on the dispatcher's reply (the process's reply list, which the dispatcher's
listener thread reads), so a thread is held per call, as the gthread gateway holds one.
gevent does not mix with grpcio's C core, so this process is never patched. It is its
own process (not a thread of the gateway) so that the gateway's gevent patching and
gunicorn's forking never meet grpcio; ``conch serve`` starts it beside the gateway and
the worker.

Measured (bench/README.md, "Issue 14: gRPC", "Where the time goes"; ``bench/grpc_floor.py``):
grpcio's server costs more CPU per unary call, before any work is done, than conch's whole
HTTP path, most of it handing each call between threads, and its asyncio server as much; more processes sharing the
port (``--grpc-workers``, SO_REUSEPORT: ``cli/grpc_workers.py``) spread that cost over
cores but do not lower it. grpc.aio would not buy what its rewrite costs, and the
synchronous server stays: its
handler semantics (``add_callback`` on cancellation, blocking request iterators) are
what the cancellation and stream code is written against. The way to the HTTP path's
throughput is the other transport, ``--grpc-transport h2`` (``h2_server.py``): HTTP/2 by
the ``h2`` library on gevent, as the gateway runs, serving the same services through a
``CallContext`` that keeps those semantics.

The data plane is built as the gateway builds its own (``frontend.composition``):
the same checks, dispatch, queues and errors answer both protocols. The services are the
h2 transport's, routed by the same method table (``h2_methods``), each call's grpcio
context adapted to the services' ``ServicerContext`` (``GrpcioContext``).

grpcio is not among conch's own dependencies (the h2 transport needs none of it): this
transport takes the ``grpcio`` extra, ``pip install 'conch[grpcio]'``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

from conch.core.extras import needs_extra

try:
    import grpc
except ModuleNotFoundError:
    raise SystemExit(
        "conch grpc: "
        + needs_extra("--grpc-transport grpcio", "grpcio", "grpcio")
        + ", or serve on --grpc-transport h2 (the default)"
    ) from None

from conch.frontend.grpc import transport
from conch.frontend.grpc.h2_methods import Method, method_table
from conch.frontend.grpc.health import HealthService
from conch.frontend.grpc.service import InferenceService
from conch.settings import Settings

log = logging.getLogger(__name__)

_CODES = {code.value[0]: code for code in grpc.StatusCode}
_COMPRESSION = {
    None: grpc.Compression.NoCompression,
    "gzip": grpc.Compression.Gzip,
    "deflate": grpc.Compression.Deflate,
}


class GrpcioContext:
    """A grpcio call's context as the services' ``ServicerContext``: gRPC's status numbers
    and encoding names turned into grpcio's enums, the rest passed through."""

    __slots__ = ("_context",)

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context

    def abort(self, code: int, details: str) -> NoReturn:
        self._context.abort(_CODES[int(code)], details)
        raise AssertionError("grpcio's abort returned")  # it raises; for the type checker

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self._context.invocation_metadata()

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()

    def set_compression(self, encoding: str | None) -> None:
        self._context.set_compression(_COMPRESSION[encoding])

    def add_callback(self, callback: Callable[[], Any]) -> bool:
        return self._context.add_callback(callback)

    def is_active(self) -> bool:
        return self._context.is_active()

    def peer(self) -> str:
        return self._context.peer()

    def set_code(self, code: int) -> None:
        self._context.set_code(_CODES[int(code)])

    def set_details(self, details: str) -> None:
        self._context.set_details(details)


def _until_cancelled(requests: Iterator[Any]) -> Iterator[Any]:
    """A stream's requests; over, as on the h2 transport, when the call is cancelled."""
    try:
        yield from requests
    except grpc.RpcError:
        return


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


def _handler(method: Method) -> grpc.RpcMethodHandler:
    serve = method.handler
    if method.client_streaming:

        def call(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            return serve(_until_cancelled(requests), GrpcioContext(context))

    else:

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            return serve(request, GrpcioContext(context))

    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[method.client_streaming, method.server_streaming]
    return kind(call, request_deserializer=method.parse, response_serializer=_serialize)


def handlers(methods: dict[bytes, Method]) -> list[grpc.GenericRpcHandler]:
    """grpcio's handlers for every RPC of the method table, a generic one per service."""
    services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for method in methods.values():
        services.setdefault(method.service, {})[method.name] = _handler(method)
    return [grpc.method_handlers_generic_handler(name, rpcs) for name, rpcs in services.items()]


def server_options(settings: Settings) -> list[tuple[str, int]]:
    """grpcio's channel arguments for the server: message sizes, keepalive, and the
    connection age limits when set."""
    options = [
        ("grpc.max_receive_message_length", settings.max_input_bytes),
        ("grpc.max_send_message_length", transport.MAX_GRPC_MESSAGE_BYTES),
        # A port in use is an error, not a second server; but for the processes of
        # --grpc-workers, which share it once ``vacant_port`` found it free.
        ("grpc.so_reuseport", int(settings.grpc_shared_port)),
        ("grpc.keepalive_time_ms", settings.grpc_keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.grpc_keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(settings.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", settings.grpc_http2_max_pings_without_data),
        (
            "grpc.http2.min_recv_ping_interval_without_data_ms",
            settings.grpc_http2_min_recv_ping_interval_without_data_ms,
        ),
        ("grpc.http2.max_ping_strikes", settings.grpc_http2_max_ping_strikes),
    ]
    if settings.grpc_max_connection_age_ms:  # 0: no limit, gRPC core's own default
        options.append(("grpc.max_connection_age_ms", settings.grpc_max_connection_age_ms))
    if settings.grpc_max_connection_age_grace_ms:
        options.append(
            ("grpc.max_connection_age_grace_ms", settings.grpc_max_connection_age_grace_ms)
        )
    return options


def credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """The server's TLS credentials; None for plaintext (neither TLS flag on).

    Mutual TLS wins over plain TLS, as in Triton; it needs the root certificate that
    client certificates must be signed by. Raises SystemExit naming a missing file.
    """
    mutual = settings.grpc_use_ssl_mutual
    if not (mutual or settings.grpc_use_ssl):
        return None
    pair = (
        transport.pem("grpc-server-key", settings.grpc_server_key),
        transport.pem("grpc-server-cert", settings.grpc_server_cert),
    )
    root = transport.pem("grpc-root-cert", settings.grpc_root_cert) if mutual else None
    return grpc.ssl_server_credentials([pair], root_certificates=root, require_client_auth=mutual)


def build(settings: Settings) -> tuple[grpc.Server, int]:
    """The server with both services, bound (not started); and the port it bound."""
    inference = InferenceService.from_settings(settings)
    tls = credentials(settings)  # before binding: a bad file stops the start
    server = grpc.server(
        ThreadPoolExecutor(settings.grpc_infer_thread_count, thread_name_prefix="grpc"),
        options=server_options(settings),
    )
    server.add_generic_rpc_handlers(handlers(method_table(inference, HealthService(inference))))
    if not settings.grpc_shared_port:  # a port in use: say why (grpcio's error does not)
        transport.vacant_port(settings.grpc_address, settings.grpc_port)
    address = f"{settings.grpc_address}:{settings.grpc_port}"
    try:
        port = (
            server.add_insecure_port(address)
            if tls is None
            else server.add_secure_port(address, tls)
        )
    except RuntimeError:  # grpcio's "Failed to bind" (older ones answer 0)
        port = 0
    if port == 0:
        raise SystemExit(f"conch grpc: cannot listen on {address}")
    return server, port


def run(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT; RPCs in flight get --exit-timeout-secs to finish."""
    server, port = build(settings)
    stop = transport.stop_signal()
    server.start()
    transport.log_started(settings, port, "grpcio")
    stop.wait()
    server.stop(grace=settings.exit_timeout_secs).wait()


__all__ = ["GrpcioContext", "build", "credentials", "handlers", "run", "server_options"]
