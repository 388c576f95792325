"""The custom metrics each worker's models define (``conch.core.custom_metrics``), in Redis.

A worker keeps its registry's snapshot under a key of its own that expires unless
refreshed: its heartbeat rewrites it, and a batch that changed a metric rewrites it in the
round trip that sends the batch's replies, so a client that got its reply finds the new
value on the metrics port. Gateways sum the snapshots of the live workers; a worker that
goes away takes its metrics with it, as a restarted Triton does.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from conch.wire.keys import CUSTOM_METRICS_PREFIX
from conch.wire.redis_link import CommandQueue


def key(worker_id: str) -> str:
    return CUSTOM_METRICS_PREFIX + worker_id


def publish(
    pipe: CommandQueue, worker_id: str, snapshot: list[dict[str, Any]], *, ttl_s: float
) -> None:
    """Queue the write of ``worker_id``'s snapshot on ``pipe`` (the caller executes it)."""
    pipe.set(key(worker_id), json.dumps(snapshot), px=int(ttl_s * 1000))


def withdraw(client: redis.Redis, worker_id: str) -> None:
    client.delete(key(worker_id))


def read(client: redis.Redis, ids: list[str]) -> list[list[dict[str, Any]]]:
    """The snapshots of ``ids``: the live workers and their process instances
    (``conch.wire.worker_reports.metrics_sources``)."""
    if not ids:
        return []
    return [json.loads(v) for v in client.mget([key(i) for i in ids]) if v is not None]


__all__ = ["key", "publish", "read", "withdraw"]
