"""Triton's response cache, kept by the frontends: a repeated request is answered
without reaching the model's queue.

A model uses it when the frontend has a cache (``--cache-config``,
``conch.core.cache_config``) and the model's config sets ``response_cache { enable:
true }``, as in Triton. The gateway and the gRPC server look a request up after it is
checked and before it is queued; a hit is answered from the entry, a miss runs as
usual and its successful answer is stored. Ensemble steps are looked up the same way
(``frontend.ensemble_runner``), each under its own model's setting.

- **Key.** A 256-bit BLAKE2b over the model, the version resolved, every input's name,
  datatype, shape and bytes (by name), the outputs asked for, and the parameters the
  model sees (a Python model may read them; Triton's key leaves them out, conch keeps
  such answers apart). The binary/JSON choice and classification are applied when the
  answer is encoded, after the cache, so they share an entry.
- **Value.** The answer's version and raw output tensors, in msgpack (never pickle),
  checked as untrusted when read back: a shared Redis is written by other processes.
- **Stores.** ``LocalStore``, per process, least recently used out first to stay within
  its bytes; or ``conch.wire.cache_store.RedisCacheStore``, one for the cluster.
- **Failures.** Errors are never stored. A store that fails (Redis down, a bad entry) is
  logged and counted (``cache_error``), and the request runs as a miss: the cache can
  slow a request, never fail it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
import redis

from conch.core.cache_config import LOCAL, CacheConfig
from conch.wire import cache_store, statistics
from conch.wire.messages import MAX_TENSORS, BadMessage, InferMessage, WireTensor, read_tensor

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)


class Store(Protocol):
    """Entries by request hash (hex)."""

    def get(self, digest: str) -> bytes | None: ...

    def put(self, digest: str, value: bytes) -> tuple[bool, int]:
        """(stored, entries evicted to make room)."""
        ...


class LocalStore:
    """One process's entries, at most ``max_bytes`` of values, least recently used out
    first. A lock guards it: the gRPC server calls from threads (the gateway's greenlets
    never yield inside)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: str) -> bytes | None:
        with self._lock:
            value = self._entries.get(digest)
            if value is not None:
                self._entries.move_to_end(digest)
            return value

    def put(self, digest: str, value: bytes) -> tuple[bool, int]:
        if len(value) > self.max_bytes:
            return False, 0
        evicted = 0
        with self._lock:
            old = self._entries.pop(digest, None)
            if old is not None:
                self.held -= len(old)
            self._entries[digest] = value
            self.held += len(value)
            while self.held > self.max_bytes:
                _, oldest = self._entries.popitem(last=False)
                self.held -= len(oldest)
                evicted += 1
        return True, evicted


def request_key(
    model: str,
    version: int,
    inputs: Iterable[WireTensor],
    outputs: Sequence[str],
    params: dict[str, Any],
) -> str:
    """The hash (hex) a request is cached under (see the module docstring)."""
    h = hashlib.blake2b(digest_size=32, person=b"conch.cache.v1")

    def part(data: bytes) -> None:  # length-prefixed: no two requests hash one stream
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(model.encode())
    part(str(version).encode())
    for name, datatype, shape, raw in sorted(inputs, key=lambda t: t.name):
        part(name.encode())
        part(datatype.encode())
        part(",".join(map(str, shape)).encode())
        part(raw)
    part("\0".join(outputs).encode())
    part(msgpack.packb(sorted(params.items()), use_bin_type=True, default=repr))
    return h.hexdigest()


def pack(version: int, outputs: Sequence[WireTensor]) -> bytes:
    return msgpack.packb([version, [list(t) for t in outputs]], use_bin_type=True)


def unpack(data: bytes) -> tuple[int, list[WireTensor]]:
    """(version, outputs) of an entry; ``BadMessage`` for anything else."""
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise BadMessage(f"undecodable cache entry: {exc}") from None
    if not isinstance(body, list) or len(body) != 2:
        raise BadMessage("cache entry is not [version, outputs]")
    version, outputs = body
    if not isinstance(version, int) or not isinstance(outputs, list) or len(outputs) > MAX_TENSORS:
        raise BadMessage("cache entry is not [version, outputs]")
    return version, [read_tensor(t) for t in outputs]


@dataclass
class Lookup:
    """One request's trip to the cache: its key, and what it cost so far."""

    model: str
    version: int
    digest: str
    took_ns: int  # lookup (and extraction, on a hit)
    errors: int = 0
    found: tuple[int, list[WireTensor]] | None = None  # (version, outputs) on a hit


class ResponseCache:
    """A frontend's cache over ``store``; its counters go to the statistics in ``stats``."""

    def __init__(self, store: Store, stats: redis.Redis, description: str) -> None:
        self.store = store
        self.stats = statistics.Tally(stats)  # a hit makes no Redis call of its own
        self.description = description

    def flush(self) -> None:
        """Write the counters this process has added up (before it reads statistics)."""
        try:
            self.stats.flush()
        except redis.RedisError as exc:
            log.warning("response cache: statistics not written yet: %s", exc)

    @staticmethod
    def applies(config: ModelConfig) -> bool:
        """The model's config enables the cache (load refuses it for decoupled models)."""
        return config.response_cache.enable

    def lookup(
        self,
        model: str,
        version: int,
        inputs: Iterable[WireTensor],
        outputs: Sequence[str],
        params: dict[str, Any],
    ) -> Lookup:
        start = time.perf_counter_ns()
        digest = request_key(model, version, inputs, outputs, params)
        found, errors = None, 0
        try:
            value = self.store.get(digest)
            if value is not None:
                found = unpack(value)
        except (redis.RedisError, OSError, BadMessage) as exc:
            errors = 1
            log.warning("response cache: lookup for model '%s' failed, a miss: %s", model, exc)
        return Lookup(model, version, digest, time.perf_counter_ns() - start, errors, found)

    def hit(self, lookup: Lookup, since_ns: int) -> None:
        """Count a hit: the request took from ``since_ns`` (perf_counter) until now."""
        took = time.perf_counter_ns() - since_ns
        self.stats.add(
            lookup.model, lookup.version, statistics.cache_hit_counts(took, lookup.took_ns)
        )

    def store_answer(self, lookup: Lookup, version: int, outputs: Sequence[WireTensor]) -> None:
        """After a miss: keep a successful answer of the version looked up (an answer of
        another, the repository having moved meanwhile, is not stored under this key)."""
        start = time.perf_counter_ns()
        errors = lookup.errors
        if version == lookup.version:
            try:
                self.store.put(lookup.digest, pack(version, outputs))
            except (redis.RedisError, OSError) as exc:
                errors += 1
                log.warning("response cache: insert for model '%s' failed: %s", lookup.model, exc)
        took = lookup.took_ns + time.perf_counter_ns() - start
        counts = statistics.cache_miss_counts(took, errors=errors)
        self.stats.add(lookup.model, lookup.version, counts)


@dataclass
class Visit:
    """A request's trip to the cache its model uses (``consult``): ``found`` on a hit,
    counted already; after a miss, ``keep`` stores the answer the request got."""

    cache: ResponseCache
    lookup: Lookup

    @property
    def found(self) -> tuple[int, list[WireTensor]] | None:
        """(version, outputs) on a hit; None on a miss."""
        return self.lookup.found

    def keep(self, version: int, outputs: Sequence[WireTensor]) -> None:
        self.cache.store_answer(self.lookup, version, outputs)


def consult(
    cache: ResponseCache | None, config: ModelConfig, model: str, version: int, msg: InferMessage
) -> Visit | None:
    """The one lookup of the frontends, for the data plane's infer calls and each step of
    an ensemble alike: None where there is no cache or the model does not use it; else
    the visit, a hit counted from the moment of the lookup to its answer being read."""
    if cache is None or not cache.applies(config):
        return None
    since = time.perf_counter_ns()
    lookup = cache.lookup(model, version, msg.inputs, msg.outputs, msg.params)
    if lookup.found is not None:
        cache.hit(lookup, since)
    return Visit(cache, lookup)


def open_cache(config: CacheConfig | None, stats: redis.Redis) -> ResponseCache | None:
    """The cache ``config`` names (None: none). A Redis cache must answer now: a
    frontend that cannot reach its cache at start says so, as Triton's does."""
    if config is None:
        return None
    if config.kind == LOCAL:
        store: Store = LocalStore(config.size)
    else:
        redis_store = cache_store.open_store(config)
        try:
            redis_store.client.ping()
        except redis.RedisError as exc:
            raise RuntimeError(
                f"--cache-config {config.describe()}: cannot reach the cache's Redis: {exc}"
            ) from None
        store = redis_store
    log.info("response cache: %s", config.describe())
    return ResponseCache(store, stats, config.describe())


__all__ = [
    "LocalStore",
    "Lookup",
    "ResponseCache",
    "Store",
    "Visit",
    "consult",
    "open_cache",
    "pack",
    "request_key",
    "unpack",
]
