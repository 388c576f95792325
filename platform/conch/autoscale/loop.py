"""``conch autoscale``: every ``--scale-poll-secs``, read the work the group's models owe,
decide how many workers to run, and start or retire them.

The group is the models its workers serve (``--models``; without it, every model in the
repository), and with ``--jobs`` the batch jobs queue. One group takes the jobs and counts
them (``--jobs``), or a job waits while that group is at zero; the others run with
``--batch-jobs=false``, or one of their workers could be retired mid-job. Its workers are
``conch worker`` processes, started with this command's own settings
(``settings.to_args(Role.WORKER)``), so a flag given to the autoscaler (``--batch-jobs``
too) reaches every worker it starts. While Redis cannot be read the pool keeps its size: nothing is
retired on a signal that is not there. SIGTERM or SIGINT retires every worker, waits for
them, and exits.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

import redis

from conch.autoscale.pool import EXIT_MARGIN_S, WorkerPool
from conch.autoscale.scaler import ScalePolicy, Scaler
from conch.core.repository_keys import is_model_name
from conch.settings import Role, Settings
from conch.wire.redis_client import open_client
from conch.wire.work_owed import JobsWork, ModelWork, jobs_owed, work_owed

log = logging.getLogger("conch.autoscale")


def worker_command(settings: Settings) -> list[str]:
    """The command line of one worker of this group."""
    return [sys.executable, "-m", "conch", Role.WORKER.value, *settings.to_args(Role.WORKER)]


def group_models(settings: Settings) -> list[str]:
    """The models whose work the group's workers owe: ``--models``, or every model folder
    of the repository, listed again on every poll (a model that exists only through a
    load request's ``file:`` parameters needs ``--models``)."""
    if settings.models:
        return list(settings.models)
    names: set[str] = set()
    for repository in settings.repository_folders:
        try:
            names |= {p.name for p in repository.iterdir() if is_model_name(p.name) and p.is_dir()}
        except OSError as exc:
            log.warning("cannot list %s: %s", repository, exc)
    return sorted(names)


class Autoscaler:
    """One group's control loop: the signal in, the pool resized (``tick``)."""

    def __init__(self, settings: Settings, client: redis.Redis, pool: WorkerPool) -> None:
        self.settings = settings
        self.client = client
        self.pool = pool
        self.scaler = Scaler(ScalePolicy.from_settings(settings))
        self._redis_away = False

    def owed(self) -> int | None:
        """The group's work owed now; None while Redis cannot be read."""
        try:
            work: list[ModelWork | JobsWork] = [
                *work_owed(self.client, group_models(self.settings)).values()
            ]
            if self.settings.scale_on_jobs:
                work.append(jobs_owed(self.client))
        except redis.RedisError as exc:
            if not self._redis_away:
                log.warning(
                    "cannot read the queues (%s); keeping %d worker(s)", exc, self.pool.size
                )
            self._redis_away = True
            return None
        if self._redis_away:
            log.info("the queues can be read again")
        self._redis_away = False
        return sum(w.owed for w in work)

    def tick(self) -> None:
        self.pool.reap()
        owed = self.owed()
        if owed is None:
            count = max(self.pool.size, self.scaler.policy.minimum)
        else:
            count = self.scaler.decide(owed, time.monotonic())
            if count != self.pool.size:
                log.info("work owed %d: %d -> %d worker(s)", owed, self.pool.size, count)
        self.pool.resize(count)


def run(settings: Settings) -> int:
    """Run the group's workers until SIGTERM or SIGINT; then retire them all."""
    policy = ScalePolicy.from_settings(settings)
    pool = WorkerPool(
        worker_command(settings),
        env={**os.environ, **settings.child_env(Role.WORKER)},
        grace_s=settings.exit_timeout_secs + EXIT_MARGIN_S,
    )
    scaler = Autoscaler(settings, open_client(settings.redis_url), pool)
    stopping = threading.Event()

    def _stop(_signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info(
        "autoscaling %d to %d worker(s) for %s: ceil(owed / %g), activation %d, "
        "cooldown %g s, every %g s",
        policy.minimum,
        policy.maximum,
        (", ".join(settings.models) if settings.models else "every model")
        + (" and batch jobs" if settings.scale_on_jobs else ""),
        policy.target_per_worker,
        policy.activation,
        policy.cooldown_s,
        settings.scale_poll_secs,
    )
    try:
        while not stopping.is_set():
            scaler.tick()
            stopping.wait(settings.scale_poll_secs)
    finally:
        log.info("stopping: retiring %d worker(s)", pool.size)
        pool.stop()
    return 0


__all__ = ["Autoscaler", "group_models", "run", "worker_command"]
