"""The models one worker serves: load, serve, withdraw and retire their versions.

A ``ModelHost`` holds what a worker has loaded: per model, its versions' backend
instances and the batchers that drain the model's queue into them. A change (a load, a
reload, an unload) loads the new versions beside the ones serving, switches, and then
retires the old: their batchers finish the batch in hand and give back what they hold,
so a change never fails a request. The host reports its model states
(``conch.wire.worker_reports``) at every change; the bootsteps in ``conch.worker.steps``
start it, keep its report alive, and tell it what the control bus asks for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from conch.backends import Backend, backend_class
from conch.backends.base import BlsPort, InstanceSpec
from conch.core import ensemble_graph
from conch.core.errors import ConchError, ModelLoadError
from conch.core.repository import ModelEntry, ModelRepository
from conch.core.sequence import SequenceSpec, state_in_redis
from conch.settings import Settings
from conch.wire import control_bus, model_metrics, statistics, worker_reports
from conch.worker.batcher import Batcher, BatchPolicy, InFlight, Sequencer
from conch.worker.host_metrics import HostMetrics
from conch.worker.metrics_publisher import MetricsPublisher
from conch.worker.sequence_batcher import SequenceBatcher
from conch.worker.warmup import run_warmup

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.5  # how often a worker refreshes its report; the report lives four beats


UNLOADED = "unloaded"  # the reason a withdrawn model reports


@dataclass
class LoadedModel:
    name: str
    versions: dict[int, list[Backend]] = field(default_factory=dict)  # version -> instances
    reason: str | None = None
    loading: bool = False
    planned: list[int] = field(default_factory=list)  # versions being loaded
    batchers: list[Batcher | SequenceBatcher] = field(default_factory=list)
    load_id: str = ""  # the load command this state answers (explicit mode)


class WorkerTelemetry:
    """Running totals of the batches this worker ran, per model: executions, requests,
    rows, success, failure, queue_us and compute_us.

    Telemetry of one worker, for the integration tests and ``bench/run.py`` (mean batch
    size is rows / executions; which worker ran how much). It travels only in this
    worker's report (``worker_reports``, under ``stats``). It is not what ``/metrics`` or
    the statistics extension serve: those read ``conch.wire.statistics``, which every
    batcher records in Redis per execution, summed over all workers as it is written.
    """

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


class ModelHost:
    """Loads models, runs their batchers, and reports them in the worker reports.

    ``repository`` is the worker's view of the model repository (``control_bus.
    open_repository``: explicit-mode overrides included), and ``bls`` the port through
    which the models it loads call other models (``ModelSpec.bls``); the composition root
    (``conch.worker.app``) makes both.
    """

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        *,
        client: redis.Redis,
        repository: ModelRepository,
        bls: BlsPort | None = None,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.client = client
        self.repository = repository
        self.bls = bls
        self.inflight = InFlight()
        self.models: dict[str, LoadedModel] = {}
        self.telemetry = WorkerTelemetry()
        self.metrics = MetricsPublisher(worker_id, ttl_s=HEARTBEAT_S * 4)  # models' custom ones
        self.host_metrics = HostMetrics(
            cpu=settings.allow_cpu_metrics,
            gpu=settings.allow_gpu_metrics,
            interval_s=settings.metrics_interval_ms / 1000,
        )
        self._changes = threading.Lock()  # one load/unload at a time
        self._fingerprints: dict[str, Any] = {}
        # The report is published from start's LOADING announcement until stop begins,
        # and never after it is withdrawn (the lock orders a heartbeat's publish with both).
        self._reporting = False
        self._report_lock = threading.Lock()

    def wanted(self, entries: dict[str, ModelEntry]) -> list[str]:
        """The models this worker should serve now."""
        names = [n for n, e in sorted(entries.items()) if e.backend != ensemble_graph.ENSEMBLE]
        if self.settings.models:
            names = [n for n in names if n in self.settings.models]
        if self.settings.model_control_mode.explicit:
            chosen = set(self.settings.load_models) | control_bus.loaded_models(self.client)
            if "*" not in chosen:
                names = [n for n in names if n in chosen]
        return names

    def start(self) -> None:
        """Report the models this worker will serve as LOADING, then load each."""
        entries = self.repository.scan()
        for missing in sorted(set(self.settings.models or ()) - set(entries)):
            log.error(
                "model '%s' asked for with --models is not in %s",
                missing,
                self.settings.model_repository,
            )
        # Ensembles have no queue of their own: gateways run their steps.
        wanted = self.wanted(entries)
        for name in wanted:
            self.models[name] = LoadedModel(
                name, loading=True, planned=list(entries[name].versions)
            )
        with self._report_lock:
            self._reporting = True
        self.report()  # LOADING, so readiness and the index say so while models load
        explicit = self.settings.model_control_mode.explicit
        for name in wanted:
            load_id = control_bus.last_load_id(self.client, name) if explicit else ""
            self.serve(name, entries[name], load_id=load_id)

    def changed_on_disk(self, name: str) -> bool:
        """Whether ``name``'s folder changed since it was last served (poll mode)."""
        return self._fingerprint(name) != self._fingerprints.get(name)

    def _fingerprint(self, name: str) -> Any:
        """What changes when a model's config or version folders are replaced."""
        path = self.settings.model_repository / name
        try:
            items = sorted(path.iterdir())
        except OSError:
            return None
        return tuple((p.name, p.stat().st_ino, p.stat().st_mtime_ns) for p in items)

    def reload(self, name: str, *, load_id: str = "") -> None:
        entry = self.repository.read_model(name)
        if entry.backend == ensemble_graph.ENSEMBLE:
            return
        if self.settings.models and name not in self.settings.models:
            return
        self.serve(name, entry, load_id=load_id)

    def serve(self, name: str, entry: ModelEntry, *, load_id: str = "") -> None:
        """Load ``entry`` beside what serves ``name`` now, then switch and drain the old.

        A broken new config or version leaves the old one serving, with the reason.
        """
        with self._changes:
            self._fingerprints[name] = self._fingerprint(name)
            current = self.models.get(name)
            if current is None or not current.versions:
                current = self.models[name] = LoadedModel(name, planned=list(entry.versions))
            current.loading, current.load_id = True, load_id
            self.report()
            try:
                if entry.error or entry.config is None:
                    raise ModelLoadError(entry.error or "no config")
                started = time.monotonic()
                versions, batchers = self._load(entry)
                self._count_load(name, time.monotonic() - started)
            except Exception as exc:
                current.reason = (
                    exc.message
                    if isinstance(exc, ConchError)
                    else (f"model '{name}' failed to load: {type(exc).__name__}: {exc}")
                )
                current.loading = False
                level = log.error if isinstance(exc, ConchError) else log.exception
                level(
                    "model '%s' is unavailable%s: %s",
                    name,
                    " (its previous versions keep serving)" if current.versions else "",
                    current.reason,
                )
                self.report()
                return
            old = self.models[name]
            self.models[name] = LoadedModel(
                name, versions=versions, batchers=batchers, load_id=load_id
            )
            for b in batchers:
                b.start()
            self.report()
            self._retire(old)
            log.info(
                "model '%s' versions %s ready with %d instance(s)",
                name,
                sorted(versions),
                len(next(iter(versions.values()), [])),
            )

    def _count_load(self, name: str, took_s: float) -> None:
        """A load's time (every version and instance, warmup included), for
        ``conch_model_load_*``: added to the model's totals, and as its last."""
        ms = int(took_s * 1000)
        pipe = self.client.pipeline(transaction=False)
        statistics.count_model(pipe, name, statistics.LOADS)
        statistics.count_model(pipe, name, statistics.LOAD_MS, ms)
        statistics.set_model(pipe, name, statistics.LAST_LOAD_MS, ms)
        try:
            pipe.execute()
        except redis.RedisError as exc:  # a metric: the load itself went well
            log.warning("model '%s': load time not recorded: %s", name, exc)

    def withdraw(self, name: str) -> None:
        with self._changes:
            old = self.models.get(name)
            if old is None:  # never served here (an ensemble, another worker's model)
                return
            if old.reason == UNLOADED and not old.versions and not old.batchers:
                return  # withdrawn already: a later poll or tick says so again
            del self.models[name]
            self.models[name] = LoadedModel(name, reason=UNLOADED)
            self.report()
            self._retire(old)
            log.info("model '%s' unloaded", name)

    def _retire(self, old: LoadedModel) -> None:
        """Old batchers finish their batch and hand back what they hold; then unload."""
        for b in old.batchers:
            b.stop()
        for b in old.batchers:
            b.join(timeout=60)
        for backend in (b for instances in old.versions.values() for b in instances):
            try:
                backend.unload()
            except Exception:
                log.exception("model '%s': unload failed", old.name)

    def _load(
        self, entry: ModelEntry
    ) -> tuple[dict[int, list[Backend]], list[Batcher | SequenceBatcher]]:
        cls = backend_class(entry.backend)
        specs = entry.instances()
        versions: dict[int, list[Backend]] = {}
        try:
            for version in entry.versions:
                versions[version] = instances = []
                model_spec = dataclasses.replace(entry.spec(version), bls=self.bls)
                for spec in specs:
                    backend = cls(model_spec, spec)
                    backend.load()
                    instances.append(backend)
                    run_warmup(backend, backend.spec)  # before the model is reported ready
        except Exception:
            for b in (b for instances in versions.values() for b in instances):
                try:
                    b.unload()
                except Exception:
                    log.exception("model '%s': unload after a failed load failed", entry.name)
            raise
        seq = SequenceSpec.from_config(entry.config)
        if seq is not None:
            return versions, self._sequence_batchers(entry, seq, versions, specs)
        policy = BatchPolicy.from_config(entry.config)
        cfg = entry.config
        ordered = cfg.HasField("dynamic_batching") and cfg.dynamic_batching.preserve_ordering
        sequencer = Sequencer() if ordered else None
        batchers = [
            Batcher(
                client=self.client,
                model=entry.name,
                backends={v: inst[k] for v, inst in versions.items()},
                policy=policy,
                inflight=self.inflight,
                max_attempts=self.settings.max_attempts,
                name=f"batcher-{spec.name}",
                on_batch=self.telemetry.add,
                on_send=self.metrics.queue,
                sequencer=sequencer,
                samples=self.settings.metrics_config.summary_latencies,
            )
            for k, spec in enumerate(specs)
        ]
        return versions, batchers

    def _sequence_batchers(
        self,
        entry: ModelEntry,
        seq: SequenceSpec,
        versions: dict[int, list[Backend]],
        specs: list[InstanceSpec],
    ) -> list[SequenceBatcher]:
        """A sequence model's instances: each a slot of sequences (``sequence_batcher``)."""
        initial = seq.initial_state(entry.path)
        return [
            SequenceBatcher(
                client=self.client,
                model=entry.name,
                backends={v: inst[k] for v, inst in versions.items()},
                spec=seq,
                max_batch_size=entry.config.max_batch_size,
                worker_id=self.worker_id,
                slot=spec.name,
                initial_state=initial,
                state_moves=state_in_redis(entry.config),
                on_batch=self.telemetry.add,
                name=f"sequences-{spec.name}",
            )
            for k, spec in enumerate(specs)
        ]

    def _states(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, m in list(self.models.items()):
            versions = {str(v): worker_reports.READY for v in m.versions}
            if m.loading:
                versions.update(
                    {str(v): worker_reports.LOADING for v in m.planned if v not in m.versions}
                )
            out[name] = {
                "versions": versions,
                "reason": m.reason,
                "loading": m.loading,
                "load_id": m.load_id,
            }
        return out

    def report(self) -> None:
        """Publish this worker's model states for the gateways, with its telemetry and its
        host's CPU and GPU use, and refresh its models' custom metrics."""
        stats = self.telemetry.snapshot()
        host = self.host_metrics.sample()
        with self._report_lock:
            if self._reporting:
                worker_reports.publish(
                    self.client,
                    self.worker_id,
                    self._states(),
                    stats=stats,
                    host=host,
                    ttl_s=HEARTBEAT_S * 4,
                )
                pipe = self.client.pipeline(transaction=False)
                self.metrics.queue(pipe, refresh=True)
                if len(pipe):
                    pipe.execute()

    def stop(self) -> None:
        """Finish the batches in progress, hand back what is held, unload, withdraw."""
        with self._changes:
            models = list(self.models.values())
            for m in models:
                for b in m.batchers:
                    b.stop()
            with self._report_lock:
                self._reporting = False
            for m in models:
                self._retire(m)
        with contextlib.suppress(redis.RedisError):
            worker_reports.withdraw(self.client, self.worker_id)
            model_metrics.withdraw(self.client, self.worker_id)
