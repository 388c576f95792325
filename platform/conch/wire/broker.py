"""Model queues on Redis, in Celery's message format and kombu's key layout.

Each model has one Celery queue (a Redis list, with kombu's priority sub-lists), so
Celery tooling, KEDA's list-length trigger and kombu's visibility-timeout restore keep
working. This module is the contract both ends share: the key names, the envelope, and
the producer's ``Publisher``. The consumer's half (``conch.worker.drain``) does not use
kombu's one-message consumer: ``Drain.pop`` takes up to a whole batch in one Lua script
that also records every message in kombu's ``unacked`` hash and index, so a message is
never out of the list without being registered in flight (kombu's own pop-then-register
is two steps; celery#7950).

A small "wake" list per queue lets idle workers block (BLPOP) instead of polling: the
gateway pushes a token with every message and each pop resets the tokens to the number
of messages still waiting, so tokens never drift far from the truth. A message that
arrives without a token (a kombu restore, a plain Celery producer) is found by the
drain's periodic poll.

**Bundles.** When a gateway process holds several requests for one model in the same
instant (the publisher's group commit), those that may share a message go as one: a
bundle, a Celery message of its own task (``BUNDLE_TASK_NAME``) whose one argument is the
list of their payloads. That is one write, one pop and one ack for all of them; each
request keeps its own id, deadline, reply address and statistics in its payload, and the
worker answers each on its own and acks the bundle once every one of them is settled. A
worker that dies holding a bundle gets the whole of it redelivered (its answered requests
run again; a caller keeps the first reply). Only requests nobody may withdraw later are
bundled (``LREM`` takes whole messages), so the caller decides (``Bundling``).

The work owed counts requests, not messages: the publish script records each bundle's
requests beyond the first, its priority step and its deadline in the queue's bundle hash
(``bundled_key``), which the count (``conch.wire.work_owed``) adds to the lists' lengths
(or to the work in flight, while the bundle is in ``unacked``) and the ack deletes. An
entry whose deadline passed long ago is forgotten by the count: a bundle a queue purge or
a Redis edit took away never holds workers up.
"""

from __future__ import annotations

import base64
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgpack
import orjson
import redis

from conch.core import timeline
from conch.wire.keys import (
    BUNDLED_SUFFIX,
    HELD_SUFFIX,
    IN_FLIGHT_CLASS_SUFFIX,
    IN_FLIGHT_SUFFIX,
    PRIORITY_SEP,
    QUEUE_PREFIX,
    UNACKED,
    UNACKED_INDEX,
    WAKE_SUFFIX,
)
from conch.wire.keys import JOBS_QUEUE as JOBS_QUEUE  # the name its callers know
from conch.wire.messages import BadMessage
from conch.wire.redis_link import RedisLink

TASK_NAME = "conch.infer"
BUNDLE_TASK_NAME = "conch.infer_bundle"  # its one argument: a list of TASK_NAME's payloads
BUNDLE_MAX_REQUESTS = 1024  # the most requests one bundle holds, either end checks
# The most tensor bytes a gateway puts in one bundle: a message of many MiB costs Redis
# and the worker more per request than separate ones (bench/README.md, "Bundles").
BUNDLE_MAX_BYTES = 1 << 20
# One sub-list per step, 0 the highest (kombu's order on Redis). Online requests take
# steps 0-7 by their Triton priority level; async jobs, then offline work (batch jobs'
# messages), sit below.
PRIORITY_STEPS = tuple(range(10))
WAKE_CAP = 8

ONLINE_STEPS = 8
PRIORITY_ASYNC = 8
PRIORITY_OFFLINE = 9

_ORIGIN = f"conch-gateway@{socket.gethostname()}:{os.getpid()}"
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def queue_name(model: str) -> str:
    return QUEUE_PREFIX + model


def priority_keys(queue: str) -> list[str]:
    """kombu's sub-lists of one queue, highest priority first."""
    return [queue if p == 0 else f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS]


def step_of(priority: int) -> int:
    """The priority sub-list (step) a message's priority puts it on."""
    return min(max(0, priority), PRIORITY_STEPS[-1])


def priority_key(queue: str, priority: int) -> str:
    step = step_of(priority)
    return queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}"


def online_step(level: int) -> int:
    """Triton's priority level (1 = highest) as an online sub-list."""
    return min(max(level, 1), ONLINE_STEPS) - 1


def model_of_key(key: str) -> str | None:
    """The model whose queue a key belongs to (its list, a priority sub-list, its wake
    list or in-flight set), or None for another key. No model name holds ``/`` or a
    control character, so the name ends where either begins."""
    if not key.startswith(QUEUE_PREFIX):
        return None
    name = key[len(QUEUE_PREFIX) :].partition(PRIORITY_SEP)[0].partition("/")[0]
    return name or None


def wake_key(queue: str) -> str:
    return queue + WAKE_SUFFIX


def in_flight_key(queue: str) -> str:
    """The set of the queue's tags a worker popped (``conch.wire.work_owed`` counts it)."""
    return queue + IN_FLIGHT_SUFFIX


def bundled_key(queue: str) -> str:
    """The queue's bundle hash: each bundle's requests beyond the first (module docstring)."""
    return queue + BUNDLED_SUFFIX


def held_key(queue: str) -> str:
    """The queue's held hash: the requests a forming batch holds, which still count against
    a ``max_queue_size`` (``conch.worker.drain``'s pop marks them when asked to)."""
    return queue + HELD_SUFFIX


def bundle_entry(extra: int, step: int, deadline: float) -> str:
    """A bundle's value in ``bundled_key``'s hash: the requests it holds beyond the first,
    its priority step, and the latest deadline of its requests (0: one of them has none).
    The count script parses it."""
    return f"{extra} {step} {deadline:.3f}"


def in_flight_class_key(queue: str) -> str:
    """The class (online, async, offline) of each tag in ``in_flight_key``'s set."""
    return queue + IN_FLIGHT_CLASS_SUFFIX


# The kinds of work the steps hold: online requests, async jobs, offline work (batch jobs'
# messages).
PRIORITY_CLASSES = ("online", "async", "offline")


def step_class(step: int) -> str:
    """The kind of work a priority step holds (one of ``PRIORITY_CLASSES``)."""
    online, asynchronous, offline = PRIORITY_CLASSES
    if step < ONLINE_STEPS:
        return online
    return asynchronous if step == PRIORITY_ASYNC else offline


def envelope(
    payload: dict,
    *,
    task_id: str,
    queue: str,
    priority: int,
    reply_to: str | None,
    task: str = TASK_NAME,
    keep_result: bool | None = None,
) -> bytes:
    """A Celery protocol-2 message whose single argument is our msgpack payload.

    Infer requests (``TASK_NAME``) reply on their own list, so Celery keeps no result
    for them; other tasks (an offline batch job) keep theirs in the result backend,
    unless ``keep_result`` is False (a task that writes its own).
    """
    if keep_result is None:
        keep_result = task != TASK_NAME
    return _message(payload, task_id, queue, priority, reply_to, task, keep_result)


def bundle_envelope(
    payloads: list[dict], *, task_id: str, queue: str, priority: int, reply_to: str | None
) -> bytes:
    """A bundle (module docstring): one message whose single argument is the list of its
    requests' payloads, in the order they were queued."""
    return _message(payloads, task_id, queue, priority, reply_to, BUNDLE_TASK_NAME, False)


def _message(
    argument: dict | list[dict],
    task_id: str,
    queue: str,
    priority: int,
    reply_to: str | None,
    task: str,
    keep_result: bool,
) -> bytes:
    body = msgpack.packb([[argument], {}, _EMBED], use_bin_type=True)
    return orjson.dumps(
        {
            "body": base64.b64encode(body).decode("ascii"),
            "content-encoding": "binary",
            "content-type": "application/x-msgpack",
            "headers": {
                "lang": "py",
                "task": task,
                "id": task_id,
                "shadow": None,
                "eta": None,
                "expires": None,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": [None, None],
                "root_id": task_id,
                "parent_id": None,
                "argsrepr": "",
                "kwargsrepr": "",
                "origin": _ORIGIN,
                "ignore_result": not keep_result,
            },
            "properties": {
                "correlation_id": task_id,
                "reply_to": reply_to or "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": priority,
                "body_encoding": "base64",
                "delivery_tag": task_id,
            },
        }
    )


# KEYS: the target sub-list, the wake list, the queue's bundle hash, its held hash, kombu's
# unacked hash. ARGV: message, max length (0 = none), wake cap, for a bundle its tag and its
# entry (bundle_entry; '' for a message of one request), and the target's priority step.
# A bounded queue's length is its sub-list's and the requests of that step a forming
# batch holds (held_key) that are still in flight; a held tag no longer in flight (acked,
# or restored by kombu after its worker died) is forgotten.
_PUBLISH_LUA = """
local limit = tonumber(ARGV[2])
if limit > 0 then
  local n = redis.call('LLEN', KEYS[1])
  if n < limit then
    local held = redis.call('HGETALL', KEYS[4])
    for i = 1, #held, 2 do
      if redis.call('HEXISTS', KEYS[5], held[i]) == 0 then
        redis.call('HDEL', KEYS[4], held[i])
      elseif held[i + 1] == ARGV[6] then
        n = n + 1
      end
    end
  end
  if n >= limit then
    return 0
  end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[4], ARGV[5])
end
redis.call('LPUSH', KEYS[2], '1')
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
return 1
"""


@dataclass(frozen=True, slots=True)
class Bundling:
    """A request that may share its message with others (module docstring): how many
    rows it holds, and how many one bundle may hold (its model's ``max_batch_size``: a
    bundle is never more than one batch); its tensors' bytes, of which a bundle holds
    ``BUNDLE_MAX_BYTES`` at most."""

    rows: int
    max_rows: int
    nbytes: int = 0


@dataclass(eq=False, slots=True)
class _Pending:
    """One request waiting for the publisher's next flush."""

    queue: str
    payload: dict
    task_id: str
    priority: int
    reply_to: str | None
    max_queue_size: int
    bundling: Bundling | None
    raw: bytes = b""  # its own message; a bundled request's is made at the flush
    before: tuple[tuple, ...] = ()  # commands its publish sends first, in its round trip
    done: threading.Event = field(default_factory=threading.Event)
    result: bool = False
    error: BaseException | None = None


@dataclass(slots=True)
class _Publish:
    """One message a flush sends, and the requests it carries."""

    entries: list[_Pending]
    keys: list[str]
    args: list
    before: tuple[tuple, ...] = ()  # its request's ``before`` commands (a single message's)


class Publisher:
    """The gateway's side of the model queues.

    Publishes are group-committed: whichever caller finds no flush under way sends
    every message queued meanwhile in one pipeline, so concurrent requests share round
    trips (and Redis's per-command work) instead of paying one each. Requests the caller
    lets bundle (``Bundling``) that meet in one flush, for one model, priority step and
    reply list, go as bundles of at most one batch each.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._script = client.register_script(_PUBLISH_LUA)
        self._link = RedisLink(client)
        self._lock = threading.Lock()
        self._sending = threading.Lock()
        self._queue: list[_Pending] = []
        self._flushing = False

    def publish(
        self,
        model: str,
        payload: dict,
        *,
        task_id: str,
        priority: int,
        reply_to: str | None,
        max_queue_size: int = 0,
        bundling: Bundling | None = None,
        before: tuple[tuple, ...] = (),
        gather: bool = True,
    ) -> bytes | None:
        """Queue one request and wake an idle worker: the message as queued (what
        ``withdraw`` takes; empty for a request that may have gone in a bundle, which
        nobody withdraws), or None when the queue is full.

        The length check and the push are one script, so concurrent gateways cannot
        overfill a bounded queue; its length counts the requests a forming batch holds
        (``held_key``), as Triton's queue counts its pending batch. A bounded queue counts
        messages, so its requests are never bundled. ``before``: commands (redis-py's argument tuples) that must be in
        Redis before any worker can pop the message (a stream's lease and log head): sent
        just before it, in the same round trip, once (not again when the publish is
        retried); a request with them is never bundled. They must be commands Redis
        cannot refuse: one that it does fails the call, though the message is queued.
        ``gather``: a caller that leads a flush lets others join it first (a turn of the
        hub); False when the caller knows nobody else in the process is mid-request.
        """
        queue = queue_name(model)
        if max_queue_size or before:
            bundling = None
        entry = _Pending(
            queue, payload, task_id, priority, reply_to, max_queue_size, bundling, before=before
        )
        if bundling is None:
            entry.raw = envelope(
                payload, task_id=task_id, queue=queue, priority=priority, reply_to=reply_to
            )
        with self._lock:
            self._queue.append(entry)
            leader = not self._flushing
            self._flushing = True
        timeline.stamp("publish.queued")
        if leader:
            if gather:
                # Let callers that are ready to publish too (other greenlets or threads
                # mid-request) join this flush before it goes: one round trip for all.
                time.sleep(0)
            self._flush()
        entry.done.wait()
        if entry.error is not None:
            raise entry.error
        return entry.raw if entry.result else None

    def _flush(self) -> None:
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._flushing = False
                    return
            try:
                messages = self._messages(batch)
                for message, r in zip(messages, self._run(messages), strict=True):
                    for e in message.entries:
                        e.result = bool(r)
            except BaseException as exc:  # every waiter learns of it, none hangs
                for e in batch:
                    e.error = exc
            for e in batch:
                e.done.set()

    def _messages(self, batch: list[_Pending]) -> list[_Publish]:
        """The messages that carry ``batch``: each request's own, but for bundles."""
        out: list[_Publish] = []
        groups: dict[tuple[str, int, str | None], list[_Pending]] = {}
        for e in batch:
            if e.bundling is None:
                out.append(self._single(e))
            else:
                groups.setdefault((e.queue, step_of(e.priority), e.reply_to), []).append(e)
        for group in groups.values():
            for chunk in _bundles(group):
                out.append(self._single(chunk[0]) if len(chunk) == 1 else self._bundle(chunk))
        return out

    def publish_bundle(
        self, model: str, payloads: list[dict], *, priority: int, reply_to: str | None
    ) -> bool:
        """Queue ``payloads`` as one bundle now, outside the group commit: for a caller that
        holds a batch's requests at once (bench/drain.py fills a queue so). False when
        Redis refused it."""
        queue = queue_name(model)
        entries = [
            _Pending(queue, p, str(p.get("id", "")), priority, reply_to, 0, Bundling(1, 1))
            for p in payloads
        ]
        message = self._single(entries[0]) if len(entries) == 1 else self._bundle(entries)
        return bool(self._run([message])[0])

    @staticmethod
    def _single(e: _Pending) -> _Publish:
        if not e.raw:
            e.raw = envelope(
                e.payload,
                task_id=e.task_id,
                queue=e.queue,
                priority=e.priority,
                reply_to=e.reply_to,
            )
        keys = [priority_key(e.queue, e.priority), *_publish_keys(e.queue)]
        args = [e.raw, e.max_queue_size, WAKE_CAP, "", "", step_of(e.priority)]
        return _Publish([e], keys, args, e.before)

    @staticmethod
    def _bundle(chunk: list[_Pending]) -> _Publish:
        first = chunk[0]
        tag = new_id()
        raw = bundle_envelope(
            [e.payload for e in chunk],
            task_id=tag,
            queue=first.queue,
            priority=first.priority,
            reply_to=first.reply_to,
        )
        deadlines = [float(e.payload.get("deadline") or 0) for e in chunk]
        latest = 0.0 if not all(deadlines) else max(deadlines)
        entry = bundle_entry(len(chunk) - 1, step_of(first.priority), latest)
        keys = [priority_key(first.queue, first.priority), *_publish_keys(first.queue)]
        return _Publish(chunk, keys, [raw, 0, WAKE_CAP, tag, entry, step_of(first.priority)])

    def _run(self, messages: list[_Publish]) -> list:
        with self._sending:  # the flush's leader, or a publish_bundle: one link, one at a time
            return self._send(messages)

    def _send(self, messages: list[_Publish]) -> list:
        for attempt in (0, 1):
            commands: list[tuple] = []
            at: list[int] = []  # where each message's publish is among the commands
            for m in messages:
                if not attempt:  # sent once: a retry only publishes again
                    commands.extend(m.before)
                at.append(len(commands))
                commands.append(("EVALSHA", self._script.sha, len(m.keys), *m.keys, *m.args))
            timeline.stamp("publish.sent")
            replies = self._link.pipeline(commands)
            timeline.stamp("publish.acked")
            errors = [r for r in replies if isinstance(r, redis.ResponseError)]
            results = [replies[i] for i in at]
            if not errors:
                return results
            if attempt or not all(isinstance(r, redis.exceptions.NoScriptError) for r in errors):
                raise errors[0]
            self.client.script_load(_PUBLISH_LUA)  # Redis restarted or flushed its scripts
        raise AssertionError("unreachable")


def _publish_keys(queue: str) -> list[str]:
    """The publish script's KEYS after the target sub-list."""
    return [wake_key(queue), bundled_key(queue), held_key(queue), UNACKED]


def _bundles(group: list[_Pending]) -> list[list[_Pending]]:
    """``group`` (requests of one queue, step and reply list, in order) cut into bundles
    of at most one batch's rows, ``BUNDLE_MAX_REQUESTS`` requests and ``BUNDLE_MAX_BYTES``
    (a request larger than that goes alone)."""
    out: list[list[_Pending]] = []
    rows = nbytes = 0
    for e in group:
        b = e.bundling
        assert b is not None
        fits = out and rows + b.rows <= b.max_rows and nbytes + b.nbytes <= BUNDLE_MAX_BYTES
        if fits and len(out[-1]) < BUNDLE_MAX_REQUESTS:
            out[-1].append(e)
            rows, nbytes = rows + b.rows, nbytes + b.nbytes
        else:
            out.append([e])
            rows, nbytes = b.rows, b.nbytes
    return out


def withdraw(client: redis.Redis, model: str, priority: int, raw: bytes) -> bool:
    """Take a message its caller gave up on back out of its queue, if no worker has
    popped it yet: True when it was still there (it will never run). The wake token it
    left wakes an idle worker for nothing, once."""
    return bool(client.lrem(priority_key(queue_name(model), priority), 1, raw))


@dataclass(frozen=True, slots=True)
class Decoded:
    """A message read back: its delivery tag, its requests' payloads (one, or a bundle's
    in the order they were queued), and whether kombu marked it redelivered."""

    tag: str
    payloads: list[dict]
    redelivered: bool
    bundle: bool  # a bundle's message (``BUNDLE_TASK_NAME``), even of one request

    @property
    def payload(self) -> dict:
        """The one request's payload; BadMessage for a bundle, where one is not expected."""
        if self.bundle:
            raise BadMessage("a bundle of requests where one request was expected")
        return self.payloads[0]


def decode(raw: bytes | str) -> Decoded:
    """A Celery envelope read back (``Decoded``). Never unpickles."""
    try:
        msg = orjson.loads(raw)
        props = msg["properties"]
        tag = props["delivery_tag"]
        if msg.get("content-type") != "application/x-msgpack":
            raise BadMessage(f"content type {msg.get('content-type')!r} is not accepted")
        body = msg["body"]
        if props.get("body_encoding") == "base64":
            body = base64.b64decode(body, validate=True)
        elif isinstance(body, str):
            body = body.encode("latin-1")
        args, _kwargs, _embed = msgpack.unpackb(body, raw=False, strict_map_key=True)
        bundle = msg.get("headers", {}).get("task") == BUNDLE_TASK_NAME
        payloads = args[0] if bundle else [args[0]]
        if not isinstance(payloads, list) or not 0 < len(payloads) <= BUNDLE_MAX_REQUESTS:
            raise BadMessage(f"a bundle holds 1 to {BUNDLE_MAX_REQUESTS} requests")
        if not all(isinstance(p, dict) for p in payloads):
            raise BadMessage("task argument is not a map")
        redelivered = bool(props.get("delivery_info", {}).get("redelivered"))
        return Decoded(str(tag), payloads, redelivered, bundle)
    except BadMessage:
        raise
    except Exception as exc:
        raise BadMessage(f"not a conch message: {exc}") from None


def touch(client: redis.Redis, tags: Iterable[str]) -> None:
    """Push back the visibility timeout of messages a live worker still holds."""
    tags = list(tags)
    if tags:
        now = time.time()
        client.zadd(UNACKED_INDEX, dict.fromkeys(tags, now), xx=True)


def job_running(client: redis.Redis, job_id: str) -> None:
    """A batch job's driver runs: its task message (delivery tag: the job id) counts in
    flight (``conch.wire.work_owed.jobs_owed``) while kombu holds it in ``unacked``."""
    client.sadd(in_flight_key(JOBS_QUEUE), job_id)


def job_ended(client: redis.Redis, job_id: str) -> None:
    """The driver is done (the count would forget the job once Celery acks it anyway)."""
    client.srem(in_flight_key(JOBS_QUEUE), job_id)


def new_id() -> str:
    """A request's or message's id: 128 random bits as 32 hex digits, the shape of a
    ``uuid4().hex``, made without building a UUID object on every request."""
    return os.urandom(16).hex()
