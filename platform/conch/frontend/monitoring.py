"""The data plane's monitoring: Triton's statistics extension, the metrics port's
numbers, the work owed to the workers (for a scaler), and what the live workers report.

``DataPlane`` hands these reads here. Every number comes from Redis, summed over the
fleet's processes: the workers write their counters and reports, the frontends read
them (``conch.wire.statistics``, ``conch.wire.worker_reports``); a frontend's response
cache writes its own counters first, so that a read sees them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis

from conch.core import custom_metrics, ensemble_graph
from conch.core.errors import InvalidArgument, NotFound
from conch.core.repository_keys import model_name_problem
from conch.frontend.model_view import ModelView
from conch.frontend.response_cache import ResponseCache
from conch.frontend.sequence_route import SequenceRoute
from conch.settings import Settings
from conch.wire import model_metrics, sequences, statistics, worker_reports
from conch.wire.work_owed import JobsWork, ModelWork, jobs_owed, work_owed


@dataclass
class ModelMetrics:
    """One model's counters and queue, for the metrics endpoint."""

    name: str
    counters: dict[int, dict[str, int]]  # version -> statistics counters
    ready: list[int]  # versions a live worker reports READY
    work: ModelWork | None  # waiting in its queue and in flight; None: an ensemble's
    cached: bool = False  # the frontends keep a response cache and the model uses it
    # version -> phase -> recent latencies (us), for the summaries; None: summaries off
    samples: dict[int, dict[str, list[int]]] | None = None
    own: dict[str, int] = field(default_factory=dict)  # the model's own counters (loads, ...)
    sequence_model: bool = False  # it has sequence_batching (its live sequences count)
    # A sequence model's requests waiting in its sequences' mailboxes, not yet running
    # (its queue, ``work``, holds none).
    sequence_waiting: int = 0

    @property
    def failures(self) -> dict[int, dict[str, int]]:
        """version -> failed requests by Triton's reason (REJECTED, CANCELED, ...)."""
        return {v: statistics.failures_by_reason(c) for v, c in self.counters.items()}


@dataclass(eq=False)
class Monitoring:
    """The monitoring reads of one data plane (see the module docstring)."""

    settings: Settings
    view: ModelView
    _client: redis.Redis
    cache: ResponseCache | None
    sequences: SequenceRoute

    def statistics(self, model: str | None = None, version: str = "") -> list[dict[str, Any]]:
        """Triton's statistics extension: every loaded model, one model, or one version."""
        view = self.view
        if model is None:
            wanted = {
                name: list(entry.versions)
                for name, entry in sorted(view.entries.items())
                if view.is_loaded(name) and entry.config is not None and not entry.error
            }
        else:
            entry = view.serving(model)
            wanted = {model: [entry.resolve_version(version)] if version else entry.versions}
        if self.cache is not None:
            self.cache.flush()  # this process's cache counters, before they are read
        out = []
        for name, versions in wanted.items():
            counters = statistics.read(self._client, name)
            out.extend(statistics.model_stats(name, v, counters.get(v, {})) for v in versions)
        return out

    def metrics(self) -> list[ModelMetrics]:
        """Every loaded model's counters (summed over all workers, ever) and work owed."""
        view = self.view
        states = view.states()
        served = [
            (name, entry)
            for name, entry in sorted(view.entries.items())
            if entry.config is not None and not entry.error and view.is_loaded(name)
        ]
        work = work_owed(
            self._client, [n for n, e in served if e.backend != ensemble_graph.ENSEMBLE]
        )
        if self.cache is not None:
            self.cache.flush()
        summaries = self.settings.metrics_config.summary_latencies
        since_ms = int((time.time() - statistics.SAMPLES_WINDOW_S) * 1000)
        out = []
        for name, entry in served:
            recorded, own = statistics.read_all(self._client, name)
            queued = entry.backend != ensemble_graph.ENSEMBLE
            versions = states.get(name, {}).get("versions", {})
            sequential = self.sequences.spec(entry.config) is not None
            out.append(
                ModelMetrics(
                    name,
                    {v: recorded.get(v, {}) for v in sorted({*entry.versions, *recorded})},
                    [int(v) for v, st in versions.items() if st == worker_reports.READY],
                    work.get(name),
                    self.cache is not None and self.cache.applies(entry.config),
                    statistics.read_samples(self._client, name, since_ms)
                    if summaries and queued
                    else None,
                    own,
                    sequence_model=sequential,
                    sequence_waiting=sequences.pending_requests(self._client, name)
                    if sequential
                    else 0,
                )
            )
        return out

    def queue_depth(self, models: list[str]) -> dict[str, ModelWork]:
        """The work owed to the workers of each model named (``conch.wire.work_owed``);
        none named: every model the repository holds but ensembles, which have no queue.

        A name the repository does not hold is a 404, not zeros: a scaler pointed at a
        misspelled model says so instead of keeping its workers at zero for good.
        """
        entries = self.view.entries
        if not models:
            models = [n for n, e in sorted(entries.items()) if e.backend != ensemble_graph.ENSEMBLE]
        for name in models:
            problem = model_name_problem(name)
            if problem:
                raise InvalidArgument(f"'{name}' is not a model name: {problem}")
            if name not in entries:
                raise NotFound(f"Request for unknown model: '{name}' is not found")
        return work_owed(self._client, models)

    def jobs_depth(self) -> JobsWork:
        """The work the batch jobs queue owes (``conch.wire.work_owed.jobs_owed``)."""
        return jobs_owed(self._client)

    def residency(self) -> dict[str, dict[str, list[str]]]:
        """Where each model is resident, or on standby (``worker_reports.residency``)."""
        return worker_reports.residency(worker_reports.snapshot(self._client))

    def hosts(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """The live workers' hosts: CPU use per host and GPU use per GPU UUID
        (``worker_reports.hosts``)."""
        return worker_reports.hosts(worker_reports.snapshot(self._client))

    def custom_metrics(self) -> list[dict[str, Any]]:
        """The metric families models defined (``pb_utils.MetricFamily``), each metric
        summed over the live workers that have it (``conch.core.custom_metrics.merge``)."""
        sources = worker_reports.metrics_sources(worker_reports.snapshot(self._client))
        return custom_metrics.merge(model_metrics.read(self._client, sources))

    def process_instances(self) -> list[dict[str, Any]]:
        """The live workers' process instances and their memory
        (``worker_reports.process_instances``)."""
        return worker_reports.process_instances(worker_reports.snapshot(self._client))


__all__ = ["ModelMetrics", "Monitoring"]
