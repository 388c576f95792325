"""The shared response cache's store in Redis (``--cache-config redis,...``).

Every gateway and gRPC server of a cluster reads and fills the same entries, so an
answer computed behind one frontend is a hit behind all of them (Triton's redis cache
does the same for its servers). The Redis may well be the broker, whose eviction
policy has to stay ``noeviction`` (a queue must never lose a message), so the bound
is kept here: each entry's size and last use are recorded, and the insert script
evicts the least recently used entries until the bytes held fit under the bound. Both
scripts run atomically, so frontends never race on the bookkeeping. Keys are in
``conch.wire.keys``; values are opaque bytes to this module.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from conch.core.cache_config import CacheConfig
from conch.wire.keys import CACHE_BYTES, CACHE_CLOCK, CACHE_ENTRY_PREFIX, CACHE_LRU, CACHE_SIZES
from conch.wire.redis_client import CONNECT_TIMEOUT_S, POOL_MAX_CONNECTIONS

# A cache call waits this long for Redis at most, unless socket_timeout says otherwise:
# a slow cache must cost a request a miss, never its deadline.
DEFAULT_SOCKET_TIMEOUT_S = 1.0

# KEYS: entry, lru, clock. ARGV: the entry's hash. A hit is marked as used now.
_GET_LUA = """
local value = redis.call('GET', KEYS[1])
if value then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
end
return value
"""

# KEYS: entry, lru, sizes, clock, bytes. ARGV: hash, value, bound, entry prefix.
# Returns {stored (0|1), entries evicted}.
_PUT_LUA = """
local size = string.len(ARGV[2])
local bound = tonumber(ARGV[3])
if size > bound then
  return {0, 0}
end
local old = redis.call('HGET', KEYS[3], ARGV[1])
if old then
  redis.call('DECRBY', KEYS[5], old)
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], size)
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[1])
local held = redis.call('INCRBY', KEYS[5], size)
local evicted = 0
while held > bound do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not oldest then
    break
  end
  local freed = tonumber(redis.call('HGET', KEYS[3], oldest) or '0')
  redis.call('ZREM', KEYS[2], oldest)
  redis.call('HDEL', KEYS[3], oldest)
  redis.call('DEL', ARGV[4] .. oldest)
  held = redis.call('DECRBY', KEYS[5], freed)
  evicted = evicted + 1
end
return {1, evicted}
"""


def entry_key(digest: str) -> str:
    return CACHE_ENTRY_PREFIX + digest


class RedisCacheStore:
    """Entries by hash (hex) in one Redis, at most ``max_bytes`` of values in all."""

    def __init__(self, client: redis.Redis, max_bytes: int) -> None:
        self.client = client
        self.max_bytes = max_bytes
        self._get = client.register_script(_GET_LUA)
        self._put = client.register_script(_PUT_LUA)

    def get(self, digest: str) -> bytes | None:
        value = self._get(keys=[entry_key(digest), CACHE_LRU, CACHE_CLOCK], args=[digest])
        return None if value is None else bytes(value)

    def put(self, digest: str, value: bytes) -> tuple[bool, int]:
        """Store ``value`` (not when it alone is over the bound): (stored, entries evicted)."""
        stored, evicted = self._put(
            keys=[entry_key(digest), CACHE_LRU, CACHE_SIZES, CACHE_CLOCK, CACHE_BYTES],
            args=[digest, value, self.max_bytes, CACHE_ENTRY_PREFIX],
        )
        return bool(stored), int(evicted)

    def held_bytes(self) -> int:
        return int(self.client.get(CACHE_BYTES) or 0)


def open_store(config: CacheConfig) -> RedisCacheStore:
    """The store a ``redis`` cache config names, its client's timeouts in Triton's
    milliseconds (0: wait as long as it takes, as Triton's)."""
    values = config.values

    def seconds(key: str, default: float) -> float | None:
        if key not in values:
            return default
        ms = config.number(key)
        return ms / 1000 if ms else None

    options: dict[str, Any] = {
        "host": values["host"],
        "port": config.number("port"),
        "db": config.number("db"),
        "username": values.get("user"),
        "password": values.get("password"),
        "socket_connect_timeout": seconds("connect_timeout", CONNECT_TIMEOUT_S),
        "socket_timeout": seconds("socket_timeout", DEFAULT_SOCKET_TIMEOUT_S),
        "max_connections": POOL_MAX_CONNECTIONS,
        # A cache that fails is a miss at once: no retries with backoff (redis-py's
        # default), which would hold the request that only wanted a lookup.
        "retry": Retry(NoBackoff(), 0),
    }
    return RedisCacheStore(redis.Redis(**options), config.size)


__all__ = ["DEFAULT_SOCKET_TIMEOUT_S", "RedisCacheStore", "entry_key", "open_store"]
