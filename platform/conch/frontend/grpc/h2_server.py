"""``conch grpc --grpc-transport h2``: Triton's gRPC services on the ``h2`` library, on gevent.

Why: grpcio's server costs more CPU per call, before any work, than conch's whole HTTP path
(bench/README.md, "Issue 14: gRPC" and "Issue 28: which HTTP/2 library"). Here, as in
the HTTP gateway, the process is gevent-patched before anything else is imported
(``conch.cli``), and every connection, call and timer is a greenlet: a listener's accept
loop, then per connection ``h2_connection.Connection`` (reader, writer, ticker, a
greenlet per call). The services are the same objects grpcio serves (``service``,
``health``), given a ``CallContext`` for grpcio's, and routed by ``h2_methods``.

The listening sockets are bound here: SO_REUSEADDR as gRPC core binds, and SO_REUSEPORT for
the processes of ``--grpc-workers`` (``cli/grpc_workers.py`` checked the port first). TLS
is Python's ``ssl`` (gevent's, once patched) from the same flags as grpcio's
(``transport.tls_context``). SIGTERM or SIGINT: no new connections, a GOAWAY on each
open one, and ``--exit-timeout-secs`` for the calls in flight; those still running then
are cancelled (their queued requests withdrawn).
"""

from __future__ import annotations

import _thread
import logging
import socket
import ssl
import threading
import time

from conch.frontend.grpc import transport
from conch.frontend.grpc.h2_connection import Connection, Limits
from conch.frontend.grpc.h2_methods import Method, method_table
from conch.frontend.grpc.h2_pings import PingLimits
from conch.frontend.grpc.h2_threads import Slots
from conch.frontend.grpc.health import HealthService
from conch.frontend.grpc.service import InferenceService
from conch.settings import Settings

log = logging.getLogger(__name__)

HANDSHAKE_S = 10.0  # a TLS handshake not done in this long is dropped
BACKLOG = 1024


def limits(settings: Settings) -> Limits:
    """What each connection allows its peer, from the settings."""
    return Limits(
        max_message_bytes=settings.max_input_bytes,
        ping=PingLimits.from_settings(settings),
        max_age_s=settings.grpc_max_connection_age_ms / 1000,
        grace_s=settings.grpc_max_connection_age_grace_ms / 1000,
    )


def listen(address: str, port: int, shared: bool) -> list[socket.socket]:
    """Listening sockets on every address ``address`` resolves to, at ``port``
    (``transport.bind``); SystemExit when one cannot bind."""
    listeners = transport.bind(address, port, shared=shared)
    for sock in listeners:
        sock.listen(BACKLOG)
    return listeners


class H2Server:
    """The listeners, and the connections they accepted (see the module docstring)."""

    def __init__(
        self,
        listeners: list[socket.socket],
        methods: dict[bytes, Method],
        limits: Limits,
        tls: ssl.SSLContext | None,
        calls_at_once: int | None = None,
    ) -> None:
        self.listeners = listeners
        self.methods = methods
        self.limits = limits
        self.tls = tls
        # --grpc-infer-thread-count: calls running at once over all connections.
        self.slots = None if calls_at_once is None else Slots(calls_at_once)
        self.connections: set[Connection] = set()
        self.stopping = False
        self._idle = threading.Event()  # stopping, and the last connection has closed

    @property
    def port(self) -> int:
        return self.listeners[0].getsockname()[1]

    def start(self) -> None:
        for listener in self.listeners:
            _thread.start_new_thread(self._accept, (listener,))

    def _accept(self, listener: socket.socket) -> None:
        while not self.stopping:
            try:
                sock, address = listener.accept()
            except OSError as exc:
                if self.stopping:
                    return
                log.warning("gRPC accept failed: %s", exc)  # out of descriptors, say
                time.sleep(0.1)
                continue
            _thread.start_new_thread(self._serve, (sock, address))

    def _serve(self, sock: socket.socket, address: tuple) -> None:
        """One connection, from its TLS handshake (if any) to its close."""
        peer = f"{address[0]}:{address[1]}"
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(HANDSHAKE_S)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
                if sock.selected_alpn_protocol() not in (None, "h2"):
                    raise ssl.SSLError(f"ALPN {sock.selected_alpn_protocol()!r}, not h2")
            sock.settimeout(self.limits.stall_s)
        except (OSError, ValueError) as exc:
            log.debug("gRPC connection from %s refused: %s", peer, exc)
            sock.close()
            return
        connection = Connection(sock, self.methods, self.limits, peer, self.slots)
        self.connections.add(connection)
        try:
            connection.serve()
        finally:
            self.connections.discard(connection)
            if self.stopping and not self.connections:
                self._idle.set()

    def stop(self, grace_s: float) -> None:
        """No new connections; each open one drains (GOAWAY) for up to ``grace_s``, and
        what is left then is closed."""
        self.stopping = True
        for listener in self.listeners:
            listener.close()
        for connection in list(self.connections):
            connection.drain()
        if self.connections:
            self._idle.wait(grace_s)
        for connection in list(self.connections):
            connection.close()


def build(settings: Settings) -> H2Server:
    """The server with both services, bound (not started)."""
    tls = transport.tls_context(settings)  # first: a bad file stops the start
    inference = InferenceService.from_settings(settings)
    methods = method_table(inference, HealthService(inference))
    listeners = listen(settings.grpc_address, settings.grpc_port, settings.grpc_shared_port)
    return H2Server(listeners, methods, limits(settings), tls, settings.grpc_infer_thread_count)


def run(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT; calls in flight get --exit-timeout-secs to finish."""
    server = build(settings)
    stop = transport.stop_signal()
    server.start()
    transport.log_started(settings, server.port, "h2")
    stop.wait()
    server.stop(settings.exit_timeout_secs)


__all__ = ["H2Server", "build", "limits", "listen", "run"]
