"""A decoupled model's responses through the gateway's dispatcher (``Dispatcher.stream``),
against a real Redis: the test plays the worker, pushing ``Reply`` messages onto the
gateway's reply list itself, and checks what the stream hands out."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator

import pytest
import redis

from conch.core.errors import BrokerUnavailable, Cancelled, Internal, Unavailable
from conch.frontend import producer
from conch.frontend.producer import Abandonment, Dispatcher, ResponseStream
from conch.wire import broker, statistics, stream_log
from conch.wire.messages import InferMessage, Reply
from conch.wire.work_owed import work_owed

from integration.redis._messages import infer_message

_models = itertools.count()


@pytest.fixture()
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)  # left open: the dispatchers' listeners use it


@pytest.fixture()
def model(client: redis.Redis) -> Iterator[str]:
    """A model name of this test's own, its queue emptied after it."""
    name = f"decoupled{next(_models)}"
    yield name
    client.delete(*broker.priority_keys(broker.queue_name(name)))


def message(
    model: str, deadline_s: float = 5.0, *, watched: bool = False, keep_s: int = 0
) -> InferMessage:
    return dataclasses.replace(infer_message(model, deadline_s), watched=watched, keep_s=keep_s)


def reply(
    stream: ResponseStream, seq: int, *, final: bool = False, empty: bool = False, attempt: int = 1
) -> Reply:
    outputs = [] if empty else [("Y", "FP32", (1,), bytes([seq, 0, 0, 0]))]
    return Reply(stream.msg.id, outputs=outputs, version=1, final=final, seq=seq, attempt=attempt)


def push(client: redis.Redis, stream: ResponseStream, *replies: Reply) -> None:
    assert stream.msg.reply_to
    client.rpush(stream.msg.reply_to, *(r.pack() for r in replies))


def cancelled(client: redis.Redis, model: str) -> int:
    counters = statistics.read(client, model).get(1, {})
    return statistics.failures_by_reason(counters).get(statistics.CANCELED, 0)


def seqs(stream: ResponseStream) -> list[int]:
    return [r.seq for r in stream]


def test_responses_come_in_order_up_to_the_final_one(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, reply(stream, 0), reply(stream, 1), reply(stream, 2, final=True))
    got = list(stream)
    assert [r.seq for r in got] == [0, 1, 2]
    assert [r.final for r in got] == [False, False, True]
    assert [r.outputs[0].raw[0] for r in got if r.outputs] == [0, 1, 2]
    assert d._pending == {}  # forgotten at the final reply


def test_a_reply_ahead_of_a_gap_waits_for_its_turn(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, reply(stream, 2), reply(stream, 3, final=True), reply(stream, 1))
    time.sleep(0.1)  # all three read by the listener, held: reply 0 has not come
    push(client, stream, reply(stream, 0))
    assert seqs(stream) == [0, 1, 2, 3]


def test_duplicates_and_replies_after_the_final_one_are_dropped(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(
        client,
        stream,
        reply(stream, 0),
        reply(stream, 0),  # a redelivered request run twice
        reply(stream, 2),
        reply(stream, 2),  # a duplicate of one held ahead of the gap
        reply(stream, 1),
        reply(stream, 1),
        reply(stream, 3, final=True),
        reply(stream, 4),  # past the end
    )
    assert seqs(stream) == [0, 1, 2, 3]
    # What came late found nobody waiting; the next stream is untouched by it.
    push(client, stream, reply(stream, 5, final=True))
    again = d.stream(message(model))
    push(client, again, reply(again, 0, final=True))
    assert seqs(again) == [0]


def test_an_empty_final_response(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, reply(stream, 0), reply(stream, 1, final=True, empty=True))
    got = list(stream)
    assert [(r.seq, r.final, r.outputs) for r in got[1:]] == [(1, True, [])]


def test_a_request_with_no_response_but_the_final_flag(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, reply(stream, 0, final=True, empty=True))
    assert [(r.final, r.outputs) for r in stream] == [(True, [])]


def test_an_error_mid_stream_ends_it(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    failed = Reply(stream.msg.id, error=Internal("the model failed"), seq=2)
    push(client, stream, reply(stream, 0), reply(stream, 1), failed, reply(stream, 3))
    assert next(stream).seq == 0
    assert next(stream).seq == 1
    with pytest.raises(Internal, match="the model failed"):
        next(stream)
    with pytest.raises(StopIteration):
        next(stream)
    assert d._pending == {}


def test_an_error_that_counts_nothing_ends_the_stream_where_it_stands(client, model) -> None:
    """An error reply numbered 0 after responses (a worker path that does not count
    them) is the end, not a duplicate."""
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, reply(stream, 0), reply(stream, 1))
    assert [next(stream).seq, next(stream).seq] == [0, 1]
    push(client, stream, Reply(stream.msg.id, error=Unavailable("dropped")))
    with pytest.raises(Unavailable, match="dropped"):
        next(stream)


def test_an_error_past_a_gap_waits_for_the_replies_before_it(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, Reply(stream.msg.id, error=Internal("late failure"), seq=2))
    push(client, stream, reply(stream, 0))
    assert next(stream).seq == 0
    push(client, stream, reply(stream, 1))
    assert next(stream).seq == 1
    with pytest.raises(Internal, match="late failure"):
        next(stream)


def test_the_deadline_bounds_the_whole_stream(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model, deadline_s=0.4))
    push(client, stream, reply(stream, 0))
    started = time.monotonic()
    assert next(stream).seq == 0
    with pytest.raises(Unavailable, match="Request timeout expired"):
        next(stream)
    assert 0.2 < time.monotonic() - started < 2
    assert d._pending == {}


def test_an_abandoned_stream_withdraws_its_queued_request(client, model) -> None:
    d = Dispatcher(client)
    before = cancelled(client, model)
    abandonment = Abandonment()
    stream = d.stream(message(model))
    abandonment.watch(stream)
    assert work_owed(client, [model])[model].waiting == 1
    abandonment.abandon("the client cancelled the stream")
    assert work_owed(client, [model])[model].waiting == 0  # never runs
    with pytest.raises(Cancelled, match="cancelled the stream"):
        next(stream)
    assert cancelled(client, model) == before + 1


def test_a_stream_abandoned_while_it_runs_drops_what_it_did_not_read(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    client.delete(*broker.priority_keys(broker.queue_name(model)))  # a worker took it
    push(client, stream, reply(stream, 0), reply(stream, 1))
    assert next(stream).seq == 0
    time.sleep(0.1)  # reply 1 is in order, not read yet
    assert not stream.abandon("gone")  # nothing to withdraw
    with pytest.raises(Cancelled):
        next(stream)


def test_a_stream_submitted_after_its_caller_went_away_is_withdrawn_at_once(client, model) -> None:
    abandonment = Abandonment()
    abandonment.abandon("gone")
    stream = Dispatcher(client).stream(message(model))
    abandonment.watch(stream)
    assert work_owed(client, [model])[model].waiting == 0
    with pytest.raises(Cancelled):
        next(stream)


def test_an_outage_ends_a_stream_after_the_replies_in_order(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, reply(stream, 0), reply(stream, 2))
    time.sleep(0.1)
    d._fail_waiting(BrokerUnavailable("Redis went away"))  # what the listener does then
    assert next(stream).seq == 0
    with pytest.raises(BrokerUnavailable):
        next(stream)


def test_too_many_replies_ahead_of_a_gap_fail_the_stream(client, model, monkeypatch) -> None:
    monkeypatch.setattr(producer, "MAX_EARLY_REPLIES", 3)
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, *(reply(stream, k) for k in range(1, 5)))
    with pytest.raises(Internal, match="reply 0 never came"):
        next(stream)


def test_a_stream_stopped_early_forgets_its_request(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, reply(stream, 0))
    assert next(stream).seq == 0
    stream.cancel()
    assert d._pending == {}
    with pytest.raises(StopIteration):
        next(stream)


def test_a_full_queue_refuses_a_stream(client, model) -> None:
    d = Dispatcher(client)
    d.stream(message(model), max_queue_size=1)
    with pytest.raises(Unavailable, match="Exceeds maximum queue size"):
        d.stream(message(model), max_queue_size=1)
    assert len(d._pending) == 1


def test_a_later_run_replaces_a_lost_one_and_says_so(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, reply(stream, 0), reply(stream, 1))
    assert [next(stream).seq, next(stream).seq] == [0, 1]
    # The worker died; the next run starts again from 0. The lost run's late replies
    # (its 2, and a duplicate of its 1) are dropped once the new run has begun.
    push(client, stream, reply(stream, 0, attempt=2), reply(stream, 2))
    push(client, stream, reply(stream, 1, attempt=2), reply(stream, 2, attempt=2, final=True))
    got = list(stream)
    assert [(r.attempt, r.seq, r.restarted) for r in got] == [
        (2, 0, True),
        (2, 1, False),
        (2, 2, False),
    ]


def test_a_run_lost_before_anything_was_read_is_no_restart(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model))
    push(client, stream, reply(stream, 1))  # ahead of a gap: held, never released
    time.sleep(0.1)
    push(client, stream, reply(stream, 0, attempt=3, final=True))
    (only,) = list(stream)
    assert (only.attempt, only.restarted) == (3, False)


def lease_alive(client: redis.Redis, stream: ResponseStream) -> bool:
    return stream_log.held(client, [stream.msg.id])[0]


def test_a_watched_stream_holds_a_lease_while_read_and_ends_it_when_stopped(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model, watched=True), grace_s=2.0)
    assert lease_alive(client, stream)  # before anything is queued
    time.sleep(2.5)  # past its time to live: renewed meanwhile
    assert lease_alive(client, stream)
    stream.cancel()  # the caller stopped early: cancelled at once
    assert not lease_alive(client, stream)


def test_a_kept_stream_whose_client_left_is_withdrawn_after_its_grace(client, model) -> None:
    d = Dispatcher(client)
    before = cancelled(client, model)
    stream = d.stream(message(model, watched=True, keep_s=60), grace_s=2.0)
    head = stream_log.head(client, stream.msg.id)
    assert head is not None and head.model == model  # its log is open before it runs
    abandonment = Abandonment()
    abandonment.watch(stream)
    abandonment.abandon("the client closed the connection")
    with pytest.raises(Cancelled):
        next(stream)
    # The client may come back: still queued, its lease alive, for the grace time.
    assert work_owed(client, [model])[model].waiting == 1
    assert lease_alive(client, stream)
    deadline = time.monotonic() + 5
    while work_owed(client, [model])[model].waiting and time.monotonic() < deadline:
        time.sleep(0.1)
    assert work_owed(client, [model])[model].waiting == 0
    assert cancelled(client, model) == before + 1


def test_a_kept_stream_whose_client_came_back_stays_queued(client, model) -> None:
    d = Dispatcher(client)
    stream = d.stream(message(model, watched=True, keep_s=60), grace_s=2.0)
    stream.cancel()
    # Another reader (a reconnect, maybe through another gateway) holds the lease.
    other = Dispatcher(client)
    other.leases.add(stream.msg.id, 2.0)
    time.sleep(3.5)
    assert work_owed(client, [model])[model].waiting == 1
    other.leases.drop(stream.msg.id)


def test_a_routed_watched_stream_gets_its_lease_and_head_before_it_is_routed(client, model) -> None:
    """A sequence's request goes to its mailbox, not through the publisher: its lease and
    log head are written first, on their own."""
    seen: list[tuple[bool, bool]] = []

    def route(msg: InferMessage) -> None:
        alive = stream_log.held(client, [msg.id])[0]
        seen.append((alive, stream_log.head(client, msg.id) is not None))

    d = Dispatcher(client)
    stream = d.stream(message(model, watched=True, keep_s=60), grace_s=2.0, route=route)
    assert seen == [(True, True)]
    stream.cancel()
