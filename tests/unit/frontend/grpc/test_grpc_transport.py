"""The gRPC server's transport setup from Settings: grpcio's options, TLS, compression."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from conch.cli import _warn_ignored, parser
from conch.frontend.grpc import server as grpcio_server
from conch.frontend.grpc import transport
from conch.settings import CompressionLevel, Settings


def test_keepalive_and_message_size_flags_become_grpcio_options(tmp_path: Path):
    flags = """--http-max-input-size 4096 --grpc-keepalive-time 1000
        --grpc-keepalive-timeout 2000 --grpc-keepalive-permit-without-calls=1
        --grpc-http2-max-pings-without-data 0
        --grpc-http2-min-recv-ping-interval-without-data 3000 --grpc-http2-max-ping-strikes 5"""
    args = parser().parse_args(["grpc", "--model-repository", str(tmp_path), *flags.split()])
    s = Settings.from_args(args, environ={})
    assert dict(grpcio_server.server_options(s)) == {
        "grpc.max_receive_message_length": 4096,
        "grpc.max_send_message_length": 2**31 - 1,
        "grpc.so_reuseport": 0,
        "grpc.keepalive_time_ms": 1000,
        "grpc.keepalive_timeout_ms": 2000,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.http2.min_recv_ping_interval_without_data_ms": 3000,
        "grpc.http2.max_ping_strikes": 5,
    }
    defaults = dict(grpcio_server.server_options(Settings()))
    assert defaults["grpc.keepalive_time_ms"] == 7_200_000
    assert defaults["grpc.keepalive_permit_without_calls"] == 0
    assert "grpc.max_connection_age_ms" not in defaults  # Triton's "undefined": no limit


def test_tritons_other_grpc_flags_are_taken(tmp_path: Path, caplog):
    """A tritonserver launch line's gRPC flags start conch: the connection age limits
    apply; Triton's own pool sizes are named as ignored."""
    flags = """--grpc-infer-thread-count 8 --grpc-max-connection-age 60000
        --grpc-max-connection-age-grace 5000 --grpc-infer-allocation-pool-size 16
        --grpc-max-response-pool-size 32"""
    args = parser().parse_args(["grpc", "--model-repository", str(tmp_path), *flags.split()])
    s = Settings.from_args(args, environ={})
    assert s.grpc_infer_thread_count == 8
    options = dict(grpcio_server.server_options(s))
    assert options["grpc.max_connection_age_ms"] == 60000
    assert options["grpc.max_connection_age_grace_ms"] == 5000
    with caplog.at_level(logging.WARNING):
        _warn_ignored(s)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "--grpc-infer-allocation-pool-size ignored" in warned
    assert "--grpc-max-response-pool-size ignored" in warned
    # and they reach conch serve's gRPC child
    args = parser().parse_args(["serve", "--model-repository", str(tmp_path), *flags.split()])
    s = Settings.from_args(args, environ={})
    child = parser().parse_args(["grpc", *s.to_args("grpc")])
    assert Settings.from_args(child, environ={}) == s


@pytest.mark.parametrize(
    ("level", "algorithm"),
    [
        (CompressionLevel.NONE, None),
        (CompressionLevel.LOW, "gzip"),
        (CompressionLevel.MEDIUM, "deflate"),
        (CompressionLevel.HIGH, "deflate"),
    ],
)
def test_compression_level_picks_an_algorithm(level, algorithm):
    s = Settings(grpc_infer_response_compression_level=level)
    assert transport.infer_compression(s) == algorithm


def test_plaintext_unless_a_tls_flag_is_on():
    assert grpcio_server.credentials(Settings(grpc_server_cert="/nonexistent")) is None


def test_tls_names_the_missing_or_unreadable_file(tmp_path: Path):
    with pytest.raises(SystemExit, match="TLS needs --grpc-server-key"):
        grpcio_server.credentials(Settings(grpc_use_ssl=True))
    with pytest.raises(SystemExit, match=r"--grpc-server-key .*nokey: No such file"):
        grpcio_server.credentials(
            Settings(grpc_use_ssl=True, grpc_server_key=str(tmp_path / "nokey"))
        )
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    key.write_text("k")
    cert.write_text("c")
    with pytest.raises(SystemExit, match="TLS needs --grpc-root-cert"):
        grpcio_server.credentials(
            Settings(grpc_use_ssl_mutual=True, grpc_server_key=str(key), grpc_server_cert=str(cert))
        )


def test_grpc_workers_flag(tmp_path: Path):
    """--grpc-workers N: at least 1, reaches the grpc child of serve; its processes share
    the port (SO_REUSEPORT) only when the supervisor says so, through the environment."""
    from conch.settings import GRPC_SHARED_PORT_ENV, Role

    args = parser().parse_args(
        ["serve", "--model-repository", str(tmp_path), "--grpc-workers", "3"]
    )
    s = Settings.from_args(args, environ={})
    assert s.grpc_workers == 3 and "--grpc-workers" in s.to_args(Role.GRPC)
    assert dict(grpcio_server.server_options(s))["grpc.so_reuseport"] == 0
    shared = Settings.from_env({GRPC_SHARED_PORT_ENV: "1"})
    assert dict(grpcio_server.server_options(shared))["grpc.so_reuseport"] == 1
    with pytest.raises(ValueError, match="--grpc-workers"):
        Settings.from_args(
            parser().parse_args(
                ["grpc", "--model-repository", str(tmp_path), "--grpc-workers", "0"]
            ),
            environ={},
        )


def test_vacant_port():
    """A port no one listens on is handed back (0: one the kernel picks, for every address
    it resolves to); a listened one, even with SO_REUSEPORT, stops the start."""
    picked = transport.vacant_port("localhost", 0)
    assert picked > 0 and transport.vacant_port("127.0.0.1", picked) == picked
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(
            SystemExit, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"
        ):
            transport.vacant_port("127.0.0.1", port)
        with pytest.raises(SystemExit, match="cannot listen on"):
            transport.vacant_port("0.0.0.0", port)


def test_the_h2_transports_tls_context(tmp_path: Path):
    """--grpc-transport h2: the same flags as an ``ssl`` context, with ALPN h2; a client
    certificate required under mutual TLS; a missing file named as grpcio's path names it."""
    import ssl

    from integration.grpc.certificates import make_pki

    assert transport.tls_context(Settings(grpc_server_cert="/nonexistent")) is None
    with pytest.raises(SystemExit, match=r"--grpc-server-key .*nokey: No such file"):
        transport.tls_context(Settings(grpc_use_ssl=True, grpc_server_key=str(tmp_path / "nokey")))
    pki = make_pki(tmp_path / "pki")
    files = {"grpc_server_key": str(pki.server_key), "grpc_server_cert": str(pki.server_cert)}
    plain = transport.tls_context(Settings(grpc_use_ssl=True, **files))
    assert plain is not None and plain.verify_mode == ssl.CERT_NONE
    with pytest.raises(SystemExit, match="TLS needs --grpc-root-cert"):
        transport.tls_context(Settings(grpc_use_ssl_mutual=True, **files))
    mutual = transport.tls_context(
        Settings(grpc_use_ssl_mutual=True, grpc_root_cert=str(pki.ca), **files)
    )
    assert mutual is not None and mutual.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(SystemExit, match="conch grpc: TLS files"):
        transport.tls_context(
            Settings(grpc_use_ssl=True, grpc_server_key=str(pki.ca), grpc_server_cert=str(pki.ca))
        )


def test_the_h2_transport_binds_as_grpcio_does():
    """SO_REUSEPORT only for --grpc-workers' processes; a port another process listens on
    (even with SO_REUSEPORT) stops the start otherwise."""
    from conch.frontend.grpc.h2_server import listen

    first = listen("127.0.0.1", 0, shared=True)
    port = first[0].getsockname()[1]
    try:
        second = listen("127.0.0.1", port, shared=True)
        for sock in second:
            sock.close()
        with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
            listen("127.0.0.1", port, shared=False)
    finally:
        for sock in first:
            sock.close()


def test_grpc_transport_flag_reaches_grpc_children(tmp_path: Path):
    from conch.settings import GrpcTransport, Role

    assert Settings().grpc_transport is GrpcTransport.H2
    grpcio = Settings.from_env({"CONCH_GRPC_TRANSPORT": "grpcio"})
    assert grpcio.grpc_transport is GrpcTransport.GRPCIO
    args = parser().parse_args(
        ["serve", "--model-repository", str(tmp_path), "--grpc-transport", "h2"]
    )
    s = Settings.from_args(args, environ={})
    assert s.grpc_transport is GrpcTransport.H2
    child = parser().parse_args(["grpc", *s.to_args(Role.GRPC)])
    assert Settings.from_args(child, environ={}).grpc_transport is GrpcTransport.H2
