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
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery, bootsteps

from . import broker, ensemble, registry
from .backends import Backend, backend_class
from .batcher import Batcher, BatchPolicy, InFlight, Sequencer
from .errors import ConchError, ModelLoadError
from .repository import ModelRepository
from .settings import Settings
from .warmup import run_warmup

log = logging.getLogger(__name__)

JOBS_QUEUE = "conch.jobs"
HEARTBEAT_S = 1.5


@dataclass
class LoadedModel:
    name: str
    versions: dict[int, list[Backend]] = field(default_factory=dict)  # version -> instances
    reason: str | None = None
    loading: bool = False
    planned: list[int] = field(default_factory=list)  # versions being loaded


class ModelHost:
    """Loads models, runs their batchers, and reports them in the registry."""

    def __init__(self, settings: Settings, worker_id: str) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.client = redis.Redis.from_url(settings.redis_url)
        self.inflight = InFlight()
        self.models: dict[str, LoadedModel] = {}
        self.batchers: list[Batcher] = []
        self._stop = threading.Event()
        self.stats: dict[str, dict[str, int]] = {}  # model -> executions, requests, rows
        self._stats_lock = threading.Lock()
        self._heartbeat: threading.Thread | None = None

    def start(self) -> None:
        repo = ModelRepository(
            self.settings.model_repository,
            auto_complete=self.settings.auto_complete,
            default_max_batch_size=self.settings.default_max_batch_size,
        )
        entries = repo.scan()
        wanted = self.settings.models
        if wanted:
            for missing in sorted(set(wanted) - set(entries)):
                log.error(
                    "model '%s' asked for with --models is not in %s",
                    missing,
                    self.settings.model_repository,
                )
        # Ensembles have no queue of their own: gateways run their steps.
        chosen = {
            n: e
            for n, e in sorted(entries.items())
            if (not wanted or n in wanted) and e.backend != ensemble.ENSEMBLE
        }
        for name in chosen:
            self.models[name] = LoadedModel(name, loading=True, planned=list(chosen[name].versions))
        self._publish()  # LOADING, so readiness and the index say so while models load
        self._heartbeat = threading.Thread(target=self._beat, name="conch-heartbeat", daemon=True)
        self._heartbeat.start()
        for name, entry in chosen.items():
            loaded = self.models[name]
            try:
                if entry.error or entry.config is None:
                    raise ModelLoadError(entry.error or "no config")
                self._load(entry, loaded)
            except ConchError as exc:
                loaded.reason = exc.message
                log.error("model '%s' is unavailable: %s", name, exc.message)
            except Exception as exc:  # a backend's own failure: this model only
                loaded.reason = f"model '{name}' failed to load: {type(exc).__name__}: {exc}"
                log.exception("model '%s' failed to load", name)
            finally:
                loaded.loading = False
            self._publish()

    def _load(self, entry: Any, loaded: LoadedModel) -> None:
        cls = backend_class(entry.backend)
        specs = entry.instances()
        versions: dict[int, list[Backend]] = {}
        try:
            for version in entry.versions:
                versions[version] = instances = []
                for spec in specs:
                    backend = cls(entry.spec(version), spec)
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
        loaded.versions = versions
        policy = BatchPolicy.from_config(entry.config)
        cfg = entry.config
        ordered = cfg.HasField("dynamic_batching") and cfg.dynamic_batching.preserve_ordering
        sequencer = Sequencer() if ordered else None
        for k, spec in enumerate(specs):
            batcher = Batcher(
                client=self.client,
                model=entry.name,
                backends={v: inst[k] for v, inst in loaded.versions.items()},
                policy=policy,
                inflight=self.inflight,
                max_attempts=self.settings.max_attempts,
                name=f"batcher-{spec.name}",
                on_batch=self._count,
                sequencer=sequencer,
            )
            self.batchers.append(batcher)
            batcher.start()
        log.info(
            "model '%s' versions %s ready with %d instance(s)",
            entry.name,
            entry.versions,
            len(specs),
        )

    def _count(self, model: str, requests: int, rows: int) -> None:
        with self._stats_lock:
            st = self.stats.setdefault(model, {"executions": 0, "requests": 0, "rows": 0})
            st["executions"] += 1
            st["requests"] += requests
            st["rows"] += rows

    def _states(self) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "versions": {
                    str(v): registry.LOADING if m.loading else registry.READY
                    for v in (m.planned if m.loading else m.versions)
                },
                "reason": m.reason,
                "loading": m.loading,
            }
            for name, m in self.models.items()
        }

    def _publish(self) -> None:
        with self._stats_lock:
            stats = {m: dict(st) for m, st in self.stats.items()}
        registry.publish(
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
        for b in self.batchers:
            b.stop()
        for b in self.batchers:
            b.join(timeout=60)
        self._stop.set()
        with contextlib.suppress(redis.RedisError):
            registry.withdraw(self.client, self.worker_id)
        for m in self.models.values():
            for instances in m.versions.values():
                for backend in instances:
                    backend.unload()


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
        task_default_queue=JOBS_QUEUE,
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
    return app


def run(settings: Settings, *, loglevel: str = "INFO") -> None:
    app = make_celery(settings)
    app.worker_main(
        argv=[
            "worker",
            "--pool=threads",
            "--concurrency=1",
            f"--loglevel={loglevel}",
            f"--queues={JOBS_QUEUE}",
            f"--hostname=conch@{socket.gethostname()}.{os.getpid()}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
