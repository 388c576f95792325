"""A drain loop's short waits against a real Redis: a batch's queue delay ends when a
message comes, with no poll, and leaves no BLPOP behind to take another's token."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from conch.wire import broker
from conch.wire.messages import InferMessage
from conch.worker.drain import Drain

from integration.redis._messages import infer_message


def publish(client: redis.Redis, model: str, delay_s: float = 0.0) -> InferMessage:
    """``infer_message(model)`` published now, or ``delay_s`` from now by another thread."""
    msg, publisher = infer_message(model), broker.Publisher(client)

    def go() -> None:
        publisher.publish(model, msg.to_dict(), task_id=msg.id, priority=0, reply_to=None)

    threading.Timer(delay_s, go).start() if delay_s else go()
    return msg


def fresh(redis_url: str, model: str) -> tuple[redis.Redis, str]:
    client = redis.Redis.from_url(redis_url)
    queue = broker.queue_name(model)
    client.delete(broker.wake_key(queue), *broker.priority_keys(queue))
    return client, queue


def blocked_waits(client: redis.Redis, queue: str) -> list[int]:
    """The ids of the short waits on ``queue`` that Redis holds in a BLPOP now."""
    return [
        int(c["id"])
        for c in client.client_list()
        if "b" in c.get("flags", "") and c.get("name") == f"conch-wait:{queue}"
    ]


def test_a_short_wait_ends_when_a_message_is_published_not_at_a_poll(redis_url: str) -> None:
    model = "short"
    client, queue = fresh(redis_url, model)
    drain = Drain(client, model)
    assert drain.pop(8) == []
    publish(client, model, 0.05)
    t0 = time.monotonic()
    assert drain.wait(0.15) is True  # shorter than Redis's clock ticks let a BLPOP time
    assert 0.04 < time.monotonic() - t0 < 0.13
    assert len(drain.pop(8)) == 1
    # Nothing published: the wait takes its whole time, then says so.
    t0 = time.monotonic()
    assert drain.wait(0.06) is False
    assert 0.055 < time.monotonic() - t0 < 0.09
    assert len(blocked_waits(client, queue)) == 1
    assert drain.pop(8) == [] and blocked_waits(client, queue) == []


def test_a_lapsed_short_wait_takes_no_token_once_the_next_pop_ends_it(redis_url: str) -> None:
    model = "lapsed"
    client, queue = fresh(redis_url, model)
    drain, other = Drain(client, model), Drain(client, model)
    assert drain.wait(0.02) is False
    assert len(blocked_waits(client, queue)) == 1  # its BLPOP, still pending in Redis
    assert drain.pop(8) == []  # ... ended by the unblock riding with the pop
    assert blocked_waits(client, queue) == []
    msg = publish(client, model)
    assert client.llen(broker.wake_key(queue)) == 1  # the token is there for an idle instance
    assert other.wait(0.05) is True
    assert [p.tag for p in other.pop(8)] == [msg.id]
    # The drain whose BLPOP was ended waits again as before (it reads the nil reply first).
    publish(client, model, 0.03)
    assert drain.wait(0.15) is True and len(drain.pop(8)) == 1
    # A lapse followed by a pop that rides with a batch's replies (Drain.queue_pop).
    assert drain.wait(0.02) is False and len(blocked_waits(client, queue)) == 1
    pipe = client.pipeline(transaction=False)
    drain.queue_pop(pipe, 8)
    assert drain.popped(pipe.execute()[-1], 8) == [] and blocked_waits(client, queue) == []
    assert client.llen(broker.wake_key(queue)) == 0


def test_a_short_wait_survives_a_lost_connection(redis_url: str) -> None:
    model = "lost"
    client, queue = fresh(redis_url, model)
    drain = Drain(client, model)
    assert drain.wait(0.02) is False
    for blocked in blocked_waits(client, queue):
        client.client_kill_filter(_id=blocked)
    with pytest.raises(redis.ConnectionError):
        drain.wait(0.05)  # the batch loop's Redis error handling retries
    publish(client, model, 0.03)
    assert drain.wait(0.15) is True  # on a new connection
    assert len(drain.pop(8)) == 1
