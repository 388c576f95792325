"""The frontend's side of the broker: publish a request, wait for its reply.

Every process that sends requests owns one ``Dispatcher``: each gateway process, and
each worker process once a Python model makes a BLS call. Its reply list is on Redis;
one listener thread pops replies in bulk and wakes the request threads waiting on
them, so a request costs one pipelined round trip to publish and nothing to receive
(no per-request connection, no Celery result backend).

When Redis goes away, a request that is waiting for its reply keeps waiting through a
short outage: its message and its reply live in Redis, and a Redis that logs writes
(append-only file) comes back with both, so the answer still comes, soon after Redis
answers again (bench/README.md, "Measurements the code cites"). The listener reconnects on its own, and then checks
that Redis kept its data (``outage.lost``); if it did not, every waiting request gets a
503 at once instead of waiting for a reply that will never come. If Redis is not back
within ``OUTAGE_GRACE_S``, every waiting request gets a 503 with ``Retry-After`` then,
not at its deadline. A 503 does not take the message back: a worker may still run it
once Redis returns, and its reply is dropped. New requests get their 503 at once, from
the publish that fails.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import redis

from conch.core.errors import BrokerUnavailable, Cancelled, ConchError, Unavailable
from conch.wire import broker, outage, statistics
from conch.wire.messages import REPLY_PREFIX, BadMessage, InferMessage, Reply
from conch.wire.redis_link import RedisLink

log = logging.getLogger(__name__)

OUTAGE_GRACE_S = 2.0  # how long a waiting request outlives the loss of Redis


class _Slot:
    __slots__ = ("error", "event", "reply")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reply: Reply | None = None
        self.error: ConchError | None = None  # the answer instead of a reply (an outage)


class Pending:
    """A published request: ``wait()`` for its reply, or ``cancel()`` to stop waiting.

    Exactly one of them is called; either forgets the request, so a reply that comes
    later (its caller gave up, or a sibling step failed) is dropped by the listener.
    """

    __slots__ = ("_dispatcher", "_raw", "_slot", "msg", "version")

    def __init__(
        self,
        dispatcher: Dispatcher,
        msg: InferMessage,
        slot: _Slot,
        raw: bytes = b"",
        version: int = 0,
    ) -> None:
        self._dispatcher = dispatcher
        self._slot = slot
        self._raw = raw  # the message as queued; empty when it cannot be withdrawn
        self.msg = msg
        self.version = version or msg.version  # the version resolved for it, for statistics

    def wait(self) -> Reply:
        """The reply; ``Unavailable`` once the message's deadline passes without one,
        ``BrokerUnavailable`` when Redis went away (see the module docstring). A message
        with no deadline (a job's step) waits as long as its queue keeps it waiting."""
        msg = self.msg
        timeout = max(0.0, msg.deadline - time.time()) if msg.deadline else None
        try:
            if not self._slot.event.wait(timeout):
                raise Unavailable(
                    f"Request timeout expired for model '{msg.model}': no reply within "
                    f"{(msg.deadline - msg.enqueued) * 1000:.0f} ms"
                )
            if self._slot.error is not None:
                raise self._slot.error
            assert self._slot.reply is not None
            return self._slot.reply
        finally:
            self._dispatcher._pending.pop(msg.id, None)

    def cancel(self) -> None:
        """The caller will not wait after all."""
        self._dispatcher._pending.pop(self.msg.id, None)

    def abandon(self, reason: str) -> bool:
        """The caller went away (a cancelled gRPC call or stream): take the message back
        out of its queue if it is still there, so it never runs (counted as ``CANCELED``,
        as Triton counts a request cancelled before it ran), and end ``wait()`` at once
        with ``Cancelled(reason)``. True when the message was still queued."""
        msg, client = self.msg, self._dispatcher.client
        withdrawn = bool(self._raw) and broker.withdraw(client, msg.model, msg.priority, self._raw)
        if withdrawn:
            took_ns = max(0, int((time.time() - msg.enqueued) * 1e9))
            statistics.record_failure(client, msg.model, self.version, statistics.CANCELED, took_ns)
        self._slot.error = Cancelled(reason)
        self._slot.event.set()
        return withdrawn


class Abandonment:
    """How a transport says its caller went away while its requests wait (a cancelled
    gRPC call; a cancelled stream, with many requests in flight): ``abandon`` withdraws
    every queued message no worker has taken and ends every wait; a request submitted
    after it is withdrawn at once, and ``gone`` says not to send more. Said after the
    answers (each ``done``), it costs nothing."""

    __slots__ = ("_gone", "_lock", "_pending")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[Pending] = set()
        self._gone: str | None = None

    @property
    def gone(self) -> str | None:
        """Why the caller went away; None while it is there."""
        return self._gone

    def watch(self, pending: Pending) -> None:
        with self._lock:
            if self._gone is None:
                self._pending.add(pending)
                return
        pending.abandon(self._gone)  # gone before the message was even queued

    def done(self, pending: Pending) -> None:
        with self._lock:
            self._pending.discard(pending)

    def abandon(self, reason: str) -> None:
        with self._lock:
            if self._gone is not None:
                return
            self._gone, waiting, self._pending = reason, self._pending, set()
        for pending in waiting:
            pending.abandon(reason)


class Dispatcher:
    """Publishes requests and routes replies to the threads waiting for them."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.publisher = broker.Publisher(client)
        self._lock = threading.Lock()
        self._pending: dict[str, _Slot] = {}
        self._pid: int | None = None
        self.reply_key = ""

    def call(
        self,
        msg: InferMessage,
        *,
        max_queue_size: int = 0,
        version: int = 0,
        abandonment: Abandonment | None = None,
        route: Callable[[InferMessage], None] | None = None,
        bundling: broker.Bundling | None = None,
    ) -> Reply:
        """Enqueue ``msg`` and block until its reply, its deadline or ``abandonment``.

        ``bundling``: it may share its message with other requests (``broker.Bundling``),
        unless an ``abandonment`` may take it back out of its queue."""
        if abandonment is not None:
            bundling = None
        pending = self.submit(
            msg, max_queue_size=max_queue_size, version=version, route=route, bundling=bundling
        )
        if abandonment is None:
            return pending.wait()
        abandonment.watch(pending)
        try:
            return pending.wait()
        finally:
            abandonment.done(pending)

    def submit(
        self,
        msg: InferMessage,
        *,
        max_queue_size: int = 0,
        version: int = 0,
        route: Callable[[InferMessage], None] | None = None,
        bundling: broker.Bundling | None = None,
    ) -> Pending:
        """Enqueue ``msg`` now; the returned ``Pending`` waits for its reply.

        Several requests can be in flight from one caller (an ensemble's parallel steps).
        A full queue (``max_queue_size``) refuses it with a 503, counted as ``REJECTED``
        under ``version`` (the one resolved for it: the message may say "latest").
        ``route`` sends the message somewhere other than its model's queue (a sequence's
        mailbox, ``conch.frontend.sequence_route``); it raises what refuses it.
        With ``bundling`` it may share its message with others (``broker.Bundling``); it
        cannot then be withdrawn (``Pending.abandon``).
        """
        self._ensure_listener()
        slot = _Slot()
        self._pending[msg.id] = slot
        msg.reply_to = self.reply_key
        if route is not None:
            try:
                route(msg)
            except BaseException:
                self._pending.pop(msg.id, None)
                raise
            return Pending(self, msg, slot, b"", version)
        try:
            queued = self.publisher.publish(
                msg.model,
                msg.to_dict(),
                task_id=msg.id,
                priority=msg.priority,
                reply_to=self.reply_key,
                max_queue_size=max_queue_size,
                bundling=bundling,
            )
        except BaseException:
            self._pending.pop(msg.id, None)
            raise
        if queued is None:
            self._pending.pop(msg.id, None)
            statistics.record_failure(
                self.client, msg.model, version or msg.version, statistics.REJECTED
            )
            raise Unavailable(
                f"Exceeds maximum queue size: model '{msg.model}' already has "
                f"{max_queue_size} requests waiting at this priority"
            )
        return Pending(self, msg, slot, queued, version)

    # The listener is per process: gunicorn forks after the app is built, so it is
    # started lazily, and again in a child that inherited a parent's dispatcher.
    def _ensure_listener(self) -> None:
        pid = os.getpid()
        if self._pid == pid:
            return
        with self._lock:
            if self._pid == pid:
                return
            self._pending = {}
            self.reply_key = f"{REPLY_PREFIX}{socket.gethostname()}.{pid}.{uuid.uuid4().hex[:8]}"
            threading.Thread(target=self._listen, name="conch-replies", daemon=True).start()
            self._pid = pid

    def _listen(self) -> None:
        key = self.reply_key
        link = RedisLink(self.client)
        blmpop = True  # Redis >= 7: block and take up to a batch in one round trip
        joined: outage.Dataset | None = None  # what Redis held when last reached
        lost_at: float | None = None  # when Redis went away; None while it answers
        while True:
            try:
                if joined is None or lost_at is not None:
                    joined = self._rejoin(joined)
                    if lost_at is not None:
                        log.info("reply listener reached Redis again")
                    lost_at = None
                if blmpop:
                    got = link.call("BLMPOP", 1, 1, key, "LEFT", "COUNT", 256)
                    if isinstance(got, redis.ResponseError):
                        blmpop = "unknown command" not in str(got).lower()
                        continue
                    if not got:
                        continue
                    items = got[1]
                else:
                    got, more = link.pipeline([("BLPOP", key, 1), ("LPOP", key, 255)])
                    if not got or isinstance(got, redis.ResponseError):
                        continue
                    items = [got[1], *(more if isinstance(more, list) else ())]
            except redis.RedisError as exc:
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    log.warning("reply listener lost Redis (%s); reconnecting", exc)
                elif now - lost_at >= OUTAGE_GRACE_S:
                    self._fail_waiting(outage.unavailable(exc))
                time.sleep(outage.RECONNECT_S)
                continue
            for raw in items:
                try:
                    reply = Reply.unpack(raw)
                except BadMessage as exc:
                    log.warning("dropping an unreadable reply: %s", exc)
                    continue
                slot = self._pending.get(reply.id)
                # The first reply wins: a duplicate (a redelivered request run twice) or a
                # late one (its caller gave up) changes nothing.
                if slot is not None and slot.reply is None and slot.error is None:
                    slot.reply = reply
                    slot.event.set()

    def _rejoin(self, before: outage.Dataset | None) -> outage.Dataset:
        """Reach Redis (again): if it lost what it held, fail the requests waiting."""
        now = outage.dataset(self.client)
        why = None if before is None else outage.lost(before, now)
        if why is not None:
            log.warning("%s: failing the requests waiting for replies", why)
            self._fail_waiting(
                BrokerUnavailable(f"{why}; this request's message may be gone with it: retry")
            )
        return now

    def _fail_waiting(self, error: ConchError) -> None:
        """Answer every request waiting now with ``error``."""
        for slot in list(self._pending.values()):
            if slot.reply is None and slot.error is None:
                slot.error = error
                slot.event.set()
