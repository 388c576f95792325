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
the same checks, dispatch, queues and errors answer both protocols.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc

from conch.frontend.grpc import transport
from conch.frontend.grpc.health import HealthService
from conch.frontend.grpc.service import InferenceService
from conch.settings import Settings

log = logging.getLogger(__name__)


def build(settings: Settings) -> tuple[grpc.Server, int]:
    """The server with both services, bound (not started); and the port it bound."""
    inference = InferenceService.from_settings(settings)
    tls = transport.credentials(settings)  # before binding: a bad file stops the start
    server = grpc.server(
        ThreadPoolExecutor(settings.grpc_infer_thread_count, thread_name_prefix="grpc"),
        options=transport.server_options(settings),
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(inference, server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(inference), server)
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


__all__ = ["build", "run"]
