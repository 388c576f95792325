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

A request to a decoupled model (``Dispatcher.stream``) gets any number of replies, each
its own message on the reply list, numbered by ``Reply.seq`` and ended by a ``final``
one or an error. ``ResponseStream`` hands them out one by one in ``seq`` order:

- a reply that comes before its turn (a gap) is held until the ones before it come;
  at most ``MAX_EARLY_REPLIES`` are held, past that the stream fails (``Internal``);
- a reply whose place was taken already is a duplicate (a request redelivered and run
  twice) and is dropped, as are replies after the final one;
- an error reply ends the stream where it stands (after the replies released before
  it); one numbered past a gap waits for its turn like any other reply;
- a reply of a later run (``Reply.attempt``: the request came back after its worker
  died) starts the order again from its run's seq 0, and the earlier run's replies still
  to come are dropped; the first reply of the new run that follows replies already
  released is marked ``restarted``, so the caller can tell its client to drop those.

A watched stream (``InferMessage.watched``) has a lease this process renews while its
caller reads (``stream_leases``): a caller that stops early ends it at once, so the
model's ``is_cancelled()`` turns true. A kept one (``keep_s``: an SSE client that may
reconnect) is let go instead: its lease runs out after the grace time unless a reader
comes back, and then, if no worker took the message yet, it is withdrawn.

Its deadline, an outage and ``abandon`` end it as they end ``Pending.wait``, after the
replies already in order (``abandon`` drops those too: nobody will read them).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator

import redis

from conch.core import timeline
from conch.core.errors import BrokerUnavailable, Cancelled, ConchError, Internal, Unavailable
from conch.frontend.stream_leases import MIN_TTL_S, LeaseKeeper
from conch.wire import broker, cancellation, outage, statistics, stream_log
from conch.wire.messages import REPLY_PREFIX, BadMessage, InferMessage, Reply
from conch.wire.rate_limits import FleetLimiter
from conch.wire.redis_link import Commands, RedisLink

log = logging.getLogger(__name__)


OUTAGE_GRACE_S = 2.0  # how long a waiting request outlives the loss of Redis
MAX_EARLY_REPLIES = 1024  # a stream's replies held ahead of a gap (module docstring)
LISTEN_BLOCK_S = 1  # how long the reply listener blocks on its list between checks to stop


class _Slot:
    """Where the listener leaves a request's one reply."""

    __slots__ = ("error", "event", "reply")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reply: Reply | None = None
        self.error: ConchError | None = None  # the answer instead of a reply (an outage)

    def deliver(self, reply: Reply) -> None:
        # The first reply wins: a duplicate (a redelivered request run twice) or a late
        # one changes nothing.
        if self.reply is None and self.error is None:
            self.reply = reply
            self.event.set()

    def fail(self, error: ConchError) -> None:
        """Answer with ``error`` unless answered already (an outage)."""
        if self.reply is None and self.error is None:
            self.error = error
            self.event.set()

    def abandon(self, error: ConchError) -> None:
        """Answer with ``error`` whatever came (the caller went away)."""
        self.error = error
        self.event.set()


class _Replies:
    """Where the listener leaves a decoupled request's replies: released in ``seq``
    order, duplicates dropped, the ones ahead of a gap held (the module docstring)."""

    __slots__ = (
        "_attempt",
        "_closed",
        "_cond",
        "_early",
        "_error",
        "_next",
        "_ready",
        "_restart",
        "_this_run",
    )

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: deque[Reply] = deque()  # in order, not yet taken
        self._early: dict[int, Reply] = {}  # seq -> a reply that came before its turn
        self._next = 0  # the seq of the next reply in order
        self._closed = False  # the final reply or an error is in order: nothing follows
        self._error: ConchError | None = None  # the end instead of more replies
        self._attempt = 1  # the run whose replies are released
        self._this_run = False  # a reply of that run was released
        self._restart = False  # the next reply released begins a run after released ones

    def deliver(self, reply: Reply) -> None:
        with self._cond:
            if self._closed or self._error is not None:
                return  # after the end: late, or a duplicate of the end
            if reply.attempt < self._attempt:
                return  # a run that a later one replaced
            if reply.attempt > self._attempt:
                self._attempt, self._next = reply.attempt, 0
                self._early.clear()
                self._restart = self._restart or self._this_run
                self._this_run = False
            if reply.error is not None and reply.seq <= self._next:
                self._release(reply)  # an error ends the request where it stands
            elif reply.seq < self._next or reply.seq in self._early:
                return  # its place is taken: a duplicate
            elif reply.seq > self._next:
                if len(self._early) >= MAX_EARLY_REPLIES:
                    self._error = Internal(
                        f"request '{reply.id}': reply {self._next} never came while "
                        f"{len(self._early)} replies after it did"
                    )
                else:
                    self._early[reply.seq] = reply
                    return
            else:
                self._release(reply)
                while not self._closed and self._next in self._early:
                    self._release(self._early.pop(self._next))
            self._cond.notify_all()

    def _release(self, reply: Reply) -> None:
        if self._restart:
            reply.restarted, self._restart = True, False
        self._this_run = True
        self._ready.append(reply)
        self._next = reply.seq + 1
        if reply.final or reply.error is not None:
            self._closed = True
            self._early.clear()

    def fail(self, error: ConchError) -> None:
        """End with ``error`` after the replies in order, unless ended already."""
        with self._cond:
            if not self._closed and self._error is None:
                self._error = error
                self._cond.notify_all()

    def abandon(self, error: ConchError) -> None:
        """End with ``error`` now, dropping what was not taken (the caller went away)."""
        with self._cond:
            self._ready.clear()
            self._early.clear()
            self._closed, self._error = True, error
            self._cond.notify_all()

    def take(self, deadline: float) -> Reply | ConchError | None:
        """The next reply in order, or the error that ends the stream; None once
        ``deadline`` (epoch seconds, 0: none) passes first."""
        with self._cond:
            while not self._ready and self._error is None:
                timeout = None
                if deadline:
                    timeout = deadline - time.time()
                    if timeout <= 0:
                        return None
                self._cond.wait(timeout)
            return self._ready.popleft() if self._ready else self._error


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
            timeline.stamp("reply.waiting")
            woke = self._slot.event.wait(timeout)
            timeline.stamp("reply.woke")
            if not woke:
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
        as Triton counts a request cancelled before it ran), else mark it cancelled for
        the model running it (``conch.wire.cancellation``), and end ``wait()`` at once
        with ``Cancelled(reason)``. True when the message was still queued."""
        msg, client = self.msg, self._dispatcher.client
        withdrawn = _withdraw(client, msg, self._raw, self.version)
        if not withdrawn:
            try:
                cancellation.mark(client, msg.id, msg.deadline)
            except redis.RedisError as exc:  # the caller is gone either way
                log.warning("request '%s': could not mark it cancelled: %s", msg.id, exc)
        self._slot.abandon(Cancelled(reason))
        return withdrawn


def _withdraw(client: redis.Redis, msg: InferMessage, raw: bytes, version: int) -> bool:
    """Take ``msg`` (queued as ``raw``; empty: it cannot be) back out of its queue if no
    worker took it yet, counted as ``CANCELED``. True when it was still queued."""
    withdrawn = bool(raw) and broker.withdraw(client, msg.model, msg.priority, raw)
    if withdrawn:
        took_ns = max(0, int((time.time() - msg.enqueued) * 1e9))
        statistics.record_failure(client, msg.model, version, statistics.CANCELED, took_ns)
    return withdrawn


class ResponseStream:
    """A published request to a decoupled model: iterate for its replies, in ``seq``
    order, up to the ``final`` one. A reply's error is raised, and so are the deadline
    (``Unavailable``), an outage and ``abandon`` (``Cancelled``), as ``Pending.wait``
    raises them; each ends the stream. A caller that stops early says ``cancel()``, so
    that the replies still to come are dropped by the listener."""

    __slots__ = (
        "_dispatcher",
        "_grace_s",
        "_let_go_once",
        "_over",
        "_raw",
        "_slot",
        "msg",
        "version",
    )

    def __init__(
        self,
        dispatcher: Dispatcher,
        msg: InferMessage,
        slot: _Replies,
        raw: bytes,
        version: int,
        grace_s: float = 0.0,
    ) -> None:
        self._dispatcher = dispatcher
        self._slot = slot
        self._raw = raw  # the message as queued; empty when it cannot be withdrawn
        self._over = False  # the caller reads no more
        self._let_go_once = False  # the request was let go of (``_let_go``)
        self._grace_s = grace_s  # a watched stream's lease time to live
        self.msg = msg
        self.version = version or msg.version

    def __iter__(self) -> Iterator[Reply]:
        return self

    def __next__(self) -> Reply:
        if self._over:
            raise StopIteration
        msg = self.msg
        got = self._slot.take(msg.deadline)
        if isinstance(got, Reply) and got.error is None:
            if got.final:
                self._over = True
                self._let_go(ended=True)
            return got
        self.cancel()
        if got is None:
            raise Unavailable(
                f"Request timeout expired for model '{msg.model}': its responses did not "
                f"end within {(msg.deadline - msg.enqueued) * 1000:.0f} ms"
            )
        if isinstance(got, Reply):
            assert got.error is not None
            raise got.error
        raise got

    def cancel(self) -> None:
        """The caller will read no more: later replies are dropped, and the request is
        cancelled (a kept one once its grace time passes with no reader back)."""
        self._over = True
        self._let_go(ended=False)

    def abandon(self, reason: str) -> bool:
        """``Pending.abandon``: withdrawn if still queued (a kept stream: if still queued
        when its grace time passes with no reader back), and the stream ends with
        ``Cancelled(reason)`` at once, dropping the replies not yet read."""
        withdrawn = False
        if not self.msg.keep_s:
            withdrawn = _withdraw(self._dispatcher.client, self.msg, self._raw, self.version)
        self._let_go(ended=False)
        self._slot.abandon(Cancelled(reason))
        return withdrawn

    def _let_go(self, *, ended: bool) -> None:
        """Stop reading: the request ``ended`` (its final reply came or its caller was
        told why it ended), or its caller went away first."""
        if self._let_go_once:
            return
        self._let_go_once = True
        dispatcher, msg = self._dispatcher, self.msg
        dispatcher._pending.pop(msg.id, None)
        if not msg.watched:
            return
        dispatcher.leases.drop(msg.id)
        if ended:
            return  # the lease runs out on its own: nobody runs the request any more
        if msg.keep_s:  # the client may come back within its grace time
            timer = threading.Timer(self._grace_s + 0.5, self._after_grace)
            timer.daemon = True
            timer.start()
            return
        try:
            pipe = dispatcher.client.pipeline(transaction=False)
            stream_log.release(pipe, msg.id)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("request '%s': could not end its lease: %s", msg.id, exc)

    def _after_grace(self) -> None:
        """The grace time after a kept stream's client left: cancelled if nobody came
        back (its lease lapsed), and taken out of its queue if no worker has it yet."""
        try:
            if stream_log.held(self._dispatcher.client, [self.msg.id])[0]:
                return
            _withdraw(self._dispatcher.client, self.msg, self._raw, self.version)
        except redis.RedisError as exc:
            log.warning("request '%s': could not withdraw it: %s", self.msg.id, exc)


class Abandonment:
    """How a transport says its caller went away while its requests wait (a cancelled
    gRPC call; a cancelled stream, with many requests in flight): ``abandon`` withdraws
    every queued message no worker has taken and ends every wait; a request submitted
    after it is withdrawn at once, and ``gone`` says not to send more. Said after the
    answers (each ``done``), it costs nothing.

    ``bundles``: the caller's requests may still share a message with others
    (``broker.Bundling``, an HTTP infer call's, where bundles are most of the throughput):
    one that did is not withdrawn, only its wait ends; one that went alone is. Without
    it, a request that may be abandoned always goes alone."""

    __slots__ = ("_gone", "_lock", "_pending", "bundles")

    def __init__(self, *, bundles: bool = False) -> None:
        self._lock = threading.Lock()
        self._pending: set[Pending | ResponseStream] = set()
        self._gone: str | None = None
        self.bundles = bundles

    @property
    def gone(self) -> str | None:
        """Why the caller went away; None while it is there."""
        return self._gone

    def watch(self, pending: Pending | ResponseStream) -> None:
        with self._lock:
            if self._gone is None:
                self._pending.add(pending)
                return
        pending.abandon(self._gone)  # gone before the message was even queued

    def done(self, pending: Pending | ResponseStream) -> None:
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
    """Publishes requests and routes replies to the threads waiting for them. Its
    ``step_slots`` hold this process's share of ensembles' ``max_inflight_requests``
    (``conch.frontend.ensemble_runner``), leased in Redis like the rate limiter's copies."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.step_slots = FleetLimiter(client)
        self.publisher = broker.Publisher(client)
        self._lock = threading.Lock()
        self._pending: dict[str, _Slot | _Replies] = {}
        self._pid: int | None = None
        self.reply_key = ""
        self.leases = LeaseKeeper(client)
        self._closing = threading.Event()
        self._listener: threading.Thread | None = None

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
        unless an ``abandonment`` may take it back out of its queue (and does not say
        ``bundles``)."""
        if abandonment is not None and not abandonment.bundles:
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
        slot = _Slot()
        raw = self._enqueue(msg, slot, max_queue_size, version, route, bundling)
        return Pending(self, msg, slot, raw, version)

    def stream(
        self,
        msg: InferMessage,
        *,
        max_queue_size: int = 0,
        version: int = 0,
        route: Callable[[InferMessage], None] | None = None,
        grace_s: float = 0.0,
    ) -> ResponseStream:
        """Enqueue ``msg``, a request to a decoupled model, now; iterate the returned
        ``ResponseStream`` for its replies (the module docstring). As ``submit``, but
        never bundled: a stream can always be withdrawn while it is queued. A watched
        ``msg`` gets its lease (``grace_s`` to live) and, when kept, its log's head in
        the round trip that queues it, just before it, so that no worker finds it
        cancelled."""
        before = Commands()
        if msg.watched:
            grace_s = max(grace_s, MIN_TTL_S)
            stream_log.hold(before, [msg.id], int(grace_s * 1000))
            if msg.keep_s:
                head = stream_log.StreamHead(
                    msg.model, version or msg.version, msg.client_id, msg.deadline
                )
                stream_log.open_log(before, msg.id, head, msg.keep_s)
            if route is not None:  # a sequence's mailbox: not through the publisher
                pipe = self.client.pipeline(transaction=False)
                for args in before.queued:
                    pipe.execute_command(*args)
                try:
                    pipe.execute()
                except redis.RedisError as exc:
                    raise outage.unavailable(exc) from None
                before = Commands()
            self.leases.add(msg.id, grace_s)
        slot = _Replies()
        try:
            raw = self._enqueue(
                msg, slot, max_queue_size, version, route, None, tuple(before.queued)
            )
        except BaseException:
            self.leases.drop(msg.id)
            raise
        return ResponseStream(self, msg, slot, raw, version, grace_s)

    def _enqueue(
        self,
        msg: InferMessage,
        slot: _Slot | _Replies,
        max_queue_size: int,
        version: int,
        route: Callable[[InferMessage], None] | None,
        bundling: broker.Bundling | None,
        before: tuple[tuple, ...] = (),
    ) -> bytes:
        """Publish ``msg`` with its replies to ``slot``: the message as queued (empty
        when routed, or when it cannot be withdrawn); ``before``: ``Publisher.publish``'s."""
        self._ensure_listener()
        self._pending[msg.id] = slot
        msg.reply_to = self.reply_key
        if route is not None:
            try:
                route(msg)
            except BaseException:
                self._pending.pop(msg.id, None)
                raise
            return b""
        try:
            queued = self.publisher.publish(
                msg.model,
                msg.to_dict(),
                task_id=msg.id,
                priority=msg.priority,
                reply_to=self.reply_key,
                max_queue_size=max_queue_size,
                bundling=bundling,
                before=before,
                # Alone in this process (no other request waits for a reply): nobody could
                # join its flush, so it goes without a turn of the hub.
                gather=len(self._pending) > 1,
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
        return queued

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
            self._listener = threading.Thread(
                target=self._listen, name="conch-replies", daemon=True
            )
            self._listener.start()
            self._pid = pid

    def close(self) -> None:
        """Stop listening for replies and renewing leases: a data plane inside an
        application that stops (``DataPlane.close``). What still waits fails."""
        self._closing.set()
        if self._listener is not None:
            self._listener.join(LISTEN_BLOCK_S + 1)
        self.leases.close()
        self.step_slots.close()
        self._fail_waiting(Unavailable("the data plane was closed while this request waited"))

    def _listen(self) -> None:
        key = self.reply_key
        link = RedisLink(self.client)
        blmpop = True  # Redis >= 7: block and take up to a batch in one round trip
        joined: outage.Dataset | None = None  # what Redis held when last reached
        lost_at: float | None = None  # when Redis went away; None while it answers
        while not self._closing.is_set():
            try:
                if joined is None or lost_at is not None:
                    joined = self._rejoin(joined)
                    if lost_at is not None:
                        log.info("reply listener reached Redis again")
                    lost_at = None
                if blmpop:
                    got = link.call("BLMPOP", LISTEN_BLOCK_S, 1, key, "LEFT", "COUNT", 256)
                    if isinstance(got, redis.ResponseError):
                        blmpop = "unknown command" not in str(got).lower()
                        continue
                    if not got:
                        continue
                    items = got[1]
                else:
                    got, more = link.pipeline([("BLPOP", key, LISTEN_BLOCK_S), ("LPOP", key, 255)])
                    if not got or isinstance(got, redis.ResponseError):
                        continue
                    items = [got[1], *(more if isinstance(more, list) else ())]
                timeline.stamp("reply.popped")
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
                if slot is not None:  # else a late reply: its caller gave up
                    slot.deliver(reply)
            timeline.stamp("reply.routed")

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
            slot.fail(error)
