"""Traffic splits as the API takes them (every 400), drawn by weight, and each process's
short-lived copy of them (``conch.wire.traffic_split``), with no Redis: a dict stands in."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from conch.core.errors import InvalidArgument
from conch.wire import traffic_split
from conch.wire.keys import TRAFFIC_SPLITS
from conch.wire.traffic_split import NO_SPLIT, Shadow, Split, Splits, parse


class FakeHash:
    """The hash commands the module uses, on one dict per key; counts the reads."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, bytes]] = {}
        self.reads = 0
        self.down = False

    def hset(self, key: str, field: str, value: str) -> None:
        self.hashes.setdefault(key, {})[field] = value.encode()

    def hget(self, key: str, field: str) -> bytes | None:
        return self.hashes.get(key, {}).get(field)

    def hdel(self, key: str, field: str) -> None:
        self.hashes.get(key, {}).pop(field, None)

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        if self.down:
            raise redis.ConnectionError("down")
        self.reads += 1
        return {k.encode(): v for k, v in self.hashes.get(key, {}).items()}


# -- parse: what the API takes -------------------------------------------------------------
def test_weights_and_a_shadow_are_taken_and_shown_as_given() -> None:
    doc = {"weights": {"1": 90, "2": 10.5, "3": 0}, "shadow": {"version": 4, "share": 0.25}}
    split = parse("m", doc)
    assert split.weights == {1: 90, 2: 10.5, 3: 0}
    assert split.shadow == Shadow(4, 0.25)
    assert split.to_json() == doc
    assert parse("m", split.to_json()) == split  # what GET answers, POST takes back


@pytest.mark.parametrize(
    "doc",
    [{}, {"weights": {}}, {"weights": None}, {"weights": {}, "shadow": None}],
)
def test_no_weights_and_no_shadow_is_no_split(doc: dict[str, Any]) -> None:
    split = parse("m", doc)
    assert split.empty and split == NO_SPLIT
    assert split.to_json() == {"weights": {}}


def test_a_shadow_alone_is_a_split() -> None:
    split = parse("m", {"shadow": {"version": 2, "share": 1}})
    assert not split.empty and split.weights == {} and split.shadow == Shadow(2, 1.0)


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ([1, 2], "must be a JSON object"),
        ("weights", "must be a JSON object"),
        ({"weight": {"1": 1}}, "unknown field 'weight'"),
        ({"weights": [1, 2]}, "'weights' must be an object"),
        ({"weights": {"1": -1}}, "version 1 must be a number >= 0, not -1"),
        ({"weights": {"1": -0.5, "2": 1}}, "version 1 must be a number >= 0"),
        ({"weights": {"1": "10"}}, "version 1 must be a number, not '10'"),
        ({"weights": {"1": "ten"}}, "must be a number, not 'ten'"),
        ({"weights": {"1": True}}, "must be a number, not True"),
        ({"weights": {"1": None}}, "must be a number, not None"),
        ({"weights": {"1": [1]}}, "must be a number"),
        ({"weights": {"1": float("nan")}}, "must be a number >= 0"),
        ({"weights": {"1": float("inf")}}, "must be a number >= 0"),
        ({"weights": {"1": 10**400}}, "must be a number >= 0"),
        ({"weights": {"1": 0, "2": 0}}, "at least one weight must be above 0"),
        ({"weights": {"latest": 1}}, "'latest' is not a version"),
        ({"weights": {"0": 1}}, "'0' is not a version"),
        ({"weights": {"-1": 1}}, "'-1' is not a version"),
        ({"weights": {"01": 1}}, "'01' is not a version"),
        ({"weights": {"1\n": 1}}, "is not a version"),
        ({"weights": {"1.5": 1}}, "is not a version"),
        ({"weights": {"٣": 1}}, "is not a version"),  # a digit, but not an ASCII one
        ({"shadow": 3}, "'shadow' must be an object"),
        ({"shadow": {"version": 3}}, "'share' must be a number from 0 to 1, not None"),
        ({"shadow": {"share": 0.5}}, "'version' must be a positive integer, not None"),
        ({"shadow": {"version": "3", "share": 0.5}}, "'version' must be a positive integer"),
        ({"shadow": {"version": 0, "share": 0.5}}, "'version' must be a positive integer"),
        ({"shadow": {"version": True, "share": 0.5}}, "'version' must be a positive integer"),
        ({"shadow": {"version": 3, "share": 1.5}}, "from 0 to 1, not 1.5"),
        ({"shadow": {"version": 3, "share": -0.1}}, "from 0 to 1, not -0.1"),
        ({"shadow": {"version": 3, "share": "all"}}, "from 0 to 1, not 'all'"),
        ({"shadow": {"version": 3, "share": 1, "to": 2}}, "unknown shadow field 'to'"),
    ],
)
def test_a_wrong_split_is_a_400_that_says_what(doc: Any, words: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse("m", doc)
    assert err.value.status == 400
    assert err.value.message.startswith("invalid traffic split for model 'm': ")
    assert words in err.value.message


def test_a_long_wrong_value_is_cut_short_in_the_error() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse("m", {"weights": {"1": "x" * 10_000}})
    assert len(err.value.message) < 200 and "..." in err.value.message


# -- draw: which version a request goes to -------------------------------------------------
def _points(n: int) -> Any:
    """``n`` evenly spread stand-ins for random.random(), each in [0, 1)."""
    return iter([(i + 0.5) / n for i in range(n)]).__next__


def test_versions_are_drawn_in_proportion_to_their_weights() -> None:
    split = Split({1: 80, 2: 20})
    rand = _points(1000)
    drawn = [split.draw(lambda v: True, rand) for _ in range(1000)]
    assert drawn.count(1) == 800 and drawn.count(2) == 200


def test_only_ready_versions_with_weight_are_drawn() -> None:
    split = Split({1: 50, 2: 30, 3: 20, 4: 0})
    rand = _points(100)
    drawn = [split.draw(lambda v: v != 2, rand) for _ in range(100)]
    assert set(drawn) == {1, 3}  # 2 is not ready, 4 has no weight
    assert drawn.count(1) == 71  # 50 of 70 (the ready weights), rounded at the edges


def test_none_ready_or_no_weights_draws_nothing() -> None:
    assert Split({1: 1, 2: 1}).draw(lambda v: False) is None  # the caller sends it to latest
    assert Split({}, Shadow(2, 1)).draw(lambda v: True) is None
    assert NO_SPLIT.draw(lambda v: True) is None


def test_the_top_edge_lands_on_the_last_version() -> None:
    assert Split({1: 1, 2: 1}).draw(lambda v: True, lambda: 0.9999999999999999) == 2
    assert Split({1: 1, 2: 1}).draw(lambda v: True, lambda: 0.0) == 1


def test_a_shadow_takes_its_share() -> None:
    rand = _points(100)
    shadowed = [Split({}, Shadow(3, 0.25)).shadows(rand) for _ in range(100)]
    assert shadowed.count(3) == 25 and shadowed.count(None) == 75
    assert Split({}, Shadow(3, 1.0)).shadows(lambda: 0.9999) == 3
    assert Split({}, Shadow(3, 0.0)).shadows(lambda: 0.0) is None
    assert Split({1: 1}).shadows() is None


# -- kept in Redis, copied in each process --------------------------------------------------
def test_store_read_and_clear() -> None:
    client: Any = FakeHash()
    split = parse("m", {"weights": {"2": 1, "1": 3}, "shadow": {"version": 2, "share": 0.5}})
    traffic_split.store(client, "m", split)
    assert json.loads(client.hget(TRAFFIC_SPLITS, "m")) == split.to_json()
    assert traffic_split.read(client, "m") == split
    assert traffic_split.read_all(client) == {"m": split}
    traffic_split.store(client, "m", NO_SPLIT)  # an empty split clears it
    assert traffic_split.read(client, "m") is NO_SPLIT
    traffic_split.store(client, "m", split)
    traffic_split.clear(client, "m")
    assert traffic_split.read(client, "m") is NO_SPLIT and traffic_split.read_all(client) == {}


def test_a_stored_split_that_cannot_be_read_is_none() -> None:
    client: Any = FakeHash()
    client.hset(TRAFFIC_SPLITS, "bad", "{not json")
    client.hset(TRAFFIC_SPLITS, "worse", json.dumps({"weights": {"1": -1}}))
    client.hset(TRAFFIC_SPLITS, "good", json.dumps({"weights": {"1": 1}}))
    assert traffic_split.read(client, "bad") is NO_SPLIT
    assert set(traffic_split.read_all(client)) == {"good"}


def test_a_process_reads_every_split_at_most_once_a_period() -> None:
    client: Any = FakeHash()
    splits = Splits(client, max_age_s=1e9)  # never stale on its own in this test
    assert splits.get("m") is NO_SPLIT and client.reads == 1
    traffic_split.store(client, "m", Split({1: 1}))
    assert splits.get("m") is NO_SPLIT and splits.get("n") is NO_SPLIT  # the copy holds
    assert client.reads == 1
    splits.invalidate()  # this process set a split: read at once
    assert splits.get("m") == Split({1: 1}) and client.reads == 2
    fresh = Splits(client, max_age_s=0.0)
    for _ in range(3):
        fresh.get("m")
    assert client.reads == 5  # stale at once: read each time


def test_an_outage_keeps_the_last_copy() -> None:
    client: Any = FakeHash()
    traffic_split.store(client, "m", Split({2: 1}))
    splits = Splits(client, max_age_s=0.0)
    assert splits.get("m") == Split({2: 1})
    client.down = True
    assert splits.get("m") == Split({2: 1})
