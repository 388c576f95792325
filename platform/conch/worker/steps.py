"""The worker's bootsteps: conch's part of a Celery worker's start and stop, one concern each.

Modelled on Celery's own consumer steps (``celery/worker/consumer/heart.py`` and its
neighbours): each step is small, says what it needs with ``requires``, and shares what it
makes through the worker it is given, as Celery's steps put ``c.heart`` or ``w.pool``
there. Here that is ``worker.model_host``, made by ``ModelServing``.

Start order, and why:

1. ``Heartbeat``: from now on, every ``HEARTBEAT_S``, the in-flight tags are touched and
   the worker's report refreshed, so neither expires while models load (minutes, for big
   ones). The host publishes nothing before its own LOADING announcement.
2. ``ModelServing``: announces the models it will serve as LOADING, then loads them.
3. ``ControlFollower``: follows load/unload commands and repository changes;
   ``SettingsFollower``, the logging and trace APIs' changes.

``RestoreSweep`` needs nothing of the others: in a worker that takes no batch jobs, it
sweeps the messages dead workers held back to their queues, as Celery's consumer does
in the others.

Celery stops steps in the reverse order: stop following; stop reporting, let the batchers
finish and hand back, unload, withdraw the report; stop the heartbeat, which keeps the
held messages' tags fresh until the batchers have handed them back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import redis
from celery import bootsteps
from kombu.exceptions import OperationalError

from conch import server_log
from conch.core import tracing
from conch.core.errors import StartFailed
from conch.wire import broker, control_bus, log_control, outage, trace_control
from conch.worker.host import HEARTBEAT_S, ModelHost

log = logging.getLogger(__name__)


class _LoopStep(bootsteps.StartStopStep):
    """A step that runs one loop on a daemon thread of its own until the worker stops."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self, target: Callable[..., None], arg: Any, name: str) -> None:
        self._thread = threading.Thread(target=target, args=(arg,), name=name, daemon=True)
        self._thread.start()

    def stop(self, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_S * 2)
            self._thread = None

    shutdown = stop


class Heartbeat(_LoopStep):
    """Every ``HEARTBEAT_S``: touch the tags this worker holds (so kombu does not restore
    them to another worker) and refresh the worker's report (so it does not expire)."""

    def start(self, worker: Any) -> None:
        host: ModelHost = worker.model_host  # made in ModelServing.create, before any start
        self._run(self._beat, host, "conch-heartbeat")

    def _beat(self, host: ModelHost) -> None:
        # While Redis is away, beat as often as a reconnect is tried: when it comes back
        # (its in-flight index as old as the outage), the first touch must come before
        # any worker's restore sweep, or what this worker is running would run twice.
        period = HEARTBEAT_S
        while not self._stop.wait(period):
            try:
                broker.touch(host.client, host.inflight.snapshot())
                host.report()
            except redis.RedisError as exc:
                if period == HEARTBEAT_S:
                    log.warning("heartbeat failed: %s", exc)
                period = outage.RECONNECT_S
                continue
            if period != HEARTBEAT_S:
                log.info("heartbeat: Redis is back")
            period = HEARTBEAT_S


class ModelServing(bootsteps.StartStopStep):
    """Owns the worker's ModelHost: starts it (LOADING, then every model it serves) and
    stops it (batches finished, held requests handed back, models unloaded)."""

    requires = (Heartbeat,)
    make_host: ClassVar[Callable[[], ModelHost]]  # bound per app by ``bound_steps``

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        worker.model_host = None

    def create(self, worker: Any) -> None:
        worker.model_host = self.make_host()

    def start(self, worker: Any) -> None:
        try:
            worker.model_host.start()
        except StartFailed as exc:  # --exit-on-error: the worker stops, status 1
            log.error("%s", exc)
            raise SystemExit(1) from None

    def stop(self, worker: Any) -> None:
        if worker.model_host is not None:
            worker.model_host.stop()
            worker.model_host = None

    shutdown = stop


class ControlFollower(bootsteps.StartStopStep):
    """Follows ``--model-control-mode``: in poll mode, repository events and a rescan
    every ``--repository-poll-secs``; in explicit mode, load/unload commands, and a
    catch-up on commands missed while the subscription was down. Off in mode none."""

    requires = (ModelServing,)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.host: ModelHost | None = None
        self._subscriber: control_bus.Subscriber | None = None

    def start(self, worker: Any) -> None:
        host: ModelHost = worker.model_host
        if not host.settings.model_control_mode.follows_changes:
            return
        self.host = host
        self._subscriber = control_bus.Subscriber(
            host.client,
            self.on_message,
            self.on_tick,
            tick_s=host.settings.repository_poll_secs,
        )
        self._subscriber.start()

    def stop(self, worker: Any) -> None:
        if self._subscriber is not None:
            self._subscriber.stop()
            self._subscriber = None

    shutdown = stop

    def on_message(self, channel: str, payload: dict[str, Any]) -> None:
        host = self.host
        model = payload.get("model")
        if host is None or not isinstance(model, str):
            return
        mode = host.settings.model_control_mode
        if channel == control_bus.COMMANDS:
            if not mode.explicit:
                return
            if payload.get("action") == "unload":
                host.withdraw(model)
            elif payload.get("action") == "load":
                host.reload(model, load_id=str(payload.get("id", "")))
        elif channel == control_bus.EVENTS and mode.polls:
            host.reload(model)

    def on_tick(self, generation_changed: bool) -> None:
        """Poll mode rescans the repository; any mode catches up on missed commands."""
        host = self.host
        if host is None:
            return
        mode = host.settings.model_control_mode
        if mode.polls:
            entries = host.repository.scan()
            for name in host.wanted(entries):
                if host.changed_on_disk(name):
                    host.reload(name)
            for name in [n for n in host.models if n not in entries]:
                host.withdraw(name)
        elif mode.explicit and generation_changed:
            wanted = set(host.wanted(host.repository.scan()))
            for name in wanted - set(host.models):  # a load command this worker missed
                host.reload(name, load_id=control_bus.last_load_id(host.client, name))
            for name in [n for n in host.models if n not in wanted]:
                host.withdraw(name)


class SettingsFollower(bootsteps.StartStopStep):
    """Applies the logging and trace APIs' changes (``POST v2/logging``, ``POST
    v2/trace/setting`` on any gateway) to this worker, whatever the model control mode
    (``conch.wire.shared_settings``)."""

    requires = (ModelServing,)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self._subscribers: list[control_bus.Subscriber] = []

    def start(self, worker: Any) -> None:
        client = worker.model_host.client
        self._subscribers = [
            log_control.follow(client, server_log.apply),
            trace_control.TRACING.follow(client, tracing.apply),
        ]

    def stop(self, worker: Any) -> None:
        for subscriber in self._subscribers:
            subscriber.stop()
        self._subscribers = []

    shutdown = stop


class RestoreSweep(_LoopStep):
    """kombu's visibility-timeout restore, run by a worker whose Celery consumer has no
    queue (``--batch-jobs=false``).

    kombu sweeps the messages a dead worker held (the model queues' as well as the jobs')
    back to their queues, but only from a consumer that consumes something. Without this
    step, the requests a dead GPU worker held would wait for a worker of the jobs group,
    which may be at zero. It runs kombu's own sweep (``restore_visible``, on a channel of
    the app's broker connection, with the transport options the consumer would use) at
    the consumer's interval; a worker whose consumer has a queue leaves it to that.
    """

    def start(self, worker: Any) -> None:
        if worker.app.amqp.queues.consume_from:
            return  # Celery's consumer sweeps
        self._run(self._sweep, worker.app, "conch-restore-sweep")

    def _sweep(self, app: Any) -> None:
        with app.connection_for_read() as connection:
            channel = None
            period = outage.RECONNECT_S
            away = False
            while not self._stop.wait(period):
                try:
                    channel = channel or connection.channel()
                    channel.qos.restore_visible(
                        num=channel.unacked_restore_limit,
                        interval=channel.unacked_restore_throttle,
                    )
                except (redis.RedisError, OperationalError) as exc:
                    if not away:
                        log.warning("restore sweep failed: %s", exc)
                    away, period = True, outage.RECONNECT_S
                    continue
                if away:
                    log.info("restore sweep: Redis is back")
                away, period = False, channel.unacked_restore_interval


def bound_steps(make_host: Callable[[], ModelHost]) -> list[type[bootsteps.StartStopStep]]:
    """The steps to add to one Celery app's worker blueprint, with ``make_host`` bound.

    Celery builds each step itself, as ``Step(worker, **command_line_options)``, so no
    object can be handed to one. The way this used to be done, an attribute set on the
    Celery app and read back in the step (``app.conch_settings``), was a side channel no
    reader or type checker could follow. Instead each app gets its own ``ModelServing``
    with the factory as a class attribute. Celery orders steps by class, so the step that
    requires it gets a subclass naming the bound one.
    """
    serving = _subclass(ModelServing, make_host=staticmethod(make_host))
    follower = _subclass(ControlFollower, requires=(serving,))
    logs = _subclass(SettingsFollower, requires=(serving,))
    return [Heartbeat, serving, follower, logs, RestoreSweep]


def _subclass(step: type[bootsteps.StartStopStep], **attrs: Any) -> type:
    # Celery names a step after its module and class (bootsteps.StepType); keeping both
    # keeps the logs and the boot order's names the same.
    return type(step)(step.__name__, (step,), {"__module__": step.__module__, **attrs})
