"""A model instance in a process of its own: the child's half of ``--instance-form process``.

Triton's Python backend runs each instance in a stub process; conch does the same for any
backend when asked, for the same reason: each process has its own interpreter and GIL, so a
model's instances run their Python (decoding, the backend's own code, encoding, replies) on
as many cores as the host has, where threads of one worker share one. The child does what
a thread instance does, with nothing routed through its worker: it loads its backends
(every version, warmed up), pops the model's queue and sends the replies straight to and
from Redis, and touches the tags it holds so that they are not restored while it runs
them. What the worker needs to know travels over a pipe (``InstanceEvent``): loaded or
failed, then the batches' counts for the worker's telemetry; the worker answers with
``start`` (switch to the new instance) and ``stop`` (finish the batch, hand back what is
held, unload, exit). A pipe that closes means the worker is gone: the child stops the same
way. SIGINT is ignored (a terminal's Ctrl-C reaches the whole process group; the worker
stops its children itself), SIGTERM stops it as ``stop`` does.

The parent's half, which starts, watches and restarts the child, is
``conch.worker.instance_supervisor``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from enum import StrEnum
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import redis

from conch.backends import loading
from conch.backends.base import BlsPort, InstanceSpec
from conch.core.errors import ConchError
from conch.core.model_config import new_config
from conch.core.repository import ModelEntry
from conch.settings import Settings
from conch.wire import broker, worker_reports
from conch.worker import instance, rate_limiter
from conch.worker.batcher import InFlight
from conch.worker.loop_parts import WorkerParts
from conch.worker.metrics_publisher import MetricsPublisher
from conch.worker.sequence_batcher import SequenceBatcher
from conch.worker.telemetry import WorkerTelemetry

log = logging.getLogger(__name__)

COUNTS_S = 0.25  # how often the batches' counts go to the worker, when there are any


class Command(StrEnum):
    """What the worker tells its child."""

    START = "start"  # drain the queue (the model has switched to this instance)
    STOP = "stop"  # finish, hand back, unload, exit


class Event(StrEnum):
    """What the child tells its worker."""

    LOADED = "loaded"
    FAILED = "failed"  # with "reason"
    COUNTS = "counts"  # with "counts": the batches' counts since the last ones


@dataclass(frozen=True)
class InstancePlan:
    """Everything a child needs to run one instance, sent whole when it is spawned.

    The model's config travels as Triton's serialized ``ModelConfig`` (the worker read it:
    the child serves exactly what was loaded, even if the repository changes meanwhile).
    """

    settings: Settings
    worker_id: str
    model: str
    path: Path
    config: bytes
    versions: tuple[int, ...]
    backend: str
    instance: InstanceSpec
    output_labels: dict[str, list[str]] = field(default_factory=dict)
    generation: int = 0  # 0 at load; each restart after a death adds one

    @classmethod
    def of(
        cls, settings: Settings, worker_id: str, entry: ModelEntry, spec: InstanceSpec
    ) -> InstancePlan:
        return cls(
            settings=settings,
            worker_id=worker_id,
            model=entry.name,
            path=entry.path,
            config=entry.config.SerializeToString(),
            versions=tuple(entry.versions),
            backend=entry.backend,
            instance=spec,
            output_labels=dict(entry.output_labels),
        )

    def entry(self) -> ModelEntry:
        config = new_config()
        config.ParseFromString(self.config)
        return ModelEntry(
            self.model,
            self.path,
            config=config,
            versions=list(self.versions),
            backend=self.backend,
            output_labels=dict(self.output_labels),
        )

    @property
    def metrics_id(self) -> str:
        """Where the child's custom metrics live (``conch.wire.model_metrics``): its own
        key, since its models' registry is its own; the worker's report names it."""
        return f"{self.worker_id}/{self.model}/{self.instance.name}"


def send(conn: Connection, event: Event, **fields: Any) -> None:
    conn.send_bytes(json.dumps({"event": str(event), **fields}).encode())


def order(conn: Connection, command: Command) -> None:
    conn.send_bytes(json.dumps({"do": str(command)}).encode())


def read(conn: Connection) -> dict[str, Any]:
    """One message from the other end, as JSON: the pipe never carries pickles."""
    message = json.loads(conn.recv_bytes())
    if not isinstance(message, dict):
        raise ValueError(f"not an instance message: {message!r}")
    return message


def serve(plan: InstancePlan, conn: Connection, *, client: redis.Redis, bls: BlsPort | None) -> int:
    """Run one instance until told to stop (or the worker goes away); the exit status."""
    stopping = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    entry = plan.entry()
    name = f"{plan.model}/{plan.instance.name}"
    try:
        backends = loading.load_backends(entry, plan.instance, bls)
    except Exception as exc:
        reason = (
            exc.message
            if isinstance(exc, ConchError)
            else f"model '{plan.model}' failed to load: {type(exc).__name__}: {exc}"
        )
        if not isinstance(exc, ConchError):
            log.exception("instance %s failed to load", name)
        send(conn, Event.FAILED, reason=reason)
        return 1
    send(conn, Event.LOADED, pid=os.getpid())
    try:
        if _wait_for(conn, stopping) is Command.START:
            _drain(plan, entry, backends, conn, client, stopping)
    finally:
        loading.unload(plan.model, backends.values())
    return 0


def _wait_for(conn: Connection, stopping: threading.Event) -> Command:
    """The worker's next command; STOP when the pipe closes or SIGTERM comes."""
    while not stopping.is_set():
        if conn.poll(0.2):
            try:
                return Command(read(conn).get("do"))
            except (EOFError, OSError, ValueError):
                return Command.STOP
    return Command.STOP


def _drain(
    plan: InstancePlan,
    entry: ModelEntry,
    backends: dict[int, Any],
    conn: Connection,
    client: redis.Redis,
    stopping: threading.Event,
) -> None:
    inflight = InFlight()
    counts = WorkerTelemetry()
    metrics = MetricsPublisher(plan.metrics_id, ttl_s=worker_reports.REPORT_TTL_S)
    loop = instance.drain_loop(
        entry,
        backends,
        plan.instance,
        WorkerParts(
            client=client,
            settings=plan.settings,
            worker_id=plan.worker_id,
            inflight=inflight,
            on_batch=counts.add,
            on_send=metrics.queue,
            limiter=rate_limiter.fleet_limiter(plan.settings, client),
        ),
    )
    if plan.generation and isinstance(loop, SequenceBatcher):
        loop.release_own()  # sequences the instance's earlier life held when it died
    loop.start()
    beats = threading.Thread(
        target=_beat,
        args=(plan, client, inflight, metrics, counts, conn, stopping),
        name="instance-heartbeat",
        daemon=True,
    )
    beats.start()
    try:
        _wait_for(conn, stopping)  # STOP: asked, SIGTERM, or the worker is gone
    finally:
        loop.stop()
        loop.join(timeout=60)
        stopping.set()
        beats.join(timeout=worker_reports.HEARTBEAT_S * 2)
        _send_counts(conn, counts)


def _beat(
    plan: InstancePlan,
    client: redis.Redis,
    inflight: InFlight,
    metrics: MetricsPublisher,
    counts: WorkerTelemetry,
    conn: Connection,
    stopping: threading.Event,
) -> None:
    """Send the counts every ``COUNTS_S``; every heartbeat, touch the tags held (so they
    are not restored to another worker) and refresh the custom metrics' key."""
    beats = max(1, round(worker_reports.HEARTBEAT_S / COUNTS_S))
    tick = 0
    while not stopping.wait(COUNTS_S):
        _send_counts(conn, counts)
        tick += 1
        if tick % beats:
            continue
        try:
            broker.touch(client, inflight.snapshot())
            pipe = client.pipeline(transaction=False)
            metrics.queue(pipe, refresh=True)
            if len(pipe):
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("instance heartbeat failed: %s", exc)


def _send_counts(conn: Connection, counts: WorkerTelemetry) -> None:
    taken = counts.take()
    if taken:
        with contextlib.suppress(OSError):  # the worker is gone; the loop is stopping
            send(conn, Event.COUNTS, counts=taken)
