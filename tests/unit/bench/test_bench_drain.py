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


def test_the_gateway_goal_is_judged_on_its_row_at_64_and_1_kib() -> None:
    """Issue 42: 80 µs of the gateway's CPU per request at concurrency 64, 1 KiB tensors;
    other gateway rows do not count, and a run without that row says SKIP."""
    row = drain.Row("gateway", 64, 1, 1000, wall_s=1.0, cpu_s=0.079, redis_cpu_s=0.01)
    other = drain.Row("gateway", 1, 1, 1000, wall_s=1.0, cpu_s=0.5, redis_cpu_s=0.01)
    assert drain.gateway_goal([other, row]).startswith("PASS") and "79.0 µs" in drain.gateway_goal(
        [row]
    )
    row.cpu_s = 0.081
    assert drain.gateway_goal([row, other]).startswith("FAIL")
    assert drain.gateway_goal([other]).startswith("SKIP")
