"""One Redis connection owned by one loop, without the pool's per-call checks.

redis-py's pool checks every connection it hands out for stray data with a zero-timeout
poll. Under gevent that poll is a hub round trip, measured at ~0.3 ms: more than the
command it guards. The gateway's publish and reply loops each own a connection instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import redis


class RedisLink:
    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._conn: Any = None
        self._pid = 0

    def _connection(self) -> Any:
        if self._conn is None or self._pid != os.getpid():  # never share one across a fork
            self._conn = self._pool.make_connection()
            self._pid = os.getpid()
        return self._conn

    def call(self, *args: Any) -> Any:
        return self.pipeline([args])[0]

    def pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send the commands in one write; error replies come back as ResponseError values."""
        conn = self._connection()
        try:
            conn.send_packed_command(conn.pack_commands(commands))
            out: list[Any] = []
            for _ in commands:
                try:
                    out.append(conn.read_response())
                except redis.ResponseError as exc:
                    out.append(exc)
            return out
        except BaseException:
            conn.disconnect()  # unknown state: the next call reconnects
            self._conn = None
            raise
