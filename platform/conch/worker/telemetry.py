"""What one worker ran, per model: its own running totals, apart from Triton's statistics.

Telemetry of one worker, for the integration tests and ``bench/run.py`` (mean batch size
is rows / executions; which worker ran how much). It travels only in this worker's report
(``worker_reports``, under ``stats``). It is not what ``/metrics`` or the statistics
extension serve: those read ``conch.wire.statistics``, which every drain loop records in
Redis per execution, summed over all workers as it is written. A process instance keeps
its own and sends what it added (``take``) to its worker, which adds it to the worker's.
"""

from __future__ import annotations

import threading


class WorkerTelemetry:
    """Running totals of the batches run, per model: executions, requests, rows, success,
    failure, queue_us and compute_us."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, dict[str, int]] = {}

    def add(self, model: str, counts: dict[str, int]) -> None:
        with self._lock:
            totals = self._totals.setdefault(model, {})
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {model: dict(totals) for model, totals in self._totals.items()}

    def take(self) -> dict[str, dict[str, int]]:
        """The totals so far, which start again from nothing."""
        with self._lock:
            totals, self._totals = self._totals, {}
        return totals
