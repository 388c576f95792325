"""The redis-py client a conch process opens on the broker: one place for its pool.

redis-py 8 caps a client's connection pool at 100 connections and raises
``MaxConnectionsError`` past that. Every thread or greenlet that runs a command holds
one of them meanwhile: in a worker, a batcher per model instance (and BLS calls from
them), so a worker serving 120 instances could ask for more than 100 at once; in a
gateway, each call held open on a job's result. Instances and calls are what an
operator sizes; the pool must not bound them. conch's pools grow with their callers
(they keep what they opened for reuse, as redis-py's pools do), and Redis's own
``maxclients`` remains the limit.
"""

from __future__ import annotations

import redis

POOL_MAX_CONNECTIONS = 2**31 - 1  # no cap of the pool's own (redis-py 7's default)


def open_client(url: str) -> redis.Redis:
    """A client on ``url`` (redis-py's URL forms) whose pool has no cap of its own."""
    return redis.Redis.from_url(url, max_connections=POOL_MAX_CONNECTIONS)


__all__ = ["POOL_MAX_CONNECTIONS", "open_client"]
