"""The redis-py client a conch process opens on the broker: one place for its pool.

redis-py 8 caps a client's connection pool at 100 connections and raises
``MaxConnectionsError`` past that. Every thread or greenlet that runs a command holds
one of them meanwhile: in a worker, a batcher per model instance (and BLS calls from
them), so a worker serving 120 instances could ask for more than 100 at once; in a
gateway, each call held open on a job's result. Instances and calls are what an
operator sizes; the pool must not bound them. conch's pools grow with their callers
(they keep what they opened for reuse, as redis-py's pools do), and Redis's own
``maxclients`` remains the limit.

A connection attempt is bounded too (``CONNECT_TIMEOUT_S``; a ``socket_connect_timeout``
in the URL wins): redis-py waits as long as the OS does by default, so a Redis behind a
dropped route would hold a request past any outage grace instead of giving its 503.
"""

from __future__ import annotations

import redis

POOL_MAX_CONNECTIONS = 2**31 - 1  # no cap of the pool's own (redis-py 7's default)
CONNECT_TIMEOUT_S = 2.0


def open_client(url: str) -> redis.Redis:
    """A client on ``url`` (redis-py's URL forms) whose pool has no cap of its own and
    whose connection attempts give up after ``CONNECT_TIMEOUT_S``."""
    return redis.Redis.from_url(
        url, max_connections=POOL_MAX_CONNECTIONS, socket_connect_timeout=CONNECT_TIMEOUT_S
    )


__all__ = ["CONNECT_TIMEOUT_S", "POOL_MAX_CONNECTIONS", "open_client"]
