"""bench/drain.py's load driver, which its gateway rows and bench/http_cores.py time."""

from __future__ import annotations

import socket

import pytest

from unit.bench._bench import bench_module

drain = bench_module("drain")


def test_a_connection_that_fails_fails_the_run() -> None:
    """A refused connection must not pass for calls answered in no time."""
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RuntimeError, match="connection failed"):
        drain.drive(port, b"GET / HTTP/1.1\r\n\r\n", 4, 2)
