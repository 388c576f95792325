"""Repository events on Redis: one JSON message per change, and a generation counter.

Channel ``conch.repository.events`` carries, for every model or version that appeared,
changed or disappeared, once its files are in place::

    {"model": "resnet", "version": 3, "change": "added", "at": 1718000000.5, "generation": 12}

``version`` is null for the model itself (the model folder appeared or disappeared, or a
model-level file such as config.pbtxt changed). ``generation`` is the value of the Redis
key ``conch.repository.generation``, INCRemented once per sync pass that changed anything,
before that pass's events are published. A subscriber that starts late (or lost its
connection) reads the key after subscribing; if it differs from the generation it last
acted on, it rescans the repository. Compare for inequality, not order: a Redis without
persistence restarts the count.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from conch.wire.keys import REPOSITORY_EVENTS as CHANNEL
from conch.wire.keys import REPOSITORY_GENERATION as GENERATION_KEY

log = logging.getLogger(__name__)

CHANGES = ("added", "changed", "removed")


def make_event(model: str, version: int | None, change: str, at: float | None = None) -> dict:
    if change not in CHANGES:
        raise ValueError(f"change must be one of {CHANGES}, not {change!r}")
    return {
        "model": model,
        "version": version,
        "change": change,
        "at": time.time() if at is None else at,
    }


def publish_events(client: Any, events: Iterable[dict], *, bump_generation: bool = True) -> int:
    """Publish events with redis-py ``client``; returns the generation they carry.

    The generation is INCRemented first (when ``bump_generation``), then every event is
    PUBLISHed on ``CHANNEL`` in one pipeline, in order."""
    events = list(events)
    if bump_generation:
        generation = int(client.incr(GENERATION_KEY))
    else:
        generation = int(client.get(GENERATION_KEY) or 0)
    pipe = client.pipeline(transaction=False)
    for event in events:
        pipe.publish(CHANNEL, json.dumps({**event, "generation": generation}))
    pipe.execute()
    return generation


def read_generation(client: Any) -> int:
    return int(client.get(GENERATION_KEY) or 0)


def decode_event(data: bytes | str) -> dict:
    """A message's data back to a dict, checked for the fields every event has."""
    event = json.loads(data)
    if not isinstance(event, dict) or event.get("change") not in CHANGES or "model" not in event:
        raise ValueError(f"not a repository event: {data!r}")
    return event


class Publisher:
    """Publishes to ``redis_url``, or only logs without one. Events a failed publish could
    not deliver are kept and sent first on the next call, so none is silently lost."""

    def __init__(self, redis_url: str | None = None) -> None:
        self.redis_url = redis_url or None
        self._client: Any = None
        self._backlog: list[dict] = []
        self.generation: int | None = None

    def _redis(self) -> Any:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.redis_url, socket_timeout=10, socket_connect_timeout=10
            )
        return self._client

    def publish(self, events: list[dict]) -> int | None:
        for event in events:
            log.info(
                "repository event: %s %s%s",
                event["change"],
                event["model"],
                "" if event["version"] is None else f" version {event['version']}",
            )
        if not self.redis_url:
            return None
        pending = self._backlog + list(events)
        if not pending:
            return self.generation
        try:
            self.generation = publish_events(self._redis(), pending)
        except Exception as exc:  # redis down: keep them for the next pass
            log.error(
                "cannot publish %d repository event(s) to %s: %s; will retry",
                len(pending),
                self.redis_url,
                exc,
            )
            self._backlog = pending
            return None
        self._backlog = []
        return self.generation

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


__all__ = [
    "CHANGES",
    "CHANNEL",
    "GENERATION_KEY",
    "Publisher",
    "decode_event",
    "make_event",
    "publish_events",
    "read_generation",
]
