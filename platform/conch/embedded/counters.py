"""An embedded server's Triton statistics, kept in its own memory.

A fleet's workers add each execution's counts to a Redis hash per model; an embedded
server adds the very same counts (``statistics.execution_counts``) to a dict per version,
and shows them in the same form (``statistics.model_stats``), so the statistics
extension reads alike in both modes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from conch.wire import statistics


class Counters:
    """One model's counters, by version."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_version: dict[int, dict[str, int]] = {}

    def add(self, run: statistics.Execution) -> None:
        """One execution and the requests it answered."""
        self._add(run.version, statistics.execution_counts(run), bool(run.success))

    def failed(self, version: int, reason: str, took_ns: int) -> None:
        """A request that failed before it ran (refused, cancelled, expired)."""
        self._add(
            version,
            {"fail.count": 1, "fail.ns": took_ns, statistics.failure_field(reason): 1},
            False,
        )

    def _add(self, version: int, increments: dict[str, int], succeeded: bool) -> None:
        with self._lock:
            counters = self._by_version.setdefault(version, {})
            for name, amount in increments.items():
                counters[name] = counters.get(name, 0) + amount
            if succeeded:
                counters["last_inference"] = int(time.time() * 1000)

    def stats(self, name: str, versions: list[int]) -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries for ``versions``."""
        with self._lock:
            return [
                statistics.model_stats(name, v, dict(self._by_version.get(v, {}))) for v in versions
            ]


__all__ = ["Counters"]
