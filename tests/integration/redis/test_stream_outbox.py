"""The outbox a drain loop's streams send through (``worker.stream_outbox``), against a
real Redis: everything put leaves in order, in fewer round trips than puts, each
parcel's ``after`` runs once Redis has it, and a command Redis refuses is logged with
its request."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest
import redis

from conch.wire.redis_link import Commands, RedisLink
from conch.worker import stream_outbox
from conch.worker.stream_outbox import Outbox, Parcel


@pytest.fixture()
def client(redis_url: str) -> redis.Redis:
    client = redis.Redis.from_url(redis_url)
    client.delete("outbox:a", "outbox:b", "outbox:log")
    return client


def parcel(key: str, value: int, after=None) -> Parcel:
    commands = Commands()
    commands.rpush(key, value)
    return Parcel(commands, f"r{value}", after)


def test_everything_put_leaves_in_order_in_few_round_trips(client, monkeypatch) -> None:
    trips = []

    class Counted(RedisLink):
        def pipeline(self, commands, **kw):
            trips.append(len(commands))
            return super().pipeline(commands, **kw)

    monkeypatch.setattr(stream_outbox, "RedisLink", Counted)
    outbox = Outbox(SimpleNamespace(client=client), threading.Event(), "test")
    seen_after: list[int] = []

    def producer(key: str) -> None:
        for i in range(500):
            # The model's thread never waits on Redis: it hands each response on.
            outbox.put(
                parcel(key, i, lambda i=i, key=key: key == "outbox:a" and seen_after.append(i))
            )

    threads = [threading.Thread(target=producer, args=(k,)) for k in ("outbox:a", "outbox:b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outbox.drained(10)
    for key in ("outbox:a", "outbox:b"):
        assert [int(v) for v in client.lrange(key, 0, -1)] == list(range(500))
    assert seen_after == list(range(500))  # each after its own parcel was sent
    assert sum(trips) == 1000 and len(trips) < 1000


def test_after_runs_once_redis_has_the_parcel(client) -> None:
    outbox = Outbox(SimpleNamespace(client=client), threading.Event(), "test")
    lengths: list[int] = []
    outbox.put(parcel("outbox:a", 1))
    outbox.put(parcel("outbox:a", 2, lambda: lengths.append(client.llen("outbox:a"))))
    assert outbox.drained(10)
    assert lengths == [2]


def test_a_refused_command_is_logged_with_its_request(client, caplog) -> None:
    outbox = Outbox(SimpleNamespace(client=client), threading.Event(), "test")
    client.xadd("outbox:log", {"r": b"x"}, id="2-0")
    older = Commands()
    older.xadd("outbox:log", {"r": b"y"}, id="1-5")  # an older run's entry
    ran = threading.Event()
    with caplog.at_level(logging.ERROR, logger=stream_outbox.__name__):
        outbox.put(Parcel(older, "req-1", ran.set))
        outbox.put(parcel("outbox:a", 7))
        assert outbox.drained(10)
    assert ran.is_set()
    assert "request 'req-1' was refused" in caplog.text
    assert client.lrange("outbox:a", 0, -1) == [b"7"]  # the rest still went


def test_a_full_outbox_holds_the_sender(client, monkeypatch) -> None:
    monkeypatch.setattr(stream_outbox, "MAX_QUEUED", 3)
    gate = threading.Event()

    class Slow(RedisLink):
        def pipeline(self, commands, **kw):
            gate.wait(10)
            return super().pipeline(commands, **kw)

    monkeypatch.setattr(stream_outbox, "RedisLink", Slow)
    outbox = Outbox(SimpleNamespace(client=client), threading.Event(), "test")
    outbox.put(parcel("outbox:a", 0))  # taken by the thread, which waits at the gate
    assert not outbox.drained(0.2)
    for i in range(1, 4):
        outbox.put(parcel("outbox:a", i))
    blocked = threading.Thread(target=outbox.put, args=(parcel("outbox:a", 4),))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # held until the thread takes what waits
    gate.set()
    blocked.join(10)
    assert outbox.drained(10)
    assert [int(v) for v in client.lrange("outbox:a", 0, -1)] == list(range(5))
