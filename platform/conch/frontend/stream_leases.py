"""The leases of the streams this process reads: kept alive while someone reads them.

A watched request (``conch.wire.stream_log``) is cancelled once its lease lapses. Each
process that reads streams (a gateway process, a gRPC server process) holds one
``LeaseKeeper``: one thread that renews every lease it holds in one round trip every
``REFRESH_S``, so an open stream costs no Redis call of its own while it stays open, and
a process that dies lets all its leases lapse within their time to live.
"""

from __future__ import annotations

import logging
import os
import threading

import redis

from conch.wire import stream_log

log = logging.getLogger(__name__)

REFRESH_S = 0.5  # how often the held leases are renewed
MIN_TTL_S = 2.0  # a lease lives at least this long: several renewals fit in it


class LeaseKeeper:
    """The leases this process renews: ``add`` when a reader starts, ``drop`` when it
    stops (its lease then runs out, unless another reader holds it)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # stream id -> its lease's time to live (ms)
        self._pid: int | None = None
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, stream_id: str, ttl_s: float) -> None:
        ttl_ms = int(max(ttl_s, MIN_TTL_S) * 1000)
        with self._lock:
            self._held[stream_id] = ttl_ms
            if self._pid != os.getpid():  # the first, or a forked child's first
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._renew, name="conch-leases", daemon=True
                )
                self._thread.start()

    def drop(self, stream_id: str) -> None:
        with self._lock:
            self._held.pop(stream_id, None)

    def close(self) -> None:
        """Renew nothing more, and end the thread that renews."""
        with self._lock:
            self._pid = None
            self._held.clear()
        self._closing.set()
        if self._thread is not None:
            self._thread.join(REFRESH_S)

    def holds(self, stream_id: str) -> bool:
        with self._lock:
            return stream_id in self._held

    def _renew(self) -> None:
        pid = os.getpid()
        while self._pid == pid:
            if self._closing.wait(REFRESH_S):
                return
            with self._lock:
                held = dict(self._held)
            if not held:
                continue
            pipe = self._client.pipeline(transaction=False)
            for stream_id, ttl_ms in held.items():
                stream_log.hold(pipe, [stream_id], ttl_ms)
            try:
                pipe.execute()
            except redis.RedisError as exc:  # an outage: the leases last a while yet
                log.warning("could not renew %d stream leases: %s", len(held), exc)
