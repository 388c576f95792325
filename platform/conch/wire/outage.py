"""A Redis outage, as every caller on the request path answers it: 503, never a 500.

Redis is conch's broker and its store: while it cannot be reached (stopped, restarting,
loading its append-only file, failing over), nothing can be queued, answered or looked
up, and a request that needs it is worth sending again a moment later. This module
decides which errors mean that, and turns them into one ``BrokerUnavailable`` (Triton's
503 with a ``Retry-After``) that says so; the data plane's operations all go through
``translate_outages``, so no route answers an outage with a 500.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from conch.core.errors import BrokerUnavailable
from conch.wire.keys import DATASET

# Error replies of a Redis that is up but cannot serve: loading its dataset, a replica
# cut off from its primary, or a former primary demoted by a failover.
_NOT_SERVING = ("LOADING", "MASTERDOWN", "READONLY")

T = TypeVar("T")

RECONNECT_S = 0.2  # how often a loop that needs Redis tries again while it is away


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` means Redis cannot be reached now, rather than a bad command."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        # BusyLoadingError (an AOF loading) is a ConnectionError; socket errors reach
        # callers as ConnectionError (redis-py's and RedisLink's): a bare OSError is a disk's.
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(_NOT_SERVING)


def unavailable(exc: BaseException) -> BrokerUnavailable:
    """The 503 a caller gets for the outage ``exc``."""
    retry = BrokerUnavailable.retry_after_s
    if isinstance(exc, redis.BusyLoadingError) or str(exc).startswith("LOADING"):
        what = "Redis is loading its dataset after a restart"
    else:
        what = f"Redis is unreachable ({exc})"
    return BrokerUnavailable(
        f"{what}: conch cannot queue or answer requests until it is back. Retry after "
        f"{retry} s; if it lasts, check the Redis server at --redis-url / REDIS_URL"
    )


def translated(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, with a Redis outage raised as ``BrokerUnavailable``."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except redis.RedisError as exc:
            if is_outage(exc):
                raise unavailable(exc) from exc
            raise

    return call


def translate_outages(cls: type[T]) -> type[T]:
    """Class decorator: every public method of ``cls`` raises ``BrokerUnavailable`` for
    a Redis outage, methods added later included."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, translated(member))
    return cls


@dataclass(frozen=True)
class Dataset:
    """Which data a Redis holds, to tell after a reconnect whether it kept what it held."""

    id: str  # ``keys.DATASET``: set once by the first process to reach this data
    run_id: str  # changes whenever redis-server restarts
    appendonly: bool  # whether it logs every write (AOF), or at most snapshots them


def dataset(client: redis.Redis) -> Dataset:
    """The ``Dataset`` of the Redis behind ``client`` (three commands)."""
    pipe = client.pipeline(transaction=False)
    pipe.set(DATASET, uuid.uuid4().hex, nx=True)
    pipe.get(DATASET)
    _, given = pipe.execute()
    try:
        info = client.info("server") | client.info("persistence")
    except redis.ResponseError:  # INFO refused (a managed Redis's ACL): know the id only
        info = {}
    return Dataset(
        given.decode() if isinstance(given, bytes) else str(given),
        str(info.get("run_id", "")),
        bool(info.get("aof_enabled", 1)),
    )


def lost(before: Dataset, now: Dataset) -> str | None:
    """Why messages and replies Redis held as ``before`` may be gone ``now``; None when
    it kept them (the same process, or one that read back a complete append-only file)."""
    if now.id != before.id:
        return "Redis came back without its data (restarted with no persistence, or replaced)"
    if now.run_id != before.run_id and not now.appendonly:
        return (
            "Redis restarted without an append-only file: what it took since its last "
            "snapshot is lost"
        )
    return None


__all__ = [
    "RECONNECT_S",
    "Dataset",
    "dataset",
    "is_outage",
    "lost",
    "translate_outages",
    "translated",
    "unavailable",
]
