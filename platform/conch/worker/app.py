"""``conch worker``: a Celery worker that loads models and drains their queues in batches.

Celery provides the process: signals and warm shutdown, remote control, logging, and
kombu's visibility-timeout restore of messages a dead worker held. conch adds three
bootsteps (``conch.worker.steps``: Heartbeat, ModelServing, ControlFollower) around a
``ModelHost`` that runs a ``Batcher`` per model instance, each draining its model's queue
into that instance of every loaded version; Celery's own one-message consumer never
touches the model queues, only ``conch.jobs``, where batch jobs run as Celery tasks. A
worker started with ``--batch-jobs=false`` excludes that queue too (Celery's
``--exclude-queues``), so its consumer takes nothing; a fourth step (RestoreSweep) then
runs kombu's restore of dead workers' messages, which only a consuming consumer runs.

This module is the worker's composition root: the one place that builds the host's
collaborators (the Redis client, the repository, the BLS client from the frontend room)
and registers the tasks.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import uuid
from multiprocessing.connection import Connection
from typing import Any

from celery import Celery, signals

from conch import server_log
from conch.backends.completion import complete
from conch.core import tracing
from conch.frontend import bls
from conch.frontend.jobs import tasks as job_tasks
from conch.settings import Settings
from conch.wire import broker, control_bus, log_control, trace_control
from conch.wire.redis_client import open_client
from conch.wire.redis_url import celery_url
from conch.worker import process_instance, steps
from conch.worker.host import ModelHost
from conch.worker.process_instance import InstancePlan

log = logging.getLogger(__name__)


def worker_name() -> str:
    """This worker's id in Redis (its report, its custom metrics) and its Celery node name.

    Host name and pid say where to look for it; the random part keeps it unique where
    those two repeat: containers that share a host's name (host networking) each run
    their worker as the same pid, often 1.
    """
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


def transport_options(settings: Settings) -> dict[str, Any]:
    """kombu's Redis transport options: how held messages of a dead worker come back."""
    vt = settings.visibility_timeout_s
    return {
        "visibility_timeout": vt,
        # kombu sweeps unacked messages every interval * throttle seconds.
        "unacked_restore_interval": max(1, int(vt / 3)),
        "unacked_restore_throttle": 1,
        # The lock one sweep holds (kombu's default: 300 s). A worker whose host dies in
        # the middle of its sweep never releases it, and until it expires no worker
        # restores anything: let that cost no more than one visibility timeout. A sweep
        # takes milliseconds, and two at once are safe (each restore is a transaction).
        "unacked_mutex_expire": vt,
        # conch's priority sub-lists, so kombu restores each message to its own.
        "priority_steps": list(broker.PRIORITY_STEPS),
    }


def make_celery(settings: Settings, name: str) -> Celery:
    """The worker's Celery app; ``name`` is its id (``worker_name``)."""
    app = Celery("conch", broker=celery_url(settings.redis_url), set_as_current=False)
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
        broker_transport_options=transport_options(settings),
    )
    # The steps get the host factory (and the settings through it) bound into their
    # classes here (steps.bound_steps), instead of reading back an attribute set on the
    # app (the old app.conch_settings): Celery builds steps itself, so a class made here
    # is the explicit way to say where what they need comes from.
    app.steps["worker"].update(steps.bound_steps(lambda: _make_host(settings, name)))
    _register_jobs(app, settings)
    return app


def _make_host(settings: Settings, name: str) -> ModelHost:
    """A ModelHost and its collaborators, in the worker process (from ModelServing)."""
    client = open_client(settings.redis_url)
    repository = control_bus.open_repository(settings, client, complete=complete)
    # Python models' BLS calls (pb_utils.InferenceRequest.exec) go through this worker,
    # on its view of the repository (overrides included). The host hands the port to
    # the backends it builds (ModelSpec.bls).
    port = bls.BlsClient(settings, repository, client=client)
    return ModelHost(
        settings,
        worker_id=name,
        client=client,
        repository=repository,
        bls=port,
        instance_main=run_instance,
    )


def run_instance(plan: InstancePlan, conn: Connection) -> None:
    """A process instance's child (``--instance-form process``): what ``_make_host`` builds
    for the worker, built again in the child, which has no worker around it."""
    settings = plan.settings
    server_log.configure(settings)
    tracing.start(settings.trace_config, "conch-worker")
    client = open_client(settings.redis_url)
    # The logging and trace APIs' changes reach the child as they reach its worker
    # (steps.SettingsFollower), stored ones first.
    log_control.follow(client, server_log.apply)
    trace_control.TRACING.follow(client, tracing.apply)
    repository = control_bus.open_repository(settings, client, complete=complete)
    port = bls.BlsClient(settings, repository, client=client)
    sys.exit(process_instance.serve(plan, conn, client=client, bls=port))


def _register_jobs(app: Celery, settings: Settings) -> None:
    """Batch jobs and ensembles' async jobs run as Celery tasks (``frontend.jobs.tasks``);
    a batch job's result lives in Celery's backend."""
    app.conf.update(
        result_backend=celery_url(settings.redis_url),
        result_serializer="msgpack",
        result_expires=settings.job_ttl_s,
        task_track_started=True,
    )
    client = open_client(settings.redis_url)
    # The worker's own view, overrides included: a job on a model loaded with a config
    # or file: override reads the model the gateway accepted it for.
    repository = control_bus.open_repository(settings, client, complete=complete)

    job_tasks.register(app, settings, client, repository)


class ExitDeadline:
    """Triton's ``--exit-timeout-secs`` for the worker. Celery's warm shutdown waits for
    the batches in flight and a running batch job however long they take; once the
    shutdown is ``seconds`` old the process exits anyway. What it still held is not lost:
    the broker hands it to another worker after the visibility timeout."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._timer: threading.Timer | None = None

    def arm(self, **_signal: Any) -> None:
        """Celery's ``worker_shutting_down`` receiver: the first one starts the clock."""
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True  # a shutdown that finishes in time does not wait
            self._timer.start()

    def _expire(self) -> None:
        log.error(
            "exit timeout: work still in flight %s s after shutdown began; exiting now",
            self.seconds,
        )
        logging.shutdown()  # flush the log before the hard exit
        os._exit(1)


def _keep_logging(**_signal: Any) -> None:
    """Celery's ``setup_logging`` receiver: a receiver makes Celery leave logging alone,
    so its lines go through the root logger ``conch.server_log`` set up."""


class ExitStatus:
    """The worker's exit status, as Celery set it (a bootstep that stops the start with
    ``SystemExit(1)``: ``--exit-on-error``): ``worker_main`` returns none."""

    def __init__(self) -> None:
        self.code = 0

    def shutdown(self, sender: Any = None, **_signal: Any) -> None:
        """Celery's ``worker_shutdown`` receiver: its sender is the worker."""
        self.code = int(getattr(sender, "exitcode", 0) or 0)


def run(settings: Settings, *, loglevel: str = "INFO") -> int:
    """Run the worker until it stops; its exit status."""
    name = worker_name()
    tracing.start(settings.trace_config, "conch-worker")
    app = make_celery(settings, name)
    signals.setup_logging.connect(_keep_logging, weak=False)
    signals.worker_shutting_down.connect(ExitDeadline(settings.exit_timeout_secs).arm, weak=False)
    status = ExitStatus()
    signals.worker_shutdown.connect(status.shutdown, weak=False)
    app.worker_main(
        argv=[
            "worker",
            "--pool=threads",
            f"--concurrency={settings.job_concurrency}",
            f"--loglevel={loglevel}",
            # --batch-jobs=false: the jobs queue excluded, Celery's consumer takes no
            # task at all (the model queues are the batchers'); it idles on its control
            # channel, so a group whose scaler does not count jobs never runs one.
            f"--{'queues' if settings.batch_jobs else 'exclude-queues'}={broker.JOBS_QUEUE}",
            f"--hostname=conch@{name}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
    return status.code
