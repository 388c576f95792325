"""The client conch processes open on Redis, against a real Redis: its pool has no cap."""

from __future__ import annotations

import threading

import pytest
import redis

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
