"""The worker's half of the model queues: block, pop a batch atomically (each message a
``Popped``), ack, requeue, dead-letter.

The key layout, the envelope and the wake tokens are the contract in
``conch.wire.broker``, shared with the producer; what is here only the consumer runs.
The pop script lives here, beside ``Drain``, for that reason: the producer never pops,
and a script kept next to the one class that registers it is read with the code that
relies on its KEYS and ARGV. ``broker.touch`` stays in the wire module because both ends
use it (the worker's heartbeat, and a batch job's keepalive for its own task).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis

from conch.core import timeline
from conch.wire import statistics
from conch.wire.broker import (
    PRIORITY_STEPS,
    WAKE_CAP,
    bundled_key,
    envelope,
    held_key,
    in_flight_class_key,
    in_flight_key,
    priority_key,
    priority_keys,
    queue_name,
    step_class,
    wake_key,
)
from conch.wire.keys import ATTEMPTS, DEADLETTER, UNACKED, UNACKED_INDEX
from conch.wire.redis_link import CommandQueue, RedisLink
from conch.worker.wake_wait import REDIS_TICK_S, WakeWait

# Each priority sub-list's class, as the pop records it beside a tag it takes.
_CLASSES = [step_class(step) for step in PRIORITY_STEPS]


# KEYS: wake, unacked, unacked_index, attempts, the queue's in-flight set and its class
# hash, its bundle hash, its held hash, then the priority sub-lists in order (the last:
# offline work, batch jobs' messages).
# ARGV: max count of requests (a bundle counts its requests: broker.bundled_key), now,
# routing key, wake cap, max count from the last sub-list (-1: any), whether the offline
# messages left there are held back (1: not counted as waiting, nor given wake tokens; 0:
# merely not taken by this pop), whether each message taken is marked held with its step
# (1: the queue is bounded, broker.held_key), then each sub-list's class
# (broker.step_class), in order: ARGV[i - 1] is KEYS[i]'s.
# While any bundle is queued or in flight, messages are popped one at a time, so a pop
# stops at its count of requests (overshooting by at most one bundle); else in one RPOP.
_POP_LUA = """
local n = tonumber(ARGV[1])
local offline = tonumber(ARGV[5])
local held = ARGV[6] == '1'
local out = {}
local waiting = 0
local rk = cjson.encode(ARGV[3])
local bundles = redis.call('HLEN', KEYS[7]) > 0
local hold = ARGV[7] == '1'
local function register(raw, class, step)
  -- A plain find, then a match anchored where it ends: a pattern search alone
  -- tries its %s* at every byte of the base64 body before the tag.
  local tag = nil
  local _, at = string.find(raw, '"delivery_tag":', 1, true)
  if at then tag = string.match(raw, '^%s*"([^"]+)"', at + 1) end
  if not tag then
    local ok, m = pcall(cjson.decode, raw)
    if ok and type(m) == 'table' and type(m['properties']) == 'table' then
      tag = m['properties']['delivery_tag']
    end
  end
  if type(tag) ~= 'string' then tag = 'conch-untagged-' .. redis.call('INCR', 'conch.untagged') end
  redis.call('ZADD', KEYS[3], ARGV[2], tag)
  redis.call('HSET', KEYS[2], tag, '[' .. raw .. ',"",' .. rk .. ']')
  redis.call('SADD', KEYS[5], tag)
  redis.call('HSET', KEYS[6], tag, class)
  if hold then redis.call('HSET', KEYS[8], tag, step) end
  out[#out + 1] = tag
  out[#out + 1] = raw
  out[#out + 1] = redis.call('HINCRBY', KEYS[4], tag, 1)
  return tag
end
for i = 9, #KEYS do
  local key = KEYS[i]
  local step = i - 9
  local take = n
  if i == #KEYS and offline >= 0 then take = math.min(n, offline) end
  if take > 0 and bundles then
    while take > 0 do
      local raw = redis.call('RPOP', key)
      if not raw then break end
      local entry = redis.call('HGET', KEYS[7], register(raw, ARGV[i - 1], step))
      local requests = 1 + (entry and tonumber(string.match(entry, '^%d+')) or 0)
      take = take - requests
      n = n - requests
    end
  elseif take > 0 then
    local items = redis.call('RPOP', key, take)
    if items then
      for _, raw in ipairs(items) do register(raw, ARGV[i - 1], step) end
      n = n - #items
    end
  end
  if i < #KEYS or offline < 0 or not held then
    -- offline messages held back (offline >= 0, held) wait for no pop: no wake tokens
    waiting = waiting + redis.call('LLEN', key)
  end
end
redis.call('DEL', KEYS[1])
if waiting > 0 then
  local t = {}
  for j = 1, math.min(waiting, tonumber(ARGV[4])) do t[j] = '1' end
  redis.call('LPUSH', KEYS[1], unpack(t))
end
table.insert(out, 1, waiting)
return out
"""


@dataclass(frozen=True, slots=True)
class Popped:
    """A message a pop took: registered in flight under its tag, not yet decoded."""

    tag: str  # its delivery tag: the key of its in-flight records, and of its ack
    raw: bytes  # the envelope as it was queued (dead-lettered as is when it is bad)
    attempts: int  # its deliveries, this one included: more than one came back


class Drain:
    """The worker's side of one model queue: block, pop a batch atomically, ack.

    ``hold``: the queue is bounded (a ``max_queue_size``), so each message a pop takes is
    marked held (``broker.held_key``) until its batch runs (``release``) or it is acked:
    a request its batch holds still counts against the bound, as in Triton.
    """

    def __init__(self, client: redis.Redis, model: str, *, hold: bool = False) -> None:
        self.client = client
        self.queue = queue_name(model)
        self.hold = hold
        self.keys = [
            wake_key(self.queue),
            UNACKED,
            UNACKED_INDEX,
            ATTEMPTS,
            in_flight_key(self.queue),
            in_flight_class_key(self.queue),
            bundled_key(self.queue),
            held_key(self.queue),
            *priority_keys(self.queue),
        ]
        self._pop = client.register_script(_POP_LUA)
        self._link = RedisLink(client)
        self._short = WakeWait(client, f"conch-wait:{self.queue}")  # waits of a few ticks
        self.waiting = 0

    def wait(self, timeout: float) -> bool:
        """Block until a wake token comes (True: a message may be waiting), or about
        ``timeout`` seconds pass (False: none was published meanwhile).

        A wait of a few of Redis's clock ticks or less (a batch waiting out its queue
        delay) is a ``WakeWait``'s; the unblock it may leave to send rides with the next
        commands this drain sends.
        """
        if timeout > 2 * REDIS_TICK_S:
            block = round(timeout - REDIS_TICK_S, 3)
            woke = self._round_trip([("BLPOP", self.keys[0], block)], wait_s=block)[-1]
            timeline.stamp("worker.woke")
            return woke is not None
        return self._short.wait([self.keys[0]], timeout)

    def _round_trip(self, commands: list[tuple], wait_s: float = 0.0) -> list:
        """``commands`` sent after the unblock a lapsed short wait needs, if any."""
        return self._link.pipeline([*self._short.unblock(), *commands], wait_s=wait_s)

    def pop(self, count: int, offline: int | None = None, held: bool = True) -> list[Popped]:
        """Messages of up to ``count`` requests (a bundle counts its requests, and the last
        one taken may overshoot), registered in flight, at most ``offline`` of them
        offline (batch jobs' messages; None: as many as come). ``held``: the offline
        messages left are held back (``OfflineShare``), not waiting, rather than only not
        taken now.

        ``self.waiting`` is then the number of messages still queued behind them.
        """
        if count <= 0:
            return []
        args = self._args(count, offline, held)
        got = self._round_trip([("EVALSHA", self._pop.sha, len(self.keys), *self.keys, *args)])[-1]
        if isinstance(got, redis.exceptions.NoScriptError):  # Redis restarted or flushed
            return self._unpack(self._pop(keys=self.keys, args=args))
        if isinstance(got, BaseException):
            raise got
        if len(got) > 1:  # it took messages
            timeline.stamp("worker.popped")
        return self._unpack(got)

    def queue_pop(
        self, pipe: CommandQueue, count: int, offline: int | None = None, held: bool = True
    ) -> None:
        """Queue a pop on ``pipe``, to share the round trip of the replies before it.

        ``popped`` reads its result. The script goes by SHA alone: redis-py's own
        pipelined scripts ask ``SCRIPT EXISTS`` first, a round trip of its own.
        """
        for command in self._short.unblock():
            pipe.execute_command(*command)
        pipe.execute_command(
            "EVALSHA", self._pop.sha, len(self.keys), *self.keys, *self._args(count, offline, held)
        )

    def popped(
        self, result: object, count: int, offline: int | None = None, held: bool = True
    ) -> list[Popped]:
        """The messages a ``queue_pop`` took, given its slot of the pipeline's results."""
        if isinstance(result, redis.exceptions.NoScriptError):  # Redis restarted or flushed
            return self.pop(count, offline, held)
        if isinstance(result, BaseException):
            raise result
        return self._unpack(result)

    def _args(self, count: int, offline: int | None = None, held: bool = True) -> list:
        offline_arg = -1 if offline is None else max(0, offline)
        flags = [offline_arg, int(held), int(self.hold)]
        return [count, time.time(), self.queue, WAKE_CAP, *flags, *_CLASSES]

    def release(self, tags: Iterable[str]) -> None:
        """The batch of these popped messages runs now: they leave the queue's bound."""
        tags = list(tags)
        if self.hold and tags:
            self._link.call("HDEL", held_key(self.queue), *tags)

    def _unpack(self, flat: list) -> list[Popped]:
        self.waiting = int(flat[0])
        return [Popped(_s(flat[i]), flat[i + 1], int(flat[i + 2])) for i in range(1, len(flat), 3)]


def requeue(
    pipe: CommandQueue,
    queue: str,
    payload: dict,
    *,
    tag: str,
    priority: int,
    reply_to: str | None,
    head: bool,
) -> None:
    """Put a popped request back: at the head (next to run) or the tail of a sub-list."""
    raw = envelope(payload, task_id=tag, queue=queue, priority=priority, reply_to=reply_to)
    key = priority_key(queue, priority)
    pipe.rpush(key, raw) if head else pipe.lpush(key, raw)
    pipe.lpush(wake_key(queue), "1")
    pipe.ltrim(wake_key(queue), 0, WAKE_CAP - 1)


def ack(pipe: CommandQueue, queue: str, tags: Iterable[str]) -> None:
    """Forget delivered messages of ``queue``: kombu's ack, our attempt counter, the
    queue's in-flight set and its bundle hash (``conch.wire.work_owed``), and its held
    hash."""
    tags = list(tags)
    if tags:
        pipe.zrem(UNACKED_INDEX, *tags)
        pipe.hdel(UNACKED, *tags)
        pipe.hdel(ATTEMPTS, *tags)
        pipe.srem(in_flight_key(queue), *tags)
        pipe.hdel(in_flight_class_key(queue), *tags)
        pipe.hdel(bundled_key(queue), *tags)
        pipe.hdel(held_key(queue), *tags)


def dead_letter(pipe: CommandQueue, model: str, tag: str, raw: bytes | str, reason: str) -> None:
    """Set a message aside for good (``conch.deadletter``, the newest 10000), and count it
    under its model (``conch_dead_letters_total``)."""
    statistics.count_model(pipe, model, statistics.DEAD_LETTERED)
    pipe.lpush(
        DEADLETTER,
        json.dumps(
            {
                "tag": tag,
                "reason": reason,
                "at": time.time(),
                "message": raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw,
            }
        ),
    )
    pipe.ltrim(DEADLETTER, 0, 9999)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
