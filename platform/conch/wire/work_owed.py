"""The work a model's workers owe: the one signal workers are scaled on.

A model's workers owe every request waiting in any priority sub-list of its queue
(online levels, async jobs, offline work) plus every request a worker has popped and
not yet acked, whether it is running or only prefetched. A message holds one request,
but for a bundle (``conch.wire.broker``), whose requests beyond the first its entry in
the queue's bundle hash counts: as waiting, or as in flight while it is in ``unacked``. A list length alone is wrong
twice: kombu keeps each priority step in its own key, and popped work leaves the list,
so busy workers would look idle and be scaled down mid-batch.

Messages in flight are kombu's ``unacked`` hash, one hash for every queue. Its values
hold whole messages (tensors included), so counting them by routing key would read
every byte in flight on every poll. Instead the worker's pop script also adds each tag
it registers in ``unacked`` to its queue's in-flight set (``broker.in_flight_key``), and
its ack takes the tag out again; ``work_owed`` counts the tags of that set still in
``unacked`` (O(messages in flight), no message read) and forgets the others. That
reconciliation is what keeps the count right when kombu restores an expired message
(it moves the message from ``unacked`` back to the list, and knows nothing of the set):
the tag then counts as waiting, not in flight, and is counted in flight again only once
a worker pops it again. Lists, set and hash are read in one script, so a message moving
between them is counted once, never twice or not at all.

Batch jobs owe work too, to whichever worker takes them: every worker's Celery consumer
reads ``conch.jobs``, so a job waiting there counts for no model, and a group at zero
would never start the worker that runs it. ``jobs_owed`` counts that queue the same way:
its priority sub-lists, plus the jobs whose driver runs. A driver adds its job id (its
task message's delivery tag) to the jobs queue's in-flight set while it runs
(``broker.job_running``); the count reconciles it with ``unacked`` as above, so a driver
that crashed is counted until kombu restores its message (then as waiting, once) and
is never leaked: no clock, heartbeat age or second writer to trust.

``desired_workers`` is the scaling formula, shared by the local autoscaler and the
chart's KEDA trigger (``metrics-api``, ``AverageValue``), which reads ``QUEUE_DEPTH_PATH``
on the gateway's metrics port.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any
from urllib.parse import quote, urlencode

import redis

from conch.core.repository_keys import is_model_name
from conch.wire.broker import (
    ONLINE_STEPS,
    PRIORITY_ASYNC,
    PRIORITY_CLASSES,
    PRIORITY_OFFLINE,
    PRIORITY_STEPS,
    bundled_key,
    in_flight_class_key,
    in_flight_key,
    model_of_key,
    priority_keys,
    queue_name,
    step_class,
)
from conch.wire.keys import JOBS_QUEUE, QUEUE_PREFIX, UNACKED
from conch.wire.sequences import live_key

# The wire contract with KEDA's metrics-api trigger: GET this on the metrics port, with
# JOBS_PARAM=1 to count the batch jobs queue too (the group that runs jobs).
QUEUE_DEPTH_PATH = "/queue-depth"
JOBS_PARAM = "jobs"
# The waiting work by kind, as the Prometheus gauge labels it (``priority_class``).
ONLINE, ASYNC, OFFLINE = PRIORITY_CLASSES
_MODELS_PER_CALL = 64  # models counted by one script run (Redis runs nothing else meanwhile)
_SREM_CHUNK = 1000  # tags per SREM: Lua's unpack has a stack limit
# A bundle's entry outlives its latest deadline by this much (then its requests would be
# dropped the moment a worker popped them): one a purge took away is forgotten then.
BUNDLE_FORGET_AFTER_S = 60

# KEYS: unacked, then per queue its in-flight set, that set's class hash, its model's
# live sequences (a zset, conch.wire.sequences), its bundle hash (broker.bundled_key) and
# its priority sub-lists in order.
# ARGV: the number of sub-lists per queue, now, how long past its deadline a bundle's
# entry is kept, then each sub-list's class (broker.step_class). Returns per queue each
# sub-list's requests waiting (its length, plus the bundles' requests beyond their
# first), the requests in flight (the tags of its set still in unacked, tags no longer
# there forgotten, plus their bundles' requests beyond the first) by class (online,
# async, offline; a tag with no class counts online), then its live sequences.
_COUNT_LUA = """
local steps = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local forget = tonumber(ARGV[3])
local out = {}
local i = 2
while i <= #KEYS do
  local held, gone = {online = 0, async = 0, offline = 0}, {}
  for _, tag in ipairs(redis.call('SMEMBERS', KEYS[i])) do
    if redis.call('HEXISTS', KEYS[1], tag) == 1 then
      local class = redis.call('HGET', KEYS[i + 1], tag)
      if not held[class] then class = 'online' end
      held[class] = held[class] + 1
    else
      gone[#gone + 1] = tag
    end
  end
  for j = 1, #gone, %d do
    local chunk = {unpack(gone, j, math.min(j + %d - 1, #gone))}
    redis.call('SREM', KEYS[i], unpack(chunk))
    redis.call('HDEL', KEYS[i + 1], unpack(chunk))
  end
  local extra = {}
  for s = 1, steps do extra[s] = 0 end
  local bundled = redis.call('HGETALL', KEYS[i + 3])
  for j = 1, #bundled, 2 do
    local tag = bundled[j]
    local more, step, deadline = string.match(bundled[j + 1], '^(%%d+) (%%d+) ([%%d.]+)$')
    more, step, deadline = tonumber(more), tonumber(step), tonumber(deadline)
    if not more or step >= steps or (deadline > 0 and deadline < now - forget) then
      redis.call('HDEL', KEYS[i + 3], tag)
    elseif redis.call('HEXISTS', KEYS[1], tag) == 1 then
      local class = ARGV[4 + step]
      held[class] = held[class] + more
    else
      extra[step + 1] = extra[step + 1] + more
    end
  end
  for s = 1, steps do
    out[#out + 1] = redis.call('LLEN', KEYS[i + 3 + s]) + extra[s]
  end
  out[#out + 1] = held['online']
  out[#out + 1] = held['async']
  out[#out + 1] = held['offline']
  out[#out + 1] = redis.call('ZCARD', KEYS[i + 2])
  i = i + 4 + steps
end
return out
""" % (_SREM_CHUNK, _SREM_CHUNK)  # noqa: UP031 (Lua braces would need escaping in f-strings)


class _Owed:
    """What a queue's workers owe: ``waiting`` plus ``in_flight``."""

    waiting: int
    in_flight: int

    sequences: int = 0

    @property
    def owed(self) -> int:
        return self.waiting + self.in_flight + self.sequences

    def totals(self) -> dict[str, int]:
        out = {"owed": self.owed, "waiting": self.waiting, "in_flight": self.in_flight}
        if self.sequences:
            out["sequences"] = self.sequences
        return out


@dataclass(frozen=True)
class ModelWork(_Owed):
    """What one model's workers owe, at one instant."""

    model: str
    waiting: int  # in every priority sub-list of its queue
    in_flight: int  # popped by a worker (running or prefetched), not acked
    steps: tuple[int, ...] = ()  # waiting per priority step, 0 (highest) first
    # A sequence model's live sequences: each holds (or waits for) a worker's slot until
    # it ends or idles out, so scaling down must not strand it.
    sequences: int = 0
    held: tuple[int, int, int] = (0, 0, 0)  # in flight: online, async, offline

    def by_class(self) -> dict[str, int]:
        """Waiting work as online requests, async jobs and offline work (batch jobs'
        messages)."""
        steps = self.steps or (0,) * len(PRIORITY_STEPS)
        return {
            ONLINE: sum(steps[:ONLINE_STEPS]),
            ASYNC: steps[PRIORITY_ASYNC],
            OFFLINE: steps[PRIORITY_OFFLINE],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.totals(),
            "waiting_by_class": self.by_class(),
            "in_flight_by_class": dict(zip(PRIORITY_CLASSES, self.held, strict=True)),
        }


@dataclass(frozen=True)
class JobsWork(_Owed):
    """What the batch jobs queue (``conch.jobs``) owes, at one instant: jobs no worker
    has taken yet, and jobs whose driver runs on a worker."""

    waiting: int  # in every priority sub-list of the jobs queue
    in_flight: int  # taken by a worker whose driver runs them (or ran them and died)

    def to_json(self) -> dict[str, Any]:
        return self.totals()


def _count(
    client: redis.Redis, queues: list[tuple[str, str]]
) -> list[tuple[tuple[int, ...], tuple[int, int, int], int]]:
    """(waiting per priority step, in flight by class, live sequences) of each (queue,
    its live sequences' key), in one script run."""
    keys: list[str] = [UNACKED]
    for queue, live in queues:
        keys += [in_flight_key(queue), in_flight_class_key(queue), live, bundled_key(queue)]
        keys += priority_keys(queue)
    script = client.register_script(_COUNT_LUA)
    classes = [step_class(step) for step in PRIORITY_STEPS]
    args = [len(PRIORITY_STEPS), time.time(), BUNDLE_FORGET_AFTER_S, *classes]
    flat = [int(v) for v in script(keys=keys, args=args)]
    width = len(PRIORITY_STEPS) + 4
    rows = (flat[k * width : (k + 1) * width] for k in range(len(queues)))
    return [(tuple(row[:-4]), (row[-4], row[-3], row[-2]), row[-1]) for row in rows]


def work_owed(client: redis.Redis, models: Iterable[str]) -> dict[str, ModelWork]:
    """Each model's work owed, in the order given (a name given twice counts once)."""
    names = list(dict.fromkeys(models))
    out: dict[str, ModelWork] = {}
    for first in range(0, len(names), _MODELS_PER_CALL):
        chunk = names[first : first + _MODELS_PER_CALL]
        counts = _count(client, [(queue_name(n), live_key(n)) for n in chunk])
        for name, (steps, held, live) in zip(chunk, counts, strict=True):
            out[name] = ModelWork(name, sum(steps), sum(held), steps, live, held)
    return out


def jobs_owed(client: redis.Redis) -> JobsWork:
    """The batch jobs queue's work owed (every worker's Celery consumer takes it)."""
    ((steps, held, _),) = _count(client, [(JOBS_QUEUE, live_key(JOBS_QUEUE))])
    return JobsWork(sum(steps), sum(held))


def queued_models(client: redis.Redis) -> list[str]:
    """Models with any key of their queue in Redis: something waits, or was in flight
    when last counted. A SCAN of the whole database, for tools run by hand; servers know
    their models from the repository."""
    names = set()
    for key in client.scan_iter(match=QUEUE_PREFIX + "*", count=1000):
        name = model_of_key(key.decode("utf-8", "replace") if isinstance(key, bytes) else key)
        if name is not None and is_model_name(name):
            names.add(name)
    return sorted(names)


def summary(
    work: Mapping[str, ModelWork],
    jobs: JobsWork | None = None,
    where: Mapping[str, Mapping[str, list[str]]] | None = None,
) -> dict[str, Any]:
    """The JSON of ``GET /queue-depth`` and ``conch queue-depth --json``: totals, by model,
    and the batch jobs queue when it was counted (then in the totals too). ``where``
    (``worker_reports.residency``) adds each model's ``resident_on`` and ``standby_on``
    worker ids."""
    parts: list[_Owed] = [*work.values(), *([jobs] if jobs is not None else [])]
    out: dict[str, Any] = {
        "owed": sum(w.owed for w in parts),
        "waiting": sum(w.waiting for w in parts),
        "in_flight": sum(w.in_flight for w in parts),
        "models": {
            name: {**w.to_json(), **(where or {}).get(name, {})} for name, w in work.items()
        },
    }
    live = sum(w.sequences for w in parts)
    if live:  # sequence models' live sequences, in "owed" too
        out["sequences"] = live
    if jobs is not None:
        out["jobs"] = jobs.to_json()
    return out


def desired_workers(
    owed: int,
    target_per_worker: float,
    minimum: int,
    maximum: int,
    activation: int = 0,
) -> int:
    """Workers for ``owed`` work: ceil(owed / target), within [minimum, maximum].

    With ``minimum`` 0 a group is at zero while the work owed is at most ``activation``,
    and at least one worker once it is more (KEDA's activation, then its HPA's
    ``AverageValue``: ceil(metric / target)). The target is taken as the decimal it was
    written as, so 3 owed at a target of 0.3 is 10 workers, not 11.
    """
    if not target_per_worker > 0:
        raise ValueError(f"target work per worker must be above 0, not {target_per_worker}")
    if not 0 <= minimum <= maximum:
        raise ValueError(f"need 0 <= minimum <= maximum, not {minimum} and {maximum}")
    if owed <= activation and minimum == 0:
        return 0
    target = Fraction(target_per_worker).limit_denominator(1_000_000)
    wanted = math.ceil(Fraction(max(0, owed)) / target)
    if owed > activation:
        wanted = max(wanted, 1)
    return min(max(wanted, minimum), maximum)


def queue_depth_url(base: str, models: Iterable[str], jobs: bool = False) -> str:
    """``GET /queue-depth`` of the gateway's metrics port at ``base`` (``http://host:8002``)
    for these models (none: every model the gateway knows), names URL-encoded; with
    ``jobs``, the batch jobs queue counted too (the URL of the group that runs jobs)."""
    params = [("model", m) for m in models] + ([(JOBS_PARAM, "1")] if jobs else [])
    query = urlencode(params, quote_via=quote, safe="")
    return base.rstrip("/") + QUEUE_DEPTH_PATH + (f"?{query}" if query else "")


__all__ = [
    "ASYNC",
    "JOBS_PARAM",
    "OFFLINE",
    "ONLINE",
    "PRIORITY_CLASSES",
    "QUEUE_DEPTH_PATH",
    "JobsWork",
    "ModelWork",
    "desired_workers",
    "jobs_owed",
    "queue_depth_url",
    "queued_models",
    "summary",
    "work_owed",
]
