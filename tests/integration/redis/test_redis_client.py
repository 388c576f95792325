"""The client conch processes open on Redis, against a real Redis: its pool has no cap."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
import redis

from conch.wire import redis_client
from conch.wire.redis_client import open_client

CALLERS = 150  # more than redis-py 8's default cap of 100 connections a pool


def test_more_callers_at_once_than_redis_pys_default_pool_holds(redis_url: str) -> None:
    # Each caller holds a connection for the whole of a blocking pop, as a batcher's
    # admission pipeline or a gateway's long-polled job result holds one.
    client = open_client(redis_url)
    start = threading.Barrier(CALLERS)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            start.wait()
            client.blpop(["pool.test.empty"], timeout=1)
        except BaseException as exc:  # every failure is reported, none is lost
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    # redis-py's own default refuses the same load: what the worker's client once did.
    capped = redis.Redis.from_url(redis_url).connection_pool
    held = [capped.get_connection() for _ in range(100)]
    try:
        with pytest.raises(redis.exceptions.MaxConnectionsError):
            capped.get_connection()
    finally:
        for conn in held:
            capped.release(conn)


def test_a_connection_attempt_that_gets_no_answer_gives_up(redis_url: str) -> None:
    """A listener whose accept queue is full drops new SYNs, as a black-holed route does:
    connecting then waits on the OS's retries, unless the client bounds it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued = []
    for _ in range(3):  # fill the accept queue; nothing ever accepts them
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # it completes in the background
            s.connect(("127.0.0.1", port))
        queued.append(s)
    time.sleep(0.2)
    started = time.monotonic()
    try:
        with pytest.raises(redis.TimeoutError):
            open_client(f"redis://127.0.0.1:{port}/0").ping()
        took = time.monotonic() - started
        assert redis_client.CONNECT_TIMEOUT_S - 0.1 <= took < redis_client.CONNECT_TIMEOUT_S + 2
    finally:
        for s in queued:
            s.close()
        server.close()
    # A URL that sets its own timeout keeps it.
    client = open_client(redis_url.split("?")[0] + "?socket_connect_timeout=7")
    assert client.connection_pool.connection_kwargs["socket_connect_timeout"] == 7
