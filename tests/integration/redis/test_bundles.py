"""Bundles against a real Redis: the publisher's group commit makes them, the pop script
counts their requests, the work owed counts every request whether waiting or in flight,
kombu's restore brings a whole bundle back, and the ack forgets it."""

from __future__ import annotations

import threading
import time

import kombu
import pytest
import redis

from conch.wire import broker, keys
from conch.wire.work_owed import work_owed
from conch.worker.drain import Drain, ack

from harness import fresh_db


@pytest.fixture()
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 11)


@pytest.fixture()
def clean(db: str) -> redis.Redis:
    return redis.Redis.from_url(db)


def publish_together(
    client: redis.Redis, rows: list[int], max_rows: int, nbytes: int = 0
) -> list[bytes | None]:
    """Publish one request alone, then ``rows``' requests while its flush waits on Redis
    (paused): they meet in the publisher's next flush, as a gateway's concurrent requests
    do. What each ``publish`` returned, the lone one first."""
    pub = broker.Publisher(client)
    out: list[bytes | None] = [None] * (1 + len(rows))

    def one(k: int, n: int) -> None:
        payload = {"id": f"r{k}", "deadline": time.time() + 60}
        out[k] = pub.publish(
            "m",
            payload,
            task_id=f"r{k}",
            priority=0,
            reply_to="conch.reply.test",
            bundling=broker.Bundling(n, max_rows, nbytes),
        )

    redis.Redis(connection_pool=client.connection_pool).client_pause(400)
    threads = [threading.Thread(target=one, args=(0, 1))]
    threads[0].start()
    time.sleep(0.1)  # the lone one's flush is under way, held by the pause
    threads += [threading.Thread(target=one, args=(k + 1, n)) for k, n in enumerate(rows)]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(10)
    return out


def queued(client: redis.Redis) -> list[broker.Decoded]:
    """The queue's messages, oldest first."""
    return [broker.decode(raw) for raw in reversed(client.lrange(broker.queue_name("m"), 0, -1))]


def test_requests_that_meet_in_a_flush_go_as_bundles_of_at_most_one_batch(
    clean: redis.Redis,
) -> None:
    returned = publish_together(clean, [1, 2, 1, 3, 1], max_rows=4)
    assert returned[0] and all(r == b"" for r in returned[1:])  # none None: all queued
    messages = queued(clean)
    assert [m.bundle for m in messages] == [False, True, True]
    assert messages[0].payload["id"] == "r0"
    # Each bundle within 4 rows, every request in exactly one, in the order they came.
    sizes = {f"r{k + 1}": n for k, n in enumerate([1, 2, 1, 3, 1])}
    ids = [p["id"] for m in messages[1:] for p in m.payloads]
    assert sorted(ids) == sorted(sizes)
    assert all(sum(sizes[p["id"]] for p in m.payloads) <= 4 for m in messages[1:])
    entries = clean.hgetall(broker.bundled_key(broker.queue_name("m")))
    assert {k.decode(): int(v.split()[0]) for k, v in entries.items()} == {
        m.tag: len(m.payloads) - 1 for m in messages[1:]
    }
    assert work_owed(clean, ["m"])["m"].steps[0] == 6  # requests, not messages


def test_a_bundle_holds_at_most_its_bytes_bound(clean: redis.Redis) -> None:
    third = broker.BUNDLE_MAX_BYTES // 3 + 1  # two fit in a bundle, three do not
    publish_together(clean, [1] * 6, max_rows=64, nbytes=third)
    assert [len(m.payloads) for m in queued(clean)] == [1, 2, 2, 2]
    clean.flushdb()
    publish_together(clean, [1] * 2, max_rows=64, nbytes=broker.BUNDLE_MAX_BYTES + 1)
    assert [m.bundle for m in queued(clean)] == [False] * 3  # too large to share


def test_a_pop_counts_requests_and_the_work_owed_follows_a_bundle_through_restore_and_ack(
    clean: redis.Redis, db: str
) -> None:
    publish_together(clean, [1] * 11, max_rows=4)  # one alone, then bundles of 4, 4, 3
    assert [len(m.payloads) for m in queued(clean)] == [1, 4, 4, 3]
    drain = Drain(clean, "m")
    first = drain.pop(2)  # the lone request, then a bundle: the pop stops past its count
    assert len(first) == 2
    w = work_owed(clean, ["m"])["m"]
    assert (w.waiting, w.in_flight) == (7, 5)

    # The worker dies: kombu's sweep puts both back whole, and the count moves with them.
    clean.zadd(keys.UNACKED_INDEX, {p.tag: 1.0 for p in first})
    options = {"visibility_timeout": 1, "priority_steps": list(broker.PRIORITY_STEPS)}
    with kombu.Connection(db, transport_options=options) as conn:
        conn.default_channel.qos.restore_visible(num=10, interval=1)
    w = work_owed(clean, ["m"])["m"]
    assert (w.waiting, w.in_flight) == (12, 0)

    again = drain.pop(100)
    assert sorted(p.attempts for p in again) == [1, 1, 2, 2]
    assert sum(len(broker.decode(p.raw).payloads) for p in again) == 12
    assert (work_owed(clean, ["m"])["m"].in_flight, drain.waiting) == (12, 0)
    pipe = clean.pipeline()
    ack(pipe, drain.queue, [p.tag for p in again])
    pipe.execute()
    assert work_owed(clean, ["m"])["m"].owed == 0
    assert clean.hlen(broker.bundled_key(drain.queue)) == 0


def test_a_bundle_a_purge_took_is_forgotten_once_its_deadline_is_long_past(
    clean: redis.Redis,
) -> None:
    queue = broker.queue_name("m")
    stale = time.time() - 61  # beyond work_owed.BUNDLE_FORGET_AFTER_S
    clean.hset(broker.bundled_key(queue), "gone", broker.bundle_entry(3, 0, stale))
    clean.hset(broker.bundled_key(queue), "kept", broker.bundle_entry(2, 0, time.time() + 60))
    clean.hset(broker.bundled_key(queue), "forever", broker.bundle_entry(1, 0, 0))
    assert work_owed(clean, ["m"])["m"].waiting == 3  # the two still due; no list at all
    assert set(clean.hkeys(broker.bundled_key(queue))) == {b"kept", b"forever"}
