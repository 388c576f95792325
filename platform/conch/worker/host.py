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
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis

from conch.backends import Backend, loading
from conch.backends.base import BlsPort, InstanceSpec
from conch.core import ensemble_graph
from conch.core.errors import ConchError, ModelLoadError, StartFailed
from conch.core.repository import ModelEntry, ModelRepository
from conch.settings import InstanceForm, Settings
from conch.wire import control_bus, model_metrics, statistics, worker_reports
from conch.wire.rate_limits import FleetLimiter
from conch.worker import instance, rate_limiter, residency
from conch.worker.batcher import InFlight, Sequencer
from conch.worker.host_metrics import HostMetrics
from conch.worker.instance_supervisor import KILL_AFTER_S, InstanceMain, InstanceProcess
from conch.worker.loop_parts import WorkerParts
from conch.worker.metrics_publisher import MetricsPublisher
from conch.worker.process_instance import InstancePlan
from conch.worker.telemetry import WorkerTelemetry

log = logging.getLogger(__name__)

HEARTBEAT_S = worker_reports.HEARTBEAT_S  # the steps' beat, and the tests'


UNLOADED = "unloaded"  # the reason a withdrawn model reports
# A model config's parameter that chooses its instances' form (``InstanceForm``).
INSTANCE_FORM_PARAMETER = "instance_form"

# What serves one instance slot: its drain loop on a thread here, or a child process.
Instance = instance.DrainLoop | InstanceProcess


@dataclass(frozen=True)
class Load:
    """A model to load at start, and the explicit-mode load command it answers."""

    name: str
    entry: ModelEntry
    load_id: str = ""


@dataclass
class LoadedModel:
    name: str
    versions: dict[int, list[Backend]] = field(default_factory=dict)  # version -> instances
    reason: str | None = None
    loading: bool = False
    planned: list[int] = field(default_factory=list)  # versions being loaded
    batchers: list[Instance] = field(default_factory=list)  # each instance's drain loop
    load_id: str = ""  # the load command this state answers (explicit mode)
    standby: bool = False  # not resident: loaded when its work waits (--model-memory-budget)


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
        instance_main: InstanceMain | None = None,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.client = client
        self.repository = repository
        self.bls = bls
        # The entry of a process instance's child (the composition root's), None where
        # instances can only be threads.
        self.instance_main = instance_main
        self.inflight = InFlight()
        self.models: dict[str, LoadedModel] = {}
        self.telemetry = WorkerTelemetry()
        self.metrics = MetricsPublisher(
            worker_id, ttl_s=worker_reports.REPORT_TTL_S
        )  # models' custom ones
        self.host_metrics = HostMetrics(
            cpu=settings.allow_cpu_metrics,
            gpu=settings.allow_gpu_metrics,
            interval_s=settings.metrics_interval_ms / 1000,
        )
        self._changes = threading.Lock()  # one load/unload at a time
        # Triton's rate limiter across the fleet (--rate-limit execution_count), from start.
        self.limiter: FleetLimiter | None = None
        # --model-memory-budget: models loaded when their work waits, within the budget.
        budget = settings.model_memory_budget
        self.residency = residency.Residency(self, budget) if budget > 0 else None
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
        self.settings = rate_limiter.with_default_counts(self.settings, entries.values())
        self.limiter = rate_limiter.fleet_limiter(self.settings, self.client)
        for missing in sorted(set(self.settings.models or ()) - set(entries)):
            log.error(
                "model '%s' asked for with --models is not in %s",
                missing,
                ", ".join(map(str, self.settings.repository_folders)),
            )
        # Ensembles have no queue of their own: gateways run their steps.
        wanted = self.wanted(entries)
        for name in wanted:
            self.models[name] = LoadedModel(
                name,
                loading=self.residency is None,
                planned=list(entries[name].versions),
                standby=self.residency is not None,
            )
        with self._report_lock:
            self._reporting = True
        self.report()  # LOADING, so readiness and the index say so while models load
        failed = self._missing_startup_models(entries)
        if self.residency is not None:  # each is loaded when its work waits
            for name in wanted:
                self._fingerprints[name] = self._fingerprint(name)
                problem = entries[name].error or self.residency.too_large(entries[name])
                if problem:
                    self.refuse(name, problem)
                    failed[name] = problem
            self.residency.start()
        else:
            explicit = self.settings.model_control_mode.explicit
            self._load_at_start(
                [
                    Load(name, entries[name], control_bus.last_load_id(self.client, name))
                    if explicit
                    else Load(name, entries[name])
                    for name in wanted
                ]
            )
            failed |= {n: str(self.models[n].reason) for n in wanted if self.models[n].reason}
        if failed and self.settings.exit_on_error:  # the worker stops (steps.ModelServing)
            raise StartFailed(failed)

    def _missing_startup_models(self, entries: dict[str, ModelEntry]) -> dict[str, str]:
        """Explicit mode's ``--load-model`` names that no repository holds, each with
        Triton's reason (logged: a typo would otherwise go unseen)."""
        if not self.settings.model_control_mode.explicit:
            return {}
        missing = sorted(set(self.settings.load_models) - set(entries) - {"*"})
        for name in missing:
            log.error("failed to load '%s': model not found in any model repository", name)
        return {name: "model not found in any model repository" for name in missing}

    def _load_at_start(self, loads: list[Load]) -> None:
        """Load what the worker serves from its start, ``--model-load-thread-count``
        models at once, as Triton's loader threads do. Nothing else changes the host
        until ``start`` returns (``steps.ControlFollower`` starts after it), so each
        load runs outside the lock that orders changes, which its state changes take."""
        threads = min(self.settings.model_load_thread_count, len(loads))
        if threads <= 1:
            for load in loads:
                self.serve(load.name, load.entry, load_id=load.load_id)
            return
        with ThreadPoolExecutor(threads, thread_name_prefix="model-load") as pool:
            done = [
                pool.submit(self._serve, load.name, load.entry, load.load_id, self._changes)
                for load in loads
            ]
            for future in done:
                future.result()

    def changed_on_disk(self, name: str) -> bool:
        """Whether ``name``'s folder changed since it was last served (poll mode)."""
        return self._fingerprint(name) != self._fingerprints.get(name)

    def _fingerprint(self, name: str) -> Any:
        """What changes when a model's config or version folders are replaced."""
        path = self.repository.folder(name)
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
        if self.residency is not None and not self.models.get(name, LoadedModel(name)).versions:
            # Not resident: on standby, read afresh when its work waits (a changed model
            # that is resident is loaded again at once, as without a budget).
            with self._changes:
                self._fingerprints[name] = self._fingerprint(name)
                planned = list(entry.versions)
                self.models[name] = LoadedModel(
                    name, planned=planned, standby=True, load_id=load_id
                )
                self.report()
            return
        self.serve(name, entry, load_id=load_id)

    def serve(self, name: str, entry: ModelEntry, *, load_id: str = "") -> None:
        """Load ``entry`` beside what serves ``name`` now, then switch and drain the old.

        A broken new config or version leaves the old one serving, with the reason.
        """
        with self._changes:
            self._serve(name, entry, load_id, contextlib.nullcontext())

    def _serve(
        self,
        name: str,
        entry: ModelEntry,
        load_id: str,
        changing: contextlib.AbstractContextManager[Any],
    ) -> None:
        """``serve``'s work; ``changing`` is taken around each change of the host's
        state (nothing, where the caller holds the lock for the whole of it)."""
        with changing:
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
            with changing:
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
        with changing:
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
            len(batchers),
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

    def resident(self) -> list[str]:
        """The models with versions loaded here now."""
        return [n for n, m in list(self.models.items()) if m.versions]

    def standby(self) -> list[str]:
        """The models waiting here for work to load them (--model-memory-budget)."""
        return [n for n, m in list(self.models.items()) if m.standby]

    def evict(self, name: str) -> None:
        """Unload ``name`` to make room, leaving it on standby: its batches finish and
        what it held goes back to the queue, for when it is loaded again."""
        with self._changes:
            old = self.models.get(name)
            if old is None or not old.versions:
                return
            self.models[name] = LoadedModel(name, planned=sorted(old.versions), standby=True)
            self.report()
            self._retire(old)

    def refuse(self, name: str, reason: str) -> None:
        """``name`` cannot be resident here: unavailable, with ``reason``."""
        with self._changes:
            self.models[name] = LoadedModel(name, reason=reason)
            log.error("model '%s' is unavailable: %s", name, reason)
            self.report()

    def _on_batch(self, model: str, counts: dict[str, int]) -> None:
        self.telemetry.add(model, counts)
        if self.residency is not None:
            self.residency.used(model)

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
        loading.unload(old.name, (b for backends in old.versions.values() for b in backends))

    def _load(self, entry: ModelEntry) -> tuple[dict[int, list[Backend]], list[Instance]]:
        """Every instance of ``entry`` loaded and warmed up, with its drain loop (not
        started): threads here, or children of this worker (``--instance-form``)."""
        specs = entry.instances()
        if self._form(entry) is InstanceForm.PROCESS:
            return {v: [] for v in entry.versions}, self._launch(entry, specs)
        slots: list[dict[int, Backend]] = []
        try:
            for spec in specs:
                slots.append(loading.load_backends(entry, spec, self.bls))
        except Exception:
            for loaded in slots:
                loading.unload(entry.name, loaded.values())
            raise
        versions = {v: [slot[v] for slot in slots] for v in entry.versions}
        sequencer = Sequencer() if instance.ordered(entry) else None
        # Built at each load: the rate limiter's counts are settled only once start() has
        # read the repository.
        worker = WorkerParts(
            client=self.client,
            settings=self.settings,
            worker_id=self.worker_id,
            inflight=self.inflight,
            on_batch=self._on_batch,
            on_send=self.metrics.queue,
            limiter=self.limiter,
        )
        loops: list[Instance] = [
            instance.drain_loop(entry, slot, spec, worker, sequencer=sequencer)
            for slot, spec in zip(slots, specs, strict=True)
        ]
        return versions, loops

    def _form(self, entry: ModelEntry) -> InstanceForm:
        """How ``entry``'s instances run: its config's ``instance_form`` parameter, else
        ``--instance-form``; threads for a model that preserves ordering (its replies are
        ordered across its instances in one process) or where no child can be spawned."""
        param = entry.config.parameters.get(INSTANCE_FORM_PARAMETER)
        text = param.string_value.strip().lower() if param is not None else ""
        try:
            form = InstanceForm(text) if text else self.settings.instance_form
        except ValueError:
            raise ModelLoadError(
                f"model '{entry.name}': parameter {INSTANCE_FORM_PARAMETER} must be one of "
                f"{', '.join(f.value for f in InstanceForm)}, not '{text}'"
            ) from None
        if form is InstanceForm.PROCESS and instance.ordered(entry):
            log.info(
                "model '%s' preserves ordering: its instances run as threads of one worker",
                entry.name,
            )
            return InstanceForm.THREAD
        if form is InstanceForm.PROCESS and self.instance_main is None:
            return InstanceForm.THREAD
        return form

    def _launch(self, entry: ModelEntry, specs: list[InstanceSpec]) -> list[Instance]:
        """One child per instance, all loading at once; a load error stops them all."""
        assert self.instance_main is not None
        children = [
            InstanceProcess(
                InstancePlan.of(self.settings, self.worker_id, entry, spec),
                self.instance_main,
                on_batch=self.telemetry.add,
            )
            for spec in specs
        ]
        try:
            for child in children:
                child.launch()
            for child in children:
                child.wait_loaded()
        except BaseException:
            for child in children:
                child.stop()
            for child in children:
                child.join(timeout=KILL_AFTER_S)
            raise
        return list(children)

    def _states(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, m in list(self.models.items()):
            versions = {str(v): worker_reports.READY for v in m.versions}
            if m.standby:
                versions = {str(v): worker_reports.STANDBY for v in m.planned}
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

    def _process_instances(self) -> list[dict[str, Any]]:
        """The process instances serving now, with their memory, for the report."""
        children = [
            b
            for m in list(self.models.values())
            for b in m.batchers
            if isinstance(b, InstanceProcess)
        ]
        if not children:
            return []
        gpu = self.host_metrics.gpu_memory() if self.host_metrics.gpu is not None else None
        out = []
        for child in children:
            memory = child.memory(gpu)
            if memory is not None:
                out.append(
                    {
                        **memory.to_dict(),
                        "metrics_id": child.plan.metrics_id,
                        "restarts": child.restarts,
                    }
                )
        return out

    def report(self) -> None:
        """Publish this worker's model states for the gateways, with its telemetry and its
        host's CPU and GPU use, and refresh its models' custom metrics."""
        stats = self.telemetry.snapshot()
        host = self.host_metrics.sample()
        instances = self._process_instances()
        with self._report_lock:
            if self._reporting:
                worker_reports.publish(
                    self.client,
                    self.worker_id,
                    self._states(),
                    stats=stats,
                    host=host,
                    instances=instances,
                    ttl_s=worker_reports.REPORT_TTL_S,
                )
                pipe = self.client.pipeline(transaction=False)
                self.metrics.queue(pipe, refresh=True)
                if len(pipe):
                    pipe.execute()

    def stop(self) -> None:
        """Finish the batches in progress, hand back what is held, unload, withdraw."""
        if self.residency is not None:
            self.residency.stop()
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
