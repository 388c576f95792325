"""``conch grpc``: Triton's gRPC frontend in a process of its own.

Process model: grpcio's synchronous server, a thread per RPC in flight from a pool of
``--grpc-thread-count`` (and as many for the requests of streams). Each infer call
waits on the dispatcher's reply (the process's reply list, which the dispatcher's
listener thread reads), so a thread is held per call, as the gthread gateway holds one; grpcio's
asyncio server would need an async dispatcher conch does not have, and gevent does not
mix with grpcio's C core, so this process is never patched. It is its own process (not
a thread of the gateway) so that the gateway's gevent patching and gunicorn's forking
never meet grpcio; ``conch serve`` starts it beside the gateway and the worker.

The data plane is built as the gateway builds its own (``frontend.composition``):
the same checks, dispatch, queues and errors answer both protocols.
"""

from __future__ import annotations

import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc

from conch.frontend.composition import build_dataplane
from conch.frontend.grpc.health import HealthService
from conch.frontend.grpc.service import InferenceService
from conch.settings import Settings

log = logging.getLogger(__name__)

# What Triton allows a message to be; received messages are bounded by
# --http-max-input-size (one limit for both protocols' requests).
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1


def build(settings: Settings) -> tuple[grpc.Server, int]:
    """The server with both services, bound (not started); and the port it bound."""
    plane = build_dataplane(settings)
    inference = InferenceService(
        plane, settings.grpc_restricted_protocol, settings.grpc_thread_count
    )
    server = grpc.server(
        ThreadPoolExecutor(settings.grpc_thread_count, thread_name_prefix="grpc"),
        options=[
            ("grpc.max_receive_message_length", settings.max_input_bytes),
            ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a second server
        ],
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(inference, server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(inference), server)
    address = f"{settings.grpc_address}:{settings.grpc_port}"
    port = server.add_insecure_port(address)
    if port == 0:
        raise SystemExit(f"conch grpc: cannot listen on {address}")
    return server, port


def run(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT; RPCs in flight get --exit-timeout-secs to finish."""
    server, port = build(settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    log.info("Started GRPCInferenceService at %s:%d", settings.grpc_address, port)
    stop.wait()
    server.stop(grace=settings.exit_timeout_secs).wait()


__all__ = ["MAX_GRPC_MESSAGE_BYTES", "build", "run"]
