"""Publishes the custom metrics this worker's models define, for the gateways' /metrics.

The models add to the process's registry (``conch.core.custom_metrics.REGISTRY``, through
``pb_utils.MetricFamily``); this writes its snapshot under the worker's key
(``conch.wire.model_metrics``): with a batch's replies when a metric changed since the
last write, and on every heartbeat, which keeps the key from expiring.
"""

from __future__ import annotations

import threading

from conch.core.custom_metrics import REGISTRY, Registry
from conch.wire import model_metrics
from conch.wire.redis_link import CommandQueue


class MetricsPublisher:
    def __init__(self, worker_id: str, *, ttl_s: float, registry: Registry = REGISTRY) -> None:
        self.worker_id = worker_id
        self.ttl_s = ttl_s
        self.registry = registry
        self._lock = threading.Lock()
        self._published = registry.version  # nothing to write until a model defines one
        self._holding = False  # the last write had metrics: the heartbeat keeps it alive

    def queue(self, pipe: CommandQueue, *, refresh: bool = False) -> None:
        """Queue the snapshot's write on ``pipe`` if a metric changed since the last one
        (or, with ``refresh``, if the last one had metrics, to renew its expiry)."""
        with self._lock:
            version = self.registry.version
            if version == self._published and not (refresh and self._holding):
                return
            snapshot = self.registry.snapshot()  # at least as new as ``version``
            model_metrics.publish(pipe, self.worker_id, snapshot, ttl_s=self.ttl_s)
            self._published, self._holding = version, bool(snapshot)


__all__ = ["MetricsPublisher"]
