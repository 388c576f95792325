"""Settings an API changes for every process (``conch.wire.shared_settings``), on a real
Redis: what a publishing process applies to itself holds every stored setting, so a change
another process published a moment before, which its follower has not heard yet, is not
lost or undone by that message arriving late."""

from __future__ import annotations

import time

import pytest
import redis

from conch.wire.shared_settings import SharedSettings

from harness import fresh_db


@pytest.fixture()
def settings(redis_url: str) -> SharedSettings:
    return SharedSettings("conch.test.settings", "conch.test.settings.changes", "test")


@pytest.fixture()
def two(redis_url: str) -> tuple[redis.Redis, redis.Redis]:
    db = fresh_db(redis_url, 12)
    return redis.Redis.from_url(db), redis.Redis.from_url(db)


def test_what_a_process_applies_holds_what_another_just_published(
    settings: SharedSettings, two: tuple[redis.Redis, redis.Redis]
) -> None:
    a, b = two
    assert settings.publish(a, {"add/trace_rate": "2", "add/trace_count": "3"}) == {
        "add/trace_rate": "2",
        "add/trace_count": "3",
    }
    assert settings.publish(a, {"trace_level": ["TIMESTAMPS"]})["add/trace_rate"] == "2"
    # b clears the model's settings without having heard a's changes.
    applied = settings.publish(b, {"add/trace_rate": None, "add/trace_count": None})
    assert applied == {
        "trace_level": ["TIMESTAMPS"],
        "add/trace_rate": None,
        "add/trace_count": None,
    }
    assert settings.stored(a) == {"trace_level": ["TIMESTAMPS"]}


def test_every_change_is_sent_as_it_was_made(
    settings: SharedSettings, two: tuple[redis.Redis, redis.Redis]
) -> None:
    a, b = two
    listener = b.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(settings.channel)
    settings.publish(a, {"log_info": False})
    settings.publish(a, {"log_verbose_level": 1})
    heard = []
    until = time.monotonic() + 5
    while len(heard) < 2 and time.monotonic() < until:
        message = listener.get_message(timeout=0.5)  # None for the subscription's own reply
        if message is not None:
            heard.append(message["data"])
    assert heard == [b'{"log_info": false}', b'{"log_verbose_level": 1}']
