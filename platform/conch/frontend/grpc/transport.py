"""How the gRPC server's connections are set up: TLS, keepalive, message sizes and the
compression of infer responses, from Triton's ``--grpc-*`` flags, for either transport.
The h2 transport takes the TLS files as an ``ssl`` context (``tls_context``), and
keepalive, ping and age limits from ``h2_pings`` and ``h2_server.limits``; grpcio's server
(``server``) makes its credentials and channel options of the same flags.

Message sizes: Triton lets a gRPC message be up to 2 GiB - 1 either way; conch bounds
received messages by ``--http-max-input-size`` instead (one limit for both protocols'
requests, 64 MiB by default), and sends up to Triton's limit.

Compression: a gRPC server chooses an algorithm per call, where Triton's flag names gRPC
core's abstract level. Core turns a level into one of the algorithms the peer accepts
(gzip first, then deflate); every gRPC client accepts both, so ``low`` is gzip and
``medium``/``high`` deflate, as core would pick them.

Both transports also bind their port (``bind``), take their stop signal and log their
start here, the same way.
"""

from __future__ import annotations

import logging
import signal
import socket
import ssl
import threading
from pathlib import Path

from conch.settings import CompressionLevel, Settings

log = logging.getLogger(__name__)

# Triton's limit on a gRPC message: the largest signed 32-bit length.
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1

# An infer response's ``grpc-encoding`` at each level (None: sent as it is).
COMPRESSION: dict[CompressionLevel, str | None] = {
    CompressionLevel.NONE: None,
    CompressionLevel.LOW: "gzip",
    CompressionLevel.MEDIUM: "deflate",
    CompressionLevel.HIGH: "deflate",
}


def bind(address: str, port: int, *, shared: bool = False) -> list[socket.socket]:
    """Sockets bound on every address ``address`` resolves to, at ``port`` (one the kernel
    picks when 0, the same for all), as gRPC core binds them: SO_REUSEADDR, and with
    ``shared`` SO_REUSEPORT too (the processes of ``--grpc-workers``). SystemExit naming
    the address when one cannot bind; nothing is left open then."""
    try:
        found = socket.getaddrinfo(
            address.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise SystemExit(f"conch grpc: cannot listen on {address}:{port}: {exc.strerror}") from None
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, sockaddr in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if shared:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:  # its IPv4 twin, if any, is bound on its own
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((sockaddr[0], port, *sockaddr[2:]))
            port = port or sock.getsockname()[1]  # the rest bind the port picked first
    except OSError as exc:
        for sock in bound:
            sock.close()
        raise SystemExit(f"conch grpc: cannot listen on {address}:{port}: {exc.strerror}") from None
    return bound


def vacant_port(address: str, port: int) -> int:
    """``port``, once no process is found listening on ``address:port`` (a port the
    kernel picks when 0); SystemExit otherwise. It binds the port as gRPC core does
    (SO_REUSEADDR, not SO_REUSEPORT) and lets it go: processes that then share it with
    SO_REUSEPORT would otherwise join any other listener that has that option on."""
    held = bind(address, port)
    port = held[0].getsockname()[1] if held else port
    for sock in held:
        sock.close()
    return port


def stop_signal() -> threading.Event:
    """Set by SIGTERM or SIGINT from now on: the server's signal to drain and stop
    (taken before the server starts, so neither kills it mid-start)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def log_started(settings: Settings, port: int, served_by: str) -> None:
    """The line Triton logs once its gRPC service listens, naming conch's transport."""
    tls = " (TLS)" if settings.grpc_use_ssl or settings.grpc_use_ssl_mutual else ""
    log.info(
        "Started GRPCInferenceService at %s:%d (%s)%s",
        settings.grpc_address,
        port,
        served_by,
        tls,
    )


def pem(flag: str, path: str) -> bytes:
    if not path:
        raise SystemExit(f"conch grpc: TLS needs --{flag}")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SystemExit(f"conch grpc: --{flag} {path}: {exc.strerror}") from None


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The ``h2`` transport's TLS: the same flags and files as ``credentials``, as Python's
    ``ssl`` takes them, with ALPN ``h2`` (gRPC clients ask for it) and TLS 1.2 at least
    (HTTP/2's floor). None for plaintext; SystemExit naming a missing or bad file."""
    mutual = settings.grpc_use_ssl_mutual
    if not (mutual or settings.grpc_use_ssl):
        return None
    pem("grpc-server-key", settings.grpc_server_key)
    pem("grpc-server-cert", settings.grpc_server_cert)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(settings.grpc_server_cert, settings.grpc_server_key)
        if mutual:
            pem("grpc-root-cert", settings.grpc_root_cert)
            context.load_verify_locations(cafile=settings.grpc_root_cert)
            context.verify_mode = ssl.CERT_REQUIRED
    except ssl.SSLError as exc:
        raise SystemExit(f"conch grpc: TLS files: {exc}") from None
    return context


def infer_compression(settings: Settings) -> str | None:
    """The encoding infer responses are sent with (see the module docstring)."""
    return COMPRESSION[settings.grpc_infer_response_compression_level]


__all__ = [
    "COMPRESSION",
    "MAX_GRPC_MESSAGE_BYTES",
    "bind",
    "infer_compression",
    "log_started",
    "pem",
    "stop_signal",
    "tls_context",
    "vacant_port",
]
