"""Settings an API changes at run time for every process: the logging extension's
(``conch.wire.log_control``) and the trace extension's (``conch.core.tracing``).

The process that takes a change checks it and applies it to itself, then ``publish``es
it: merged into one JSON key (every setting the API has changed so far; a ``None``
value removes its setting, so the process's own flag holds again) and sent on a
channel. Every process runs a ``follow``er that applies each change it hears and, since
pub/sub loses what is sent while a listener is away, reads the key when it
(re)subscribes and whenever the key changed under it. So a process started later (a
worker the autoscaler adds) is set as the others are: the API's settings hold for the
deployment until changed again, over each process's flags.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from conch.wire.control_bus import Subscriber

Apply = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class SharedSettings:
    """One API's settings: the key that holds them all, the channel each change goes on."""

    key: str
    channel: str
    thread: str  # the follower's thread name

    def publish(self, client: redis.Redis, changes: dict[str, Any]) -> dict[str, Any]:
        """Record ``changes`` (checked already) for every process, and tell the live ones.

        Returns what the publishing process is to apply: every stored setting, ``changes``
        included (their ``None`` values too, which remove a setting). A change another
        process published just before is in it, though this process's follower may not
        have heard of it yet; applied as the deltas alone, that change would arrive after
        this one and undo it here until this one's own message followed.
        """
        payload = json.dumps(changes)
        kept: dict[str, Any] = {}

        def merge(pipe: redis.client.Pipeline) -> None:
            nonlocal kept
            merged = {**self.stored(pipe), **changes}
            pipe.multi()
            kept = {k: v for k, v in merged.items() if v is not None}
            pipe.set(self.key, json.dumps(kept, sort_keys=True))
            pipe.publish(self.channel, payload)

        client.transaction(merge, self.key)
        return {**kept, **changes}

    def stored(self, client: redis.Redis | redis.client.Pipeline) -> dict[str, Any]:
        """Every setting the API has changed so far ({} if none, or unreadable)."""
        raw = client.get(self.key)
        try:
            value = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def follow(self, client: redis.Redis, apply: Apply, tick_s: float = 5.0) -> Subscriber:
        """Start applying the API's changes in this process: ``apply`` gets each change
        as sent, and every stored setting when some may have been missed."""

        def on_tick(changed: bool) -> None:
            if changed:
                settings = self.stored(client)
                if settings:
                    apply(settings)

        subscriber = Subscriber(
            client,
            lambda _channel, payload: apply(payload),
            on_tick,
            tick_s,
            channels=(self.channel,),
            generation=self.key,
        )
        subscriber.name = self.thread
        subscriber.start()
        return subscriber


__all__ = ["Apply", "SharedSettings"]
