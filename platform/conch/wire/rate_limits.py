"""Triton's rate limiter across the fleet: resources counted in Redis, held by leases.

Triton's ``rate_limiter { resources [...] priority }`` (per instance group), under
``--rate-limit execution_count``, lets an instance execute only while it holds the copies
of each resource it lists, so models that share a resource never run more at once than
there are copies. Triton counts them inside one server. conch counts them in Redis, so the
limit holds over every worker:

- a resource marked ``global`` has one pool for the whole fleet on the Redis;
- any other resource has a pool per host and device, as Triton has one per device;
- a pool's copies are ``--rate-limit-resource name:count[:device]`` where given, else (as
  in Triton) the most any instance of the repository's models asks for.

A hold is a member of its pool's sorted set, scored by when its lease ends. Acquiring is
one Lua script over every pool an execution needs (all or none, so two executions never
deadlock holding half each); leases are renewed while the execution runs and dropped at
its end. A worker that dies holding copies stops renewing, and its holds are forgotten when
their leases end, so a SIGKILL cannot leak a resource. Redis's own clock times the leases,
so hosts' clocks need not agree.

Priority is Triton's: an instance of priority 2 gets about half the chances of one of
priority 1. Here a waiting instance tries again every ``RETRY_S`` times its priority.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import redis

from conch.wire.keys import RATE_LIMIT_PREFIX

log = logging.getLogger(__name__)

# How long a hold outlives its holder's last renewal: the longest a dead worker's copies
# stay taken. Renewed every third of it while the execution runs.
LEASE_S = 10.0
# How long a waiting instance of priority 1 sleeps between tries.
RETRY_S = 0.005

_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local used = 0
  for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    used = used + tonumber(string.match(member, '|(%d+)$'))
  end
  if used + tonumber(ARGV[1 + 2 * i]) > tonumber(ARGV[2 + 2 * i]) then
    return 0
  end
end
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + tonumber(ARGV[1]), ARGV[2] .. '|' .. ARGV[1 + 2 * i])
end
return 1
"""

_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + tonumber(ARGV[1]), ARGV[1 + i])
end
return 1
"""


@dataclass(frozen=True)
class ResourceNeed:
    """Copies of one resource an instance holds while it executes (Triton's
    ``rate_limiter.resources`` entry)."""

    name: str
    count: int
    shared: bool = False  # Triton's ``global``: one pool for the fleet


@dataclass(frozen=True)
class Pool:
    """Where one resource's copies are counted, and how many there are."""

    key: str
    capacity: int


def pool_key(need: ResourceNeed, host: str, device: int) -> str:
    if need.shared:
        return f"{RATE_LIMIT_PREFIX}global.{need.name}"
    return f"{RATE_LIMIT_PREFIX}host.{host}.{device}.{need.name}"


class Stopped(Exception):
    """A wait for resources given up because its ``stop`` was set: the block it guarded
    never ran, and must not run without its copies, so the caller hands its work back."""


@dataclass(frozen=True)
class Hold:
    """Copies held: the pools, and this hold's member in each."""

    keys: tuple[str, ...]
    members: tuple[str, ...]


class FleetLimiter:
    """Acquires and releases rate-limit resources for one worker process.

    ``capacity(need, device)`` says how many copies the resource's pool has (the same
    answer on every worker: from the flags and the repository, which they share). Without
    it, only ``try_hold`` on pools the caller names may be used (an ensemble's step slots,
    ``conch.frontend.ensemble_runner``).
    """

    def __init__(
        self,
        client: redis.Redis,
        capacity: Callable[[ResourceNeed, int], int] | None = None,
        *,
        host: str | None = None,
        lease_s: float = LEASE_S,
    ) -> None:
        self.client = client
        self.capacity = capacity
        self.host = host or socket.gethostname()
        self.lease_s = lease_s
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._held: dict[str, Hold] = {}
        self._lock = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._stopped = threading.Event()

    def pools(self, needs: Sequence[ResourceNeed], device: int) -> list[Pool]:
        assert self.capacity is not None, "a FleetLimiter without capacity holds named pools"
        capacity = self.capacity
        return [Pool(pool_key(n, self.host, device), capacity(n, device)) for n in needs]

    def try_acquire(self, needs: Sequence[ResourceNeed], device: int = 0) -> Hold | None:
        """The copies ``needs`` asks for, if every pool has them free now; else None."""
        return self.try_hold(self.pools(needs, device), [n.count for n in needs])

    def try_hold(self, pools: Sequence[Pool], counts: Sequence[int]) -> Hold | None:
        """``counts[i]`` copies of ``pools[i]``, for each, if every pool has them free now
        (all or none); else None. Held under a lease this limiter renews until ``release``."""
        holder = uuid.uuid4().hex
        args: list[object] = [self.lease_s, holder]
        for count, pool in zip(counts, pools, strict=True):
            args += [count, pool.capacity]
        if not self._acquire(keys=[p.key for p in pools], args=args):
            return None
        hold = Hold(
            tuple(p.key for p in pools),
            tuple(f"{holder}|{count}" for count in counts),
        )
        with self._lock:
            self._held[holder] = hold
            self._start_renewer()
        return hold

    def acquire(
        self,
        needs: Sequence[ResourceNeed],
        device: int = 0,
        *,
        priority: int = 1,
        stop: threading.Event | None = None,
    ) -> Hold | None:
        """Wait until the copies are held (None if ``stop`` is set first). The wait
        sleeps on ``stop`` itself, so setting it ends the wait at once."""
        wait = RETRY_S * max(1, priority)
        while True:
            if stop is not None and stop.is_set():
                return None
            hold = self.try_acquire(needs, device)
            if hold is not None:
                return hold
            pause = wait * random.uniform(0.5, 1.5)
            if stop is not None:
                stop.wait(pause)
            else:
                time.sleep(pause)

    def release(self, hold: Hold) -> None:
        with self._lock:
            self._held.pop(hold.members[0].partition("|")[0], None)
        pipe = self.client.pipeline(transaction=False)
        for key, member in zip(hold.keys, hold.members, strict=True):
            pipe.zrem(key, member)
        try:
            pipe.execute()
        except redis.RedisError:
            log.warning("rate limiter: could not release %s; its lease will end it", hold.keys)

    @contextlib.contextmanager
    def holding(
        self,
        needs: Sequence[ResourceNeed],
        device: int = 0,
        *,
        priority: int = 1,
        stop: threading.Event | None = None,
    ) -> Iterator[None]:
        """Run the block while holding the copies ``needs`` asks for. If ``stop`` is set
        before they are held, raise ``Stopped`` instead: running the block without them
        would break the limit the copies stand for."""
        hold = None
        if needs:
            hold = self.acquire(needs, device, priority=priority, stop=stop)
            if hold is None:
                raise Stopped("stopped while waiting for rate-limit resources")
        try:
            yield
        finally:
            if hold is not None:
                self.release(hold)

    def close(self) -> None:
        self._stopped.set()

    def _start_renewer(self) -> None:
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(
                target=self._renew_loop, name="rate-limit-leases", daemon=True
            )
            self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stopped.wait(self.lease_s / 3):
            with self._lock:
                holds = list(self._held.values())
            for hold in holds:
                try:
                    self._renew(keys=list(hold.keys), args=[self.lease_s, *hold.members])
                except redis.RedisError as exc:
                    log.warning("rate limiter: lease renewal failed: %s", exc)


__all__ = ["LEASE_S", "FleetLimiter", "Hold", "Pool", "ResourceNeed", "Stopped", "pool_key"]
