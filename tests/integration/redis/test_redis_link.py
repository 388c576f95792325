"""RedisLink against a real Redis: replies, errors as values, and reconnecting for good."""

from __future__ import annotations

import time

import pytest
import redis

from conch.wire import redis_link
from conch.wire.redis_link import Commands, RedisLink


def test_a_round_trip_of_commands_and_its_replies(redis_url: str) -> None:
    link = RedisLink(redis.Redis.from_url(redis_url))
    cmds = Commands()
    cmds.delete("link.test")
    cmds.rpush("link.test", b"a", b"b")
    cmds.lrange("link.test", 0, -1)
    cmds.execute_command("EVALSHA", "0" * 40, 0)
    cmds.execute_command("NOSUCHCOMMAND")
    got = link.run(cmds)
    assert got[1:3] == [2, [b"a", b"b"]]
    assert isinstance(got[3], redis.exceptions.NoScriptError)
    assert isinstance(got[4], redis.ResponseError)
    assert link.call("LLEN", "link.test") == 2  # the connection is still in step


def test_a_link_reconnects_as_often_as_it_must_whatever_the_pool_limit(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_link, "IDLE_CHECK_S", 60.0)  # a busy link: no check, an error
    client = redis.Redis.from_url(redis_url, max_connections=2)
    link = RedisLink(client)
    admin = redis.Redis.from_url(redis_url)
    for _ in range(6):  # three times the pool's limit
        own_id = link.call("CLIENT", "ID")
        admin.client_kill_filter(_id=own_id)
        with pytest.raises(redis.ConnectionError):
            link.call("PING")
        assert link.call("PING") == b"PONG"  # a new connection, never MaxConnectionsError


def test_a_link_left_idle_finds_its_connection_closed_and_opens_another(redis_url: str) -> None:
    """As after a Redis restart: the first command after it goes through, no error."""
    link = RedisLink(redis.Redis.from_url(redis_url))
    own_id = link.call("CLIENT", "ID")
    redis.Redis.from_url(redis_url).client_kill_filter(_id=own_id)
    time.sleep(redis_link.IDLE_CHECK_S + 0.05)
    assert link.call("PING") == b"PONG"
    assert link.call("CLIENT", "ID") != own_id


def test_a_blocking_command_may_wait_longer_than_the_read_timeout(redis_url: str) -> None:
    # redis-py 8 reads with a 5 s timeout by default; here 0.3 s, and BLPOP waits 1 s.
    link = RedisLink(redis.Redis.from_url(redis_url, socket_timeout=0.3))
    started = time.monotonic()
    assert link.call("BLPOP", "link.test.empty", 1, wait_s=1) is None
    assert time.monotonic() - started >= 0.9
    # The connection keeps its own timeout for what follows: a stuck reply still ends.
    assert link.call("PING") == b"PONG"
    assert link._connection()._sock.gettimeout() == 0.3
    with pytest.raises(redis.ConnectionError):
        link.call("BLPOP", "link.test.empty", 1)  # blocking, but not said so
