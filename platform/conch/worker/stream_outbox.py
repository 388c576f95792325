"""The replies of a drain loop's streams, sent by a thread of their own.

A decoupled model sends its responses from its own threads, often one right after
another. Sent one round trip each, from the model's thread, every response holds the
model for a round trip to Redis and costs a pipeline of its own (bench/README.md,
"Streaming"). ``Outbox.put`` takes a response's commands and returns at once; the
outbox's one thread sends everything put since its last round trip in the next one, in
the order put, so a request's responses still leave in order, and then runs each one's
``after`` (a final response's: let go of the request). A model that sends faster than
Redis takes its responses waits in ``put`` once ``MAX_QUEUED`` are queued.

Through a Redis outage the thread tries again until Redis answers or the drain loop
stops, as the runner sends a batch's replies; ``after`` runs either way (an unsent final
response leaves its message for the visibility timeout to bring back). A command Redis
refuses (an older run's entry in a request's log: ``conch.wire.stream_log``) is logged,
naming its request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import redis

from conch.wire import outage
from conch.wire.redis_link import Commands, RedisLink
from conch.worker.replies import ReplySink

log = logging.getLogger(__name__)

MAX_QUEUED = 4096  # responses waiting for the thread before a model's send waits too


@dataclass(frozen=True)
class Parcel:
    """One response's commands, the request they are for, and what to do once sent."""

    commands: Commands
    request_id: str
    after: Callable[[], None] | None = None


class Outbox:
    """One drain loop's stream replies, sent in order by one thread (started at the
    first ``put``)."""

    def __init__(self, sink: ReplySink, stopping: threading.Event, name: str) -> None:
        self._sink = sink  # its Redis client is the one the replies go on
        self._stopping = stopping
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[Parcel] = deque()
        self._sending = 0  # parcels taken by the thread and not yet sent
        self._thread: threading.Thread | None = None

    def put(self, parcel: Parcel) -> None:
        with self._cond:
            while len(self._queue) >= MAX_QUEUED and not self._stopping.is_set():
                self._cond.wait(0.1)
            self._queue.append(parcel)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"{self._name}-outbox", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for everything put to be sent; whether it was."""
        until = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._sending:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        link = RedisLink(self._sink.client)
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                parcels = list(self._queue)
                self._queue.clear()
                self._sending = len(parcels)
                self._cond.notify_all()  # room for senders held at MAX_QUEUED
            try:
                self._send(link, parcels)
            finally:
                for parcel in parcels:
                    if parcel.after is not None:
                        try:
                            parcel.after()
                        except Exception:
                            log.exception(
                                "%s: after sending request '%s'", self._name, parcel.request_id
                            )
                with self._cond:
                    self._sending = 0
                    self._cond.notify_all()

    def _send(self, link: RedisLink, parcels: list[Parcel]) -> None:
        commands = [args for parcel in parcels for args in parcel.commands.queued]
        while True:
            try:
                replies = link.pipeline(commands)
                break
            except redis.RedisError as exc:
                if not outage.is_outage(exc) or self._stopping.is_set():
                    ids = sorted({p.request_id for p in parcels})
                    log.error(
                        "%s: responses of requests %s were not sent: %s", self._name, ids, exc
                    )
                    return
                time.sleep(outage.RECONNECT_S)
        at = 0
        for parcel in parcels:
            for reply in replies[at : at + len(parcel.commands.queued)]:
                if isinstance(reply, redis.ResponseError):
                    log.error(
                        "%s: a response of request '%s' was refused: %s",
                        self._name,
                        parcel.request_id,
                        reply,
                    )
            at += len(parcel.commands.queued)
