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
"""

from __future__ import annotations

import base64
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable

import msgpack
import orjson
import redis

from conch.wire.keys import (
    IN_FLIGHT_CLASS_SUFFIX,
    IN_FLIGHT_SUFFIX,
    PRIORITY_SEP,
    QUEUE_PREFIX,
    UNACKED_INDEX,
    WAKE_SUFFIX,
)
from conch.wire.keys import JOBS_QUEUE as JOBS_QUEUE  # the name its callers know
from conch.wire.messages import BadMessage
from conch.wire.redis_link import RedisLink

TASK_NAME = "conch.infer"
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


def priority_key(queue: str, priority: int) -> str:
    step = min(max(0, priority), PRIORITY_STEPS[-1])
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
    body = msgpack.packb([[payload], {}, _EMBED], use_bin_type=True)
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


# KEYS: the target sub-list, the wake list. ARGV: message, max length (0 = none), wake cap.
_PUBLISH_LUA = """
local limit = tonumber(ARGV[2])
if limit > 0 and redis.call('LLEN', KEYS[1]) >= limit then
  return 0
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[2], '1')
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
return 1
"""


class _Pending:
    __slots__ = ("args", "done", "error", "keys", "result")

    def __init__(self, keys: list[str], args: list) -> None:
        self.keys = keys
        self.args = args
        self.done = threading.Event()
        self.result = False
        self.error: BaseException | None = None


class Publisher:
    """The gateway's side of the model queues.

    Publishes are group-committed: whichever caller finds no flush under way sends
    every message queued meanwhile in one pipeline, so concurrent requests share round
    trips (and Redis's per-command work) instead of paying one each.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._script = client.register_script(_PUBLISH_LUA)
        self._link = RedisLink(client)
        self._lock = threading.Lock()
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
    ) -> bytes | None:
        """Queue one request and wake an idle worker: the message as queued (what
        ``withdraw`` takes), or None when the queue is full.

        The length check and the push are one script, so concurrent gateways cannot
        overfill a bounded queue.
        """
        queue = queue_name(model)
        raw = envelope(payload, task_id=task_id, queue=queue, priority=priority, reply_to=reply_to)
        entry = _Pending(
            [priority_key(queue, priority), wake_key(queue)], [raw, max_queue_size, WAKE_CAP]
        )
        with self._lock:
            self._queue.append(entry)
            leader = not self._flushing
            self._flushing = True
        if leader:
            # Let callers that are ready to publish too (other greenlets or threads
            # mid-request) join this flush before it goes: one round trip for all.
            time.sleep(0)
            self._flush()
        entry.done.wait()
        if entry.error is not None:
            raise entry.error
        return raw if entry.result else None

    def _flush(self) -> None:
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._flushing = False
                    return
            try:
                for e, r in zip(batch, self._run(batch), strict=True):
                    e.result = bool(r)
            except BaseException as exc:  # every waiter learns of it, none hangs
                for e in batch:
                    e.error = exc
            for e in batch:
                e.done.set()

    def _run(self, batch: list[_Pending]) -> list:
        for attempt in (0, 1):
            results = self._link.pipeline(
                [("EVALSHA", self._script.sha, len(e.keys), *e.keys, *e.args) for e in batch]
            )
            errors = [r for r in results if isinstance(r, redis.ResponseError)]
            if not errors:
                return results
            if attempt or not all(isinstance(r, redis.exceptions.NoScriptError) for r in errors):
                raise errors[0]
            self.client.script_load(_PUBLISH_LUA)  # Redis restarted or flushed its scripts
        raise AssertionError("unreachable")


def withdraw(client: redis.Redis, model: str, priority: int, raw: bytes) -> bool:
    """Take a message its caller gave up on back out of its queue, if no worker has
    popped it yet: True when it was still there (it will never run). The wake token it
    left wakes an idle worker for nothing, once."""
    return bool(client.lrem(priority_key(queue_name(model), priority), 1, raw))


def decode(raw: bytes | str) -> tuple[str, dict, bool]:
    """Celery envelope -> (delivery tag, our payload, redelivered). Never unpickles."""
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
        payload = args[0]
        if not isinstance(payload, dict):
            raise BadMessage("task argument is not a map")
        redelivered = bool(props.get("delivery_info", {}).get("redelivered"))
        return str(tag), payload, redelivered
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
    return uuid.uuid4().hex
