"""The response cache's parts: the flag, the key, the entry codec and both stores."""

from __future__ import annotations

import msgpack
import pytest
import redis

from conch.core.cache_config import DEFAULT_REDIS_SIZE, CacheConfig
from conch.frontend.response_cache import LocalStore, pack, request_key, unpack
from conch.settings import Settings
from conch.wire import keys
from conch.wire.cache_store import RedisCacheStore
from conch.wire.messages import BadMessage, WireTensor

A = WireTensor("A", "FP32", (1, 4), b"\x00" * 16)
B = WireTensor("B", "FP32", (1, 4), b"\x01" * 16)


# -- --cache-config ------------------------------------------------------------------------


def test_local_form() -> None:
    config = CacheConfig.parse(["local,size=1048576"])
    assert config is not None and config.kind == "local" and config.size == 1048576


def test_redis_keys_add_up_over_repeated_flags_as_in_triton() -> None:
    config = CacheConfig.parse(
        ["redis,host=cache.internal", "redis,port=6380", "redis,password=s3cret,db=2"]
    )
    assert config is not None and config.kind == "redis"
    assert config.values == {
        "host": "cache.internal",
        "port": "6380",
        "password": "s3cret",
        "db": "2",
    }
    assert config.size == DEFAULT_REDIS_SIZE
    assert "s3cret" not in config.describe()
    assert CacheConfig.parse(config.to_values()) == config


def test_no_flag_no_cache() -> None:
    assert CacheConfig.parse([]) is None


@pytest.mark.parametrize(
    ("items", "says"),
    [
        (["local"], "the form is <cache>,<key>=<value>"),
        (["local,1048576"], "the form is <cache>,<key>=<value>"),
        (["memcached,size=10"], "unknown cache 'memcached'"),
        (["local,size=10", "redis,host=h"], "multiple cache configurations"),
        (["local,colour=red"], "'colour' is not a setting of the local cache"),
        (["local,size=1MB"], "'size' must be a whole number"),
        (["local,size=0"], "the size must be above 0"),
        (["redis,host=h"], "the redis cache needs port"),
        (["redis,port=6379"], "the redis cache needs host"),
        (["local,size="], "'size' has no value"),
    ],
)
def test_bad_forms_say_what_to_write(items: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says) as info:
        CacheConfig.parse(items)
    assert "--cache-config" in str(info.value)


def test_the_flag_reaches_children_in_their_environment_not_their_argv() -> None:
    """A Redis password is a secret: conch serve hands it to the gateway and the gRPC
    server through CONCH_CACHE_CONFIG."""
    config = CacheConfig.parse(["redis,host=h,port=1,password=pw"])
    settings = Settings(cache_config=config)
    for role in ("gateway", "grpc"):
        assert not any("pw" in a for a in settings.to_args(role))
        env = settings.child_env(role)
        assert Settings.from_env(env).cache_config == config
    assert "CONCH_CACHE_CONFIG" not in settings.child_env("worker")


# -- the key -----------------------------------------------------------------------------


def test_the_key_ignores_input_order_and_sees_every_part() -> None:
    base = request_key("m", 1, [A, B], ["OUT"], {})
    assert request_key("m", 1, [B, A], ["OUT"], {}) == base
    different = [
        request_key("n", 1, [A, B], ["OUT"], {}),  # model
        request_key("m", 2, [A, B], ["OUT"], {}),  # version
        request_key("m", 1, [A._replace(datatype="INT32"), B], ["OUT"], {}),  # datatype
        request_key("m", 1, [A._replace(shape=(4, 1)), B], ["OUT"], {}),  # shape
        request_key("m", 1, [A._replace(raw=b"\x02" * 16), B], ["OUT"], {}),  # bytes
        request_key("m", 1, [A._replace(name="C"), B], ["OUT"], {}),  # input name
        request_key("m", 1, [A, B], ["OUT", "OUT2"], {}),  # outputs asked
        request_key("m", 1, [A, B], ["OUT"], {"temperature": 1}),  # what the model sees
    ]
    assert base not in different and len(set(different)) == len(different)


def test_the_key_has_no_ambiguous_concatenation() -> None:
    """Length-prefixed parts: moving bytes from one field into the next changes the key."""
    assert request_key("ab", 1, [], [], {}) != request_key(
        "a", 1, [WireTensor("b", "FP32", (), b"")], [], {}
    )
    one = request_key("m", 1, [WireTensor("A", "BYTES", (1,), b"xy")], [], {})
    assert one != request_key("m", 1, [WireTensor("A", "BYTES", (1,), b"x")], ["y"], {})


# -- entries -----------------------------------------------------------------------------


def test_an_entry_round_trips() -> None:
    assert unpack(pack(3, [A, B])) == (3, [A, B])


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",  # not msgpack
        msgpack.packb({"v": 1}),
        msgpack.packb([1, [["A", "NOTATYPE", [1], b""]]], use_bin_type=True),
        msgpack.packb([1, [["A", "FP32", [-1], b""]]], use_bin_type=True),
        msgpack.packb(["1", []], use_bin_type=True),
    ],
)
def test_an_entry_that_is_not_ours_is_refused(data: bytes) -> None:
    with pytest.raises(BadMessage):
        unpack(data)


# -- the local store ---------------------------------------------------------------------


def test_local_store_evicts_the_least_recently_used_to_stay_within_its_bytes() -> None:
    store = LocalStore(100)
    assert store.put("a", b"x" * 40) == (True, 0)
    assert store.put("b", b"x" * 40) == (True, 0)
    assert store.get("a") is not None  # a is now the most recent
    assert store.put("c", b"x" * 40) == (True, 1)  # b goes
    assert store.get("b") is None and store.get("a") and store.get("c")
    assert store.held == 80 and len(store) == 2


def test_local_store_keeps_no_entry_larger_than_itself() -> None:
    store = LocalStore(10)
    store.put("small", b"x" * 10)
    assert store.put("big", b"x" * 11) == (False, 0)
    assert store.get("small") is not None and store.held == 10


def test_local_store_replacing_an_entry_counts_its_bytes_once() -> None:
    store = LocalStore(100)
    store.put("a", b"x" * 60)
    store.put("a", b"y" * 60)
    assert store.held == 60 and store.get("a") == b"y" * 60


# -- the Redis store ---------------------------------------------------------------------


@pytest.fixture()
def cache_redis(rclient: redis.Redis) -> redis.Redis:
    for key in rclient.scan_iter(match="conch.cache.*"):
        rclient.delete(key)
    return rclient


def test_redis_store_evicts_the_least_recently_used_and_keeps_its_books(
    cache_redis: redis.Redis,
) -> None:
    store = RedisCacheStore(cache_redis, 100)
    assert store.put("a", b"x" * 40) == (True, 0)
    assert store.put("b", b"x" * 40) == (True, 0)
    assert store.get("a") == b"x" * 40
    assert store.put("c", b"x" * 40) == (True, 1)
    assert store.get("b") is None and store.get("a") and store.get("c")
    assert store.held_bytes() == 80
    assert cache_redis.zcard(keys.CACHE_LRU) == 2 and cache_redis.hlen(keys.CACHE_SIZES) == 2
    assert not cache_redis.exists(keys.CACHE_ENTRY_PREFIX + "b")
    assert store.put("huge", b"x" * 101) == (False, 0)
    store.put("a", b"z" * 10)  # replaced: its old bytes are freed
    assert store.held_bytes() == 50


def test_two_stores_on_one_redis_share_entries_and_one_bound(cache_redis: redis.Redis) -> None:
    first, second = RedisCacheStore(cache_redis, 100), RedisCacheStore(cache_redis, 100)
    first.put("a", b"x" * 60)
    assert second.get("a") == b"x" * 60
    second.put("b", b"x" * 60)
    assert first.get("a") is None and first.held_bytes() == 60


def test_the_tally_adds_counters_up_and_writes_them_in_one_flush(cache_redis) -> None:
    """A cache hit makes no Redis call of its own: the process's counters are added up
    and written together, and kept when Redis refuses them."""
    from conch.wire import statistics

    cache_redis.delete(statistics.key("m"))
    tally = statistics.Tally(cache_redis, period_s=3600)  # only explicit flushes here
    for _ in range(3):
        tally.add("m", 1, statistics.cache_hit_counts(1_000, 100))
    tally.add("m", 1, statistics.cache_miss_counts(500))
    assert statistics.read(cache_redis, "m") == {}  # nothing written yet
    tally.flush()
    counts = statistics.read(cache_redis, "m")[1]
    assert (counts["cache_hit.count"], counts["cache_hit.ns"]) == (3, 300)
    assert (counts["cache_miss.count"], counts["success.count"]) == (1, 3)
    assert counts["success.ns"] == 3_500
    broken = statistics.Tally(redis.Redis(port=1, socket_connect_timeout=0.2), period_s=3600)
    broken.add("m", 1, statistics.cache_hit_counts(1, 1))
    with pytest.raises(redis.RedisError):
        broken.flush()
    broken.client = cache_redis  # Redis is back: what was refused is written now
    broken.flush()
    assert statistics.read(cache_redis, "m")[1]["cache_hit.count"] == 4
