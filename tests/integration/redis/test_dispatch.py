"""The gateway's dispatcher against a real Redis, with a hand-played worker."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from conch.core.errors import Unavailable
from conch.frontend.producer import Dispatcher
from conch.wire import broker, keys
from conch.wire.messages import InferMessage, Reply
from conch.wire.work_owed import work_owed
from conch.worker.drain import Drain, ack

from harness import fresh_db
from integration.redis._messages import infer_message as message


def waiting(client: redis.Redis) -> int:
    return work_owed(client, ["m"])["m"].waiting


def play_worker(client: redis.Redis, replies: int) -> threading.Thread:
    """Pop one request like a worker and answer it ``replies`` times."""

    def run() -> None:
        drain = Drain(client, "m")
        while True:
            popped = drain.pop(1)
            if popped:
                break
            time.sleep(0.01)
        tag, raw = popped[0].tag, popped[0].raw
        payload = broker.decode(raw).payload
        msg = InferMessage.from_dict(payload)
        for i in range(replies):
            reply = Reply(msg.id, outputs=[("Y", "FP32", (1,), bytes([i, 0, 0, 0]))])
            client.rpush(msg.reply_to, reply.pack())
        pipe = client.pipeline()
        ack(pipe, drain.queue, [tag])
        pipe.execute()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_duplicate_replies_are_ignored(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(broker.queue_name("m"))
    d = Dispatcher(client)
    worker = play_worker(client, replies=3)  # a redelivered request answered again and again
    reply = d.call(message())
    worker.join(5)
    assert reply.outputs is not None and reply.outputs[0].raw == b"\0\0\0\0"  # the first one wins
    # The late duplicates find no waiting request and change nothing; the next call is fine.
    worker = play_worker(client, replies=1)
    assert d.call(message()).outputs is not None
    worker.join(5)


def test_a_cancelled_request_is_forgotten(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(broker.queue_name("m"))
    d = Dispatcher(client)
    pending = d.submit(message())  # an ensemble step whose sibling failed
    assert pending.msg.reply_to == d.reply_key
    pending.cancel()
    assert d._pending == {}
    play_worker(client, replies=1).join(5)  # its late reply finds nobody waiting
    worker = play_worker(client, replies=1)
    assert d.call(message()).outputs is not None
    worker.join(5)
    assert d._pending == {}


def test_deadline_without_a_worker(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(broker.queue_name("m"))
    started = time.monotonic()
    with pytest.raises(Unavailable, match="timeout"):
        Dispatcher(client).call(message(deadline_s=0.2))
    assert 0.15 < time.monotonic() - started < 2
    assert waiting(client) == 1  # still queued: a late worker drops it
    client.delete(broker.queue_name("m"))


def test_full_queue_is_refused(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(broker.queue_name("m"))
    publisher = broker.Publisher(client)
    msg = message()
    assert publisher.publish(
        "m", msg.to_dict(), task_id="a", priority=0, reply_to=None, max_queue_size=2
    )
    assert publisher.publish(
        "m", msg.to_dict(), task_id="b", priority=0, reply_to=None, max_queue_size=2
    )
    assert not publisher.publish(
        "m", msg.to_dict(), task_id="c", priority=0, reply_to=None, max_queue_size=2
    )
    assert waiting(client) == 2
    client.delete(broker.queue_name("m"))


def test_a_request_a_forming_batch_holds_counts_against_its_step_bound(redis_url: str) -> None:
    """A bounded queue's pop marks what it takes held (``broker.held_key``): it counts at its
    own step until its batch runs (``release``) or it is acked, and is forgotten once it is
    no longer in flight (kombu restored it after its worker died: it waits in the list)."""
    client = redis.Redis.from_url(fresh_db(redis_url, 11))
    publisher = broker.Publisher(client)

    def publish(task_id: str, step: int = 0, bound: int = 1) -> bool:
        msg = message().to_dict()
        got = publisher.publish(
            "m", msg, task_id=task_id, priority=step, reply_to=None, max_queue_size=bound
        )
        return got is not None

    drain = Drain(client, "m", hold=True)
    assert publish("a")
    [held] = drain.pop(4)
    assert not publish("b")  # the forming batch's request fills the queue of one
    assert publish("c", step=1)  # another level's queue is bounded on its own
    drain.release([held.tag])
    assert publish("d")  # its batch went: the queue is empty again
    taken = drain.pop(4)
    pipe = client.pipeline()
    ack(pipe, drain.queue, [p.tag for p in taken])
    pipe.execute()
    assert publish("e")  # acked (answered, or dealt with before it ran): gone too
    [lost] = drain.pop(1)
    client.hdel(keys.UNACKED, lost.tag)  # kombu's restore, by hand: back in its list
    client.rpush(broker.queue_name("m"), lost.raw)
    assert publish("f", bound=2)  # counted once, in the list: its held mark is forgotten
    assert not client.hexists(broker.held_key(drain.queue), lost.tag)
    assert not publish("g", bound=2)


def test_a_message_still_queued_can_be_withdrawn(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(*broker.priority_keys(broker.queue_name("m")))
    publisher = broker.Publisher(client)
    msg = message()
    raw = publisher.publish("m", msg.to_dict(), task_id="w", priority=0, reply_to=None)
    assert raw and waiting(client) == 1
    assert broker.withdraw(client, "m", 0, raw)
    assert waiting(client) == 0
    assert not broker.withdraw(client, "m", 0, raw)  # gone already: a worker took it


def test_a_publish_sends_its_before_commands_first_in_its_round_trip(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete("before:a", *broker.priority_keys(broker.queue_name("m")))
    publisher = broker.Publisher(client)
    client.script_flush()  # the retry after NOSCRIPT publishes again, and only that
    raw = publisher.publish(
        "m",
        message().to_dict(),
        task_id="t1",
        priority=0,
        reply_to=None,
        before=(("RPUSH", "before:a", "x"),),
    )
    assert raw and waiting(client) == 1
    assert client.lrange("before:a", 0, -1) == [b"x"]  # sent once, though published twice


def test_a_request_alone_publishes_without_a_turn_for_others_to_join(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group commit's turn of the hub (``time.sleep(0)``) is for other requests of the
    process to join the flush; a request with none beside it goes at once."""
    client = redis.Redis.from_url(redis_url)
    client.delete(broker.queue_name("m"))
    d = Dispatcher(client)
    turns: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(broker.time, "sleep", lambda s: turns.append(s) or real_sleep(s))
    alone = d.submit(message())
    assert turns == []
    beside = d.submit(message())  # another request of the process waits: it may join
    assert turns == [0]
    alone.cancel()
    beside.cancel()
    client.delete(broker.queue_name("m"))
