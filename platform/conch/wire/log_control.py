"""Triton's logging extension across processes: a change made through one gateway
reaches every gateway, gRPC server and worker.

The process that takes a ``POST v2/logging`` checks it and applies it to itself
(``conch.server_log``), then ``publish``es what it changed: merged into one JSON key
(every setting the API has changed so far) and sent on a channel. Every process runs a
``follow``er that applies each change it hears, and, since pub/sub loses what is sent
while a listener is away, reads the key when it (re)subscribes and whenever the key
changed under it. So a process started later (a worker the autoscaler adds) logs as the
others do: the API's settings hold for the deployment until changed again, over each
process's flags. The log file is not among them: it is each process's own
(``--log-file``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import redis

from conch.wire.control_bus import Subscriber
from conch.wire.keys import LOG_COMMANDS, LOG_SETTINGS

log = logging.getLogger(__name__)

Apply = Callable[[dict[str, Any]], None]


def publish(client: redis.Redis, changes: dict[str, Any]) -> None:
    """Record ``changes`` (checked already) for every process, and tell the live ones."""
    payload = json.dumps(changes)

    def merge(pipe: redis.client.Pipeline) -> None:
        merged = {**stored(pipe), **changes}
        pipe.multi()
        pipe.set(LOG_SETTINGS, json.dumps(merged, sort_keys=True))
        pipe.publish(LOG_COMMANDS, payload)

    client.transaction(merge, LOG_SETTINGS)


def stored(client: redis.Redis | redis.client.Pipeline) -> dict[str, Any]:
    """Every setting the logging API has changed so far ({} if none, or unreadable)."""
    raw = client.get(LOG_SETTINGS)
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def follow(client: redis.Redis, apply: Apply, tick_s: float = 5.0) -> Subscriber:
    """Start applying the logging API's changes in this process (``apply`` gets a dict of
    Triton's log settings); the running subscriber."""

    def on_tick(changed: bool) -> None:
        if changed:
            settings = stored(client)
            if settings:
                apply(settings)

    subscriber = Subscriber(
        client,
        lambda _channel, payload: apply(payload),
        on_tick,
        tick_s,
        channels=(LOG_COMMANDS,),
        generation=LOG_SETTINGS,
    )
    subscriber.name = "conch-log-settings"
    subscriber.start()
    return subscriber


__all__ = ["follow", "publish", "stored"]
