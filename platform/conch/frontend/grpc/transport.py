"""How the gRPC server's connections are set up: TLS, keepalive, message sizes and the
compression of infer responses, from Triton's ``--grpc-*`` flags. grpcio's server takes
them as its credentials and channel options; the h2 transport takes the same TLS files as
an ``ssl`` context (``tls_context``), and keepalive, ping and age limits from
``h2_pings`` and ``h2_server.limits``.

Message sizes: Triton lets a gRPC message be up to 2 GiB - 1 either way; conch bounds
received messages by ``--http-max-input-size`` instead (one limit for both protocols'
requests, 64 MiB by default), and sends up to Triton's limit.

Compression: grpcio's Python server sets an algorithm per call, not gRPC core's abstract
level. Core turns a level into one of the algorithms the peer accepts (gzip first, then
deflate); every gRPC client accepts both, so ``low`` is gzip and ``medium``/``high``
deflate, as core would pick them.

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

import grpc

from conch.settings import CompressionLevel, Settings

log = logging.getLogger(__name__)

# Triton's limit on a gRPC message: the largest signed 32-bit length.
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1

COMPRESSION: dict[CompressionLevel, grpc.Compression] = {
    CompressionLevel.NONE: grpc.Compression.NoCompression,
    CompressionLevel.LOW: grpc.Compression.Gzip,
    CompressionLevel.MEDIUM: grpc.Compression.Deflate,
    CompressionLevel.HIGH: grpc.Compression.Deflate,
}


def server_options(settings: Settings) -> list[tuple[str, int]]:
    """grpcio's channel arguments for the server: message sizes, keepalive, and the
    connection age limits when set."""
    options = [
        ("grpc.max_receive_message_length", settings.max_input_bytes),
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
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


def _pem(flag: str, path: str) -> bytes:
    if not path:
        raise SystemExit(f"conch grpc: TLS needs --{flag}")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SystemExit(f"conch grpc: --{flag} {path}: {exc.strerror}") from None


def credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """The server's TLS credentials; None for plaintext (neither TLS flag on).

    Mutual TLS wins over plain TLS, as in Triton; it needs the root certificate that
    client certificates must be signed by. Raises SystemExit naming a missing file.
    """
    mutual = settings.grpc_use_ssl_mutual
    if not (mutual or settings.grpc_use_ssl):
        return None
    pair = (
        _pem("grpc-server-key", settings.grpc_server_key),
        _pem("grpc-server-cert", settings.grpc_server_cert),
    )
    root = _pem("grpc-root-cert", settings.grpc_root_cert) if mutual else None
    return grpc.ssl_server_credentials([pair], root_certificates=root, require_client_auth=mutual)


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The ``h2`` transport's TLS: the same flags and files as ``credentials``, as Python's
    ``ssl`` takes them, with ALPN ``h2`` (gRPC clients ask for it) and TLS 1.2 at least
    (HTTP/2's floor). None for plaintext; SystemExit naming a missing or bad file."""
    mutual = settings.grpc_use_ssl_mutual
    if not (mutual or settings.grpc_use_ssl):
        return None
    _pem("grpc-server-key", settings.grpc_server_key)
    _pem("grpc-server-cert", settings.grpc_server_cert)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(settings.grpc_server_cert, settings.grpc_server_key)
        if mutual:
            _pem("grpc-root-cert", settings.grpc_root_cert)
            context.load_verify_locations(cafile=settings.grpc_root_cert)
            context.verify_mode = ssl.CERT_REQUIRED
    except ssl.SSLError as exc:
        raise SystemExit(f"conch grpc: TLS files: {exc}") from None
    return context


def infer_compression(settings: Settings) -> grpc.Compression:
    """The algorithm infer responses are sent with (see the module docstring)."""
    return COMPRESSION[settings.grpc_infer_response_compression_level]


__all__ = [
    "COMPRESSION",
    "MAX_GRPC_MESSAGE_BYTES",
    "bind",
    "credentials",
    "infer_compression",
    "log_started",
    "server_options",
    "stop_signal",
    "tls_context",
    "vacant_port",
]
