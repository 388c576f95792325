"""The work-owed count against a real Redis: the gateway's publish, the worker's pop and
ack, and kombu's own restore of expired messages, played by hand."""

from __future__ import annotations

import time

import kombu
import pytest
import redis

from conch.wire import broker, keys
from conch.wire.work_owed import JobsWork, ModelWork, jobs_owed, queued_models, work_owed
from conch.worker.drain import Drain, ack

from harness import fresh_db


def publish(client: redis.Redis, model: str, step: int, n: int) -> None:
    pub = broker.Publisher(client)
    for _ in range(n):
        tag = broker.new_id()
        pub.publish(model, {"id": tag}, task_id=tag, priority=step, reply_to=None)


@pytest.fixture()
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 10)


@pytest.fixture()
def clean(db: str) -> redis.Redis:
    return redis.Redis.from_url(db)


def test_waiting_counts_every_priority_step_and_in_flight_what_was_popped(
    clean: redis.Redis,
) -> None:
    for step, n in ((0, 3), (4, 2), (broker.PRIORITY_ASYNC, 5), (broker.PRIORITY_OFFLINE, 7)):
        publish(clean, "m", step, n)
    publish(clean, "other", 0, 1)
    assert work_owed(clean, ["m"])["m"] == ModelWork("m", 17, 0, (3, 0, 0, 0, 2, 0, 0, 0, 5, 7))

    drain = Drain(clean, "m")
    held = drain.pop(4)  # the three at step 0, then one at step 4
    w = work_owed(clean, ["m", "other", "none"])
    assert (w["m"].waiting, w["m"].in_flight, w["m"].owed) == (13, 4, 17)
    assert w["m"].by_class() == {"online": 1, "async": 5, "offline": 7}
    assert w["other"] == ModelWork("other", 1, 0, (1, *[0] * 9))
    assert w["none"].owed == 0

    pipe = clean.pipeline()
    ack(pipe, drain.queue, [p.tag for p in held[:3]])
    pipe.execute()
    assert (work_owed(clean, ["m"])["m"].in_flight, work_owed(clean, ["m"])["m"].owed) == (1, 14)
    # Another model's messages in flight are not this model's.
    other = Drain(clean, "other")
    other.pop(1)
    w = work_owed(clean, ["m", "other"])
    assert (w["m"].in_flight, w["other"].in_flight, w["other"].waiting) == (1, 1, 0)


def test_kombu_restoring_expired_messages_moves_them_from_in_flight_to_waiting(
    clean: redis.Redis, db: str
) -> None:
    """A dead worker's messages: in flight until kombu's sweep puts them back, then
    waiting, never both; the in-flight set forgets them, and counts them again once a
    worker pops them again."""
    n = 2500  # more tags than one SREM takes
    pipe = clean.pipeline(transaction=False)
    for i in range(n):
        tag = f"t{i}"
        raw = broker.envelope(
            {"id": tag}, task_id=tag, queue=broker.queue_name("m"), priority=i % 10, reply_to=None
        )
        pipe.lpush(broker.priority_key(broker.queue_name("m"), i % 10), raw)
    pipe.execute()
    drain = Drain(clean, "m")
    assert len(drain.pop(n)) == n
    # In flight by the class of the sub-list each left: steps 0-7 online, 8 async, 9 offline.
    held = (n * 8 // 10, n // 10, n // 10)
    assert work_owed(clean, ["m"])["m"] == ModelWork("m", 0, n, (0,) * 10, held=held)
    clean.zadd(keys.UNACKED_INDEX, {f"t{i}": 1.0 for i in range(n)})  # long expired

    # The worker's own transport options (``worker.app.make_celery``): conch's steps.
    options = {"visibility_timeout": 1, "priority_steps": list(broker.PRIORITY_STEPS)}
    with kombu.Connection(db, transport_options=options) as conn:
        qos = conn.default_channel.qos
        for _ in range(n // 100 + 1):
            qos.restore_visible(num=100, interval=1)
    assert clean.hlen(keys.UNACKED) == 0
    w = work_owed(clean, ["m"])["m"]
    assert (w.waiting, w.in_flight) == (n, 0)
    assert w.steps == (n // 10,) * 10  # back in their own priority steps
    assert clean.scard(broker.in_flight_key(drain.queue)) == 0  # forgotten, not leaked
    assert clean.hlen(broker.in_flight_class_key(drain.queue)) == 0

    again = drain.pop(10)
    assert [p.attempts for p in again] == [2] * 10  # the same messages, a second time
    w = work_owed(clean, ["m"])["m"]
    assert (w.waiting, w.in_flight) == (n - 10, 10)


def test_a_tag_acked_by_a_process_that_does_not_know_the_set_is_forgotten(
    clean: redis.Redis,
) -> None:
    """kombu's own ack (HDEL and ZREM) leaves the tag in the set: it is not counted."""
    publish(clean, "m", 0, 2)
    drain = Drain(clean, "m")
    first, _ = drain.pop(2)
    tag = first.tag
    clean.hdel(keys.UNACKED, tag)
    clean.zrem(keys.UNACKED_INDEX, tag)
    assert work_owed(clean, ["m"])["m"].in_flight == 1
    assert clean.scard(broker.in_flight_key(drain.queue)) == 1


def test_a_count_is_one_round_trip_per_64_models_and_holds_for_many(clean: redis.Redis) -> None:
    names = [f"m{i}" for i in range(150)]
    for i, name in enumerate(names):
        publish(clean, name, i % 10, 1 + i % 3)
    started = time.perf_counter()
    w = work_owed(clean, names)
    took = time.perf_counter() - started
    assert list(w) == names
    assert [x.waiting for x in w.values()] == [1 + i % 3 for i in range(150)]
    assert took < 1.0


def test_queued_models_are_found_by_any_key_of_their_queue(clean: redis.Redis) -> None:
    publish(clean, "a.b", 0, 1)  # the plain list (and its wake list)
    publish(clean, "c d", broker.PRIORITY_OFFLINE, 1)  # only a priority sub-list
    publish(clean, "held", 3, 1)
    Drain(clean, "held").pop(1)  # only its in-flight set (and the emptied wake list)
    clean.set("conch.modelish", 1)
    assert queued_models(clean) == ["a.b", "c d", "held"]
    assert broker.model_of_key(broker.wake_key(broker.queue_name("x"))) == "x"
    assert broker.model_of_key(broker.priority_key(broker.queue_name("x.y"), 9)) == "x.y"
    assert broker.model_of_key("conch.jobs") is None


def _job_message(job_id: str) -> bytes:
    """A batch job's task message, as the gateway queues it (``batch_job.submit``)."""
    return broker.envelope(
        {"id": job_id},
        task_id=job_id,
        queue=broker.JOBS_QUEUE,
        priority=0,
        reply_to=None,
        task="conch.batch_job",
    )


def test_the_jobs_queue_owes_what_waits_and_what_a_driver_runs_and_leaks_no_crashed_driver(
    clean: redis.Redis, db: str
) -> None:
    """Jobs waiting in any sub-list of conch.jobs; a job a Celery consumer took counts in
    flight while its driver runs, and nowhere between its pop and its driver's start; a
    driver that died is counted until kombu restores its message, then that message as
    waiting, once; a job Celery acked is forgotten."""
    ids = [broker.new_id() for _ in range(3)]
    clean.lpush(broker.JOBS_QUEUE, _job_message(ids[0]), _job_message(ids[1]))
    restored = broker.priority_key(broker.JOBS_QUEUE, 3)  # where a restore may put one
    clean.lpush(restored, _job_message(ids[2]))
    publish(clean, "m", 0, 2)  # a model's queue is not the jobs queue
    assert jobs_owed(clean) == JobsWork(3, 0)

    options = {"visibility_timeout": 1, "priority_steps": list(broker.PRIORITY_STEPS)}
    with kombu.Connection(db, transport_options=options) as conn:
        channel = conn.default_channel
        taken = channel.basic_get(broker.JOBS_QUEUE, no_ack=False)  # Celery's consumer
        tag = taken.delivery_tag
        assert tag in ids  # the delivery tag is the job id
        assert clean.hexists(keys.UNACKED, tag)
        assert jobs_owed(clean) == JobsWork(2, 0)  # popped, no driver yet
        broker.job_running(clean, tag)
        assert jobs_owed(clean) == JobsWork(2, 1)
        assert work_owed(clean, ["m"])["m"].owed == 2  # no model owes it

        # The driver's worker dies: counted in flight until kombu's sweep restores it.
        clean.zadd(keys.UNACKED_INDEX, {tag: 1.0})
        assert jobs_owed(clean) == JobsWork(2, 1)
        channel.qos.restore_visible(num=10, interval=1)
        assert not clean.hexists(keys.UNACKED, tag)
        assert jobs_owed(clean) == JobsWork(3, 0)
        assert clean.scard(broker.in_flight_key(broker.JOBS_QUEUE)) == 0  # forgotten

        # Another worker runs it; Celery acks it without the driver's own end mark.
        again = channel.basic_get(broker.JOBS_QUEUE, no_ack=False)
        broker.job_running(clean, again.delivery_tag)
        assert jobs_owed(clean) == JobsWork(2, 1)
        again.ack()
        assert jobs_owed(clean) == JobsWork(2, 0)
        assert clean.scard(broker.in_flight_key(broker.JOBS_QUEUE)) == 0
        # A driver that ends marks itself done.
        last = channel.basic_get(broker.JOBS_QUEUE, no_ack=False)
        broker.job_running(clean, last.delivery_tag)
        broker.job_ended(clean, last.delivery_tag)
        assert jobs_owed(clean) == JobsWork(1, 0)


def test_offline_work_a_pop_leaves_is_held_back_or_only_not_taken(clean: redis.Redis) -> None:
    """A pop's ``offline`` cap: offline messages held back (OfflineShare) are not waiting
    for anyone and wake no worker; those a batch merely had no room for are waiting, and
    wake one."""
    publish(clean, "m", broker.PRIORITY_OFFLINE, 5)
    drain = Drain(clean, "m")
    wake = broker.wake_key(drain.queue)
    assert len(drain.pop(8, offline=1, held=True)) == 1
    assert drain.waiting == 0 and clean.llen(wake) == 0
    assert len(drain.pop(8, offline=2, held=False)) == 2
    assert drain.waiting == 2 and clean.llen(wake) == 2
    assert len(drain.pop(8)) == 2 and drain.waiting == 0
