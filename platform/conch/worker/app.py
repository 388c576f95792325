"""``conch worker``: a Celery worker that loads models and drains their queues in batches.

Celery provides the process: signals and warm shutdown, remote control, logging, and
kombu's visibility-timeout restore of messages a dead worker held. conch adds one
bootstep, ``ModelServing``, that loads the repository's models and runs a ``Batcher``
per model instance; Celery's own one-message consumer never touches the model queues.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from celery import Celery, bootsteps
from celery.exceptions import Ignore

from conch.backends import Backend, backend_class
from conch.backends.completion import complete
from conch.core import ensemble_graph
from conch.core.errors import ConchError, ModelLoadError
from conch.frontend import batch_job, bls
from conch.settings import Settings
from conch.wire import broker, control_bus, job_store, worker_reports
from conch.worker.batcher import REPLY_TTL_S, Batcher, BatchPolicy, InFlight, Sequencer
from conch.worker.warmup import run_warmup

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.5


@dataclass
class LoadedModel:
    name: str
    versions: dict[int, list[Backend]] = field(default_factory=dict)  # version -> instances
    reason: str | None = None
    loading: bool = False
    planned: list[int] = field(default_factory=list)  # versions being loaded
    batchers: list[Batcher] = field(default_factory=list)
    load_id: str = ""  # the load command this state answers (explicit mode)


class ModelHost:
    """Loads models, runs their batchers, reports them in the registry, and follows
    repository changes and load/unload commands (``--model-control-mode``)."""

    def __init__(self, settings: Settings, worker_id: str) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.client = redis.Redis.from_url(settings.redis_url)
        self.inflight = InFlight()
        self.models: dict[str, LoadedModel] = {}
        self._stop = threading.Event()
        self.stats: dict[str, dict[str, int]] = {}  # model -> executions, requests, rows
        self._stats_lock = threading.Lock()
        self._heartbeat: threading.Thread | None = None
        self._control: control_bus.Subscriber | None = None
        self._changes = threading.Lock()  # one load/unload at a time
        self._fingerprints: dict[str, Any] = {}
        self.repository = control_bus.open_repository(settings, self.client, complete=complete)
        # Python models' BLS calls (pb_utils.InferenceRequest.exec) go through this worker:
        # every model spec the host builds carries this port (ModelSpec.bls).
        self.bls = bls.BlsClient(settings, self.repository, client=self.client)

    def _wanted(self, entries: dict[str, Any]) -> list[str]:
        """The models this worker should serve now."""
        names = [n for n, e in sorted(entries.items()) if e.backend != ensemble_graph.ENSEMBLE]
        if self.settings.models:
            names = [n for n in names if n in self.settings.models]
        if self.settings.model_control_mode == "explicit":
            chosen = set(self.settings.load_models) | control_bus.loaded_models(self.client)
            if "*" not in chosen:
                names = [n for n in names if n in chosen]
        return names

    def start(self) -> None:
        entries = self.repository.scan()
        for missing in sorted(set(self.settings.models or ()) - set(entries)):
            log.error(
                "model '%s' asked for with --models is not in %s",
                missing,
                self.settings.model_repository,
            )
        # Ensembles have no queue of their own: gateways run their steps.
        wanted = self._wanted(entries)
        for name in wanted:
            self.models[name] = LoadedModel(
                name, loading=True, planned=list(entries[name].versions)
            )
        self._publish()  # LOADING, so readiness and the index say so while models load
        self._heartbeat = threading.Thread(target=self._beat, name="conch-heartbeat", daemon=True)
        self._heartbeat.start()
        explicit = self.settings.model_control_mode == "explicit"
        for name in wanted:
            load_id = control_bus.last_load_id(self.client, name) if explicit else ""
            self.serve(name, entries[name], load_id=load_id)
        if self.settings.model_control_mode != "none":
            self._control = control_bus.Subscriber(
                self.client,
                self._on_message,
                self._on_tick,
                tick_s=self.settings.repository_poll_secs,
            )
            self._control.start()

    # -- following the repository and the API --------------------------------------------
    def _on_message(self, channel: str, payload: dict[str, Any]) -> None:
        model = payload.get("model")
        if not isinstance(model, str):
            return
        if channel == control_bus.COMMANDS:
            if self.settings.model_control_mode != "explicit":
                return
            if payload.get("action") == "unload":
                self.withdraw(model)
            elif payload.get("action") == "load":
                self.reload(model, load_id=str(payload.get("id", "")))
        elif channel == control_bus.EVENTS and self.settings.model_control_mode == "poll":
            self.reload(model)

    def _on_tick(self, generation_changed: bool) -> None:
        """Poll mode rescans the repository; any mode catches up on missed commands."""
        if self.settings.model_control_mode == "poll":
            entries = self.repository.scan()
            for name in self._wanted(entries):
                if self._fingerprint(name) != self._fingerprints.get(name):
                    self.reload(name)
            for name in [n for n in self.models if n not in entries]:
                self.withdraw(name)
        elif self.settings.model_control_mode == "explicit" and generation_changed:
            wanted = set(self._wanted(self.repository.scan()))
            for name in wanted - set(self.models):  # a load command this worker missed
                self.reload(name, load_id=control_bus.last_load_id(self.client, name))
            for name in [n for n in self.models if n not in wanted]:
                self.withdraw(name)

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

    def serve(self, name: str, entry: Any, *, load_id: str = "") -> None:
        """Load ``entry`` beside what serves ``name`` now, then switch and drain the old.

        A broken new config or version leaves the old one serving, with the reason.
        """
        with self._changes:
            self._fingerprints[name] = self._fingerprint(name)
            current = self.models.get(name)
            if current is None or not current.versions:
                current = self.models[name] = LoadedModel(name, planned=list(entry.versions))
            current.loading, current.load_id = True, load_id
            self._publish()
            try:
                if entry.error or entry.config is None:
                    raise ModelLoadError(entry.error or "no config")
                versions, batchers = self._load(entry)
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
                self._publish()
                return
            old = self.models[name]
            self.models[name] = LoadedModel(
                name, versions=versions, batchers=batchers, load_id=load_id
            )
            for b in batchers:
                b.start()
            self._publish()
            self._retire(old)
            log.info(
                "model '%s' versions %s ready with %d instance(s)",
                name,
                sorted(versions),
                len(next(iter(versions.values()), [])),
            )

    def withdraw(self, name: str) -> None:
        with self._changes:
            old = self.models.pop(name, None)
            self.models[name] = LoadedModel(name, reason="unloaded")
            self._publish()
            if old is not None:
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

    def _load(self, entry: Any) -> tuple[dict[int, list[Backend]], list[Batcher]]:
        cls = backend_class(entry.backend)
        specs = entry.instances()
        versions: dict[int, list[Backend]] = {}
        try:
            for version in entry.versions:
                versions[version] = instances = []
                for spec in specs:
                    backend = cls(replace(entry.spec(version), bls=self.bls), spec)
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
                on_batch=self._count,
                sequencer=sequencer,
            )
            for k, spec in enumerate(specs)
        ]
        return versions, batchers

    def _count(self, model: str, batch: dict[str, int]) -> None:
        """Counters per model (what the gateways' /metrics add up over workers)."""
        with self._stats_lock:
            st = self.stats.setdefault(model, {})
            for key, value in batch.items():
                st[key] = st.get(key, 0) + value

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

    def _publish(self) -> None:
        with self._stats_lock:
            stats = {m: dict(st) for m, st in self.stats.items()}
        worker_reports.publish(
            self.client, self.worker_id, self._states(), stats=stats, ttl_s=HEARTBEAT_S * 4
        )

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                broker.touch(self.client, self.inflight.snapshot())
                self._publish()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)

    def stop(self) -> None:
        """Finish the batches in progress, hand back what is held, unload, withdraw."""
        if self._control is not None:
            self._control.stop()
        with self._changes:
            models = list(self.models.values())
            for m in models:
                for b in m.batchers:
                    b.stop()
            self._stop.set()
            for m in models:
                self._retire(m)
        with contextlib.suppress(redis.RedisError):
            worker_reports.withdraw(self.client, self.worker_id)


class ModelServing(bootsteps.StartStopStep):
    """The worker bootstep that owns the ModelHost."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.host: ModelHost | None = None

    def start(self, worker: Any) -> None:
        settings: Settings = worker.app.conch_settings
        self.host = ModelHost(settings, worker_id=f"{socket.gethostname()}.{os.getpid()}")
        self.host.start()

    def stop(self, worker: Any) -> None:
        if self.host is not None:
            self.host.stop()
            self.host = None

    shutdown = stop


def make_celery(settings: Settings) -> Celery:
    app = Celery("conch", broker=settings.redis_url, set_as_current=False)
    vt = settings.visibility_timeout_s
    app.conf.update(
        accept_content=["msgpack", "json"],
        result_accept_content=["msgpack", "json"],
        task_serializer="msgpack",
        task_default_queue=broker.JOBS_QUEUE,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": vt,
            # kombu sweeps unacked messages every interval * throttle seconds.
            "unacked_restore_interval": max(1, int(vt / 3)),
            "unacked_restore_throttle": 1,
            # conch's priority sub-lists, so kombu restores each message to its own.
            "priority_steps": list(broker.PRIORITY_STEPS),
        },
    )
    app.conch_settings = settings
    app.steps["worker"].add(ModelServing)
    _register_jobs(app, settings)
    return app


def _register_jobs(app: Celery, settings: Settings) -> None:
    """Offline batch jobs run as Celery tasks; their results live in Celery's backend."""
    app.conf.update(
        result_backend=settings.redis_url,
        result_serializer="msgpack",
        result_expires=settings.job_ttl_s,
        task_track_started=True,
    )
    # The worker's own view, overrides included: a job on a model loaded with a config
    # or file: override reads the model the gateway accepted it for.
    repository = control_bus.open_repository(
        settings, redis.Redis.from_url(settings.redis_url), complete=complete
    )

    @app.task(name=batch_job.TASK_NAME)
    def run_batch_job(payload: dict[str, Any]) -> dict[str, Any]:
        job_id = job_store.check_id(str(payload.get("id", "")))
        client = redis.Redis.from_url(settings.redis_url)
        # Keep kombu from restoring the task's message while it runs (its delivery tag
        # is the job id), however long the job or one of its uploads takes.
        # And its reply list from expiring while the job is busy elsewhere (a slow read).
        done = threading.Event()
        reply_key = batch_job.new_reply_key(job_id)

        def keepalive() -> None:
            while not done.wait(min(1.0, settings.visibility_timeout_s / 3)):
                with contextlib.suppress(redis.RedisError):
                    broker.touch(client, [job_id])
                    client.expire(reply_key, REPLY_TTL_S)

        threading.Thread(target=keepalive, name=f"job-{job_id[:8]}", daemon=True).start()
        try:
            return batch_job.run(
                client,
                job_id,
                repository.read_model,
                max_line_bytes=settings.max_input_bytes,
                reply_key=reply_key,
            )
        except job_store.JobCancelled:
            job_store.revoke(client, job_id, settings.job_ttl_s)
            raise Ignore() from None  # Celery keeps the REVOKED state written above
        finally:
            done.set()


def run(settings: Settings, *, loglevel: str = "INFO") -> None:
    app = make_celery(settings)
    app.worker_main(
        argv=[
            "worker",
            "--pool=threads",
            "--concurrency=1",
            f"--loglevel={loglevel}",
            f"--queues={broker.JOBS_QUEUE}",
            f"--hostname=conch@{socket.gethostname()}.{os.getpid()}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
