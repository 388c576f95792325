"""The Batcher through its seams: a fake drain feeds it, a fake sink takes its replies,
and a recording pipeline stands in for Redis."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import redis

from conch.core.errors import Internal, Unavailable
from conch.core.model_config import parse_config
from conch.devtools.processes import wait_until
from conch.wire import broker, keys
from conch.wire.messages import InferMessage, Reply, WireTensor
from conch.worker.batcher import Batcher, BatchPolicy, InFlight
from conch.worker.drain import Popped
from conch.worker.loop_parts import QueueParts

CONFIG = parse_config(
    "max_batch_size: 8 dynamic_batching { }\n"
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
    model="m",
    source="test",
)


class FakeDrain:
    queue = broker.queue_name("m")

    def __init__(self) -> None:
        self.queued: list[Popped] = []
        self.waiting = 0
        self.taken: list[tuple[str, int]] = []  # (how, count) of every pop that took some

    def put(self, msg: InferMessage, attempts: int = 1) -> None:
        raw = broker.envelope(
            msg.to_dict(), task_id=msg.id, queue=self.queue, priority=0, reply_to=msg.reply_to
        )
        self.queued.append(Popped(msg.id, raw, attempts))

    def put_bundle(self, msgs: list[InferMessage], attempts: int = 1) -> str:
        """One message for all of ``msgs`` (a gateway's bundle); its tag."""
        tag = broker.new_id()
        raw = broker.bundle_envelope(
            [m.to_dict() for m in msgs], task_id=tag, queue=self.queue, priority=0, reply_to=None
        )
        self.queued.append(Popped(tag, raw, attempts))
        return tag

    def release(self, tags: set[str]) -> None:
        pass  # the fake bounds no queue

    def pop(
        self, count: int, offline: int | None = None, held: bool = True, how: str = "pop"
    ) -> list[Popped]:
        # The fake's messages are all online (priority 0): ``offline`` limits none of them.
        taken, self.queued = self.queued[:count], self.queued[count:]
        self.waiting = len(self.queued)
        if taken:
            self.taken.append((how, len(taken)))
        return taken

    def wait(self, timeout: float) -> bool:
        time.sleep(min(timeout, 0.01))
        return bool(self.queued)  # a wake token comes with every message queued

    def queue_pop(
        self, pipe: Any, count: int, offline: int | None = None, held: bool = True
    ) -> None:
        pipe.execute_command("POP", count)

    def popped(
        self, result: Any, count: int, offline: int | None = None, held: bool = True
    ) -> list[Popped]:
        return self.pop(count, offline, held, how="with the replies")


class FakeSink:
    client = None  # the real one's Redis: what a running request's is_cancelled() reads

    def __init__(self, cancelled: set[str] = frozenset()) -> None:
        self.replies: dict[str, Reply] = {}
        self._cancelled = set(cancelled)

    def deliver(self, pipe: Any, msg: InferMessage, reply: Reply) -> None:
        self.deliver_all(pipe, [(msg, reply)])

    def deliver_all(self, pipe: Any, answers: Any) -> None:
        for msg, reply in answers:
            pipe.execute_command("REPLY", msg.id)
            self.replies[msg.id] = reply

    def cancelled(self, msgs: Any) -> set[str]:
        return {m.id for m in msgs if m.id in self._cancelled}


class FakePipe:
    """Records the commands queued on it; Redis is never reached."""

    def __init__(self, log: list[tuple[str, tuple]]) -> None:
        self.calls = log

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append((name, args))

    def execute_command(self, *args: Any) -> None:
        self.calls.append((args[0].lower(), args[1:]))

    def execute(self, raise_on_error: bool = True) -> list:
        self.calls.append(("execute", ()))
        return [None]  # the pop's slot, when one was queued (FakeDrain pops itself)


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def pipeline(self, transaction: bool = True) -> FakePipe:
        return FakePipe(self.calls)

    def run(self, commands: Any) -> list:
        """The batcher's own round trips (it takes this client as its ``link`` too)."""
        for args in commands.queued:
            self.calls.append((args[0].lower(), tuple(args[1:])))
        self.calls.append(("execute", ()))
        return [None] * len(commands.queued)  # the pop's slot: FakeDrain pops itself


class Doubler:
    """A backend answering Y = 2 X, recording the batches it was given."""

    spec = SimpleNamespace(config=CONFIG)

    def __init__(self) -> None:
        self.batches: list[int] = []

    def execute(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
        self.batches.append(len(requests))
        return [{"Y": r.inputs["X"] * 2} for r in requests]


def message(rows: int, **fields: Any) -> InferMessage:
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    now = time.time()
    base: dict[str, Any] = {
        "id": broker.new_id(),
        "model": "m",
        "version": -1,
        "inputs": [WireTensor("X", "FP32", (rows, 4), x.tobytes())],
        "outputs": ["Y"],
        "reply_to": "conch.reply.test",
        "enqueued": now,
        "deadline": now + 30,
    }
    return InferMessage(**{**base, **fields})


def run_until(batcher: Batcher, done: Any) -> None:
    batcher.start()
    wait_until(done, 10, every=0.005)
    batcher.stop()
    batcher.join(timeout=5)
    assert done()


def make(drain: FakeDrain, sink: FakeSink, client: FakeClient, **kwargs: Any) -> Batcher:
    policy = kwargs.pop("policy", BatchPolicy(8, 0.0))
    parts = QueueParts(
        client=client,  # type: ignore[arg-type]
        model="m",
        backends=kwargs.pop("backends"),
        name="batcher-m",
        inflight=kwargs.pop("inflight", InFlight()),
        drain=drain,  # type: ignore[arg-type]
        sink=sink,  # type: ignore[arg-type]
        link=client,  # type: ignore[arg-type]
        **kwargs,
    )
    return Batcher(parts, policy, idle_poll=0.01)


def test_queued_requests_run_as_one_batch_and_each_gets_its_reply_then_an_ack() -> None:
    drain, sink, client, backend = FakeDrain(), FakeSink(), FakeClient(), Doubler()
    msgs = [message(1), message(2), message(1)]
    for m in msgs:
        drain.put(m)
    counted: list[dict[str, int]] = []
    inflight = InFlight()
    batcher = make(
        drain,
        sink,
        client,
        backends={1: backend},
        inflight=inflight,
        on_batch=lambda model, counts: counted.append(counts),
    )
    run_until(batcher, lambda: len(sink.replies) == 3)
    assert backend.batches == [3]
    for m in msgs:
        reply = sink.replies[m.id]
        assert reply.error is None and reply.version == 1 and reply.batch_size == 4
        ((name, datatype, shape, raw),) = reply.outputs
        x = np.frombuffer(m.inputs[0].raw, np.float32).reshape(shape)
        assert (name, datatype) == ("Y", "FP32")
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(shape), 2 * x)
    # Reply, then ack, in one pipeline: a crash in between re-runs, never loses.
    replied = [k for k, c in enumerate(client.calls) if c[0] == "reply"]
    acked = [
        k
        for k, c in enumerate(client.calls)
        if c == ("hdel", (keys.UNACKED, *[m.id for m in msgs]))
    ]
    assert acked and max(replied) < acked[0] < client.calls.index(("execute", ()), acked[0])
    assert counted == [
        {
            "executions": 1,
            "requests": 3,
            "rows": 4,
            "success": 3,
            "failure": 0,
            "queue_us": counted[0]["queue_us"],
            "compute_us": counted[0]["compute_us"],
        }
    ]
    assert inflight.snapshot() == []


def test_the_next_pop_shares_the_round_trip_of_the_batch_before_it() -> None:
    drain, sink, client, backend = FakeDrain(), FakeSink(), FakeClient(), Doubler()
    msgs = [message(1) for _ in range(10)]
    for m in msgs:
        drain.put(m)
    batcher = make(drain, sink, client, backends={1: backend})
    run_until(batcher, lambda: len(sink.replies) == 10)
    assert backend.batches == [8, 2]
    # The second batch came from the pop queued behind the first one's replies and acks.
    assert drain.taken == [("pop", 8), ("with the replies", 2)]
    first_ack = client.calls.index(("hdel", (keys.UNACKED, *[m.id for m in msgs[:8]])))
    pop = client.calls.index(("pop", (8,)))
    assert first_ack < pop < client.calls.index(("execute", ()), first_ack)


class Slow(Doubler):
    def execute(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
        time.sleep(0.002)  # four times the budget a pop may fill
        return super().execute(requests)


def test_without_dynamic_batching_each_request_runs_alone_and_fast_ones_share_pops() -> None:
    for backend, shared in ((Doubler(), True), (Slow(), False)):
        drain, sink, client = FakeDrain(), FakeSink(), FakeClient()
        msgs = [message(1) for _ in range(12)]
        for m in msgs:
            drain.put(m)
        batcher = make(drain, sink, client, backends={1: backend}, policy=BatchPolicy(1, 0.0))
        run_until(batcher, lambda sink=sink: len(sink.replies) == 12)
        assert backend.batches == [1] * 12  # one execution per request, always
        assert all(sink.replies[m.id].error is None for m in msgs)
        # The first pop takes one; once a request is known to run fast, a pop takes
        # several (their replies then go in one round trip); a slow model's never do.
        assert drain.taken[0] == ("pop", 1)
        assert (max(n for _, n in drain.taken) > 1) is shared, drain.taken


def test_requests_that_must_not_run_are_answered_or_dropped_without_running() -> None:
    drain, client, backend = FakeDrain(), FakeClient(), Doubler()
    past = time.time() - 1
    expired_job = message(1, deadline=past, job_ttl=60)  # no one waits: its result says why
    expired = message(1, deadline=past)  # its caller gave up already: dropped
    cancelled = message(1, job_ttl=60)
    poison = message(1)
    good = message(1)
    sink = FakeSink(cancelled={cancelled.id})
    for m in (expired_job, expired, cancelled, good):
        drain.put(m)
    drain.put(poison, attempts=4)  # past max_attempts: every try killed its worker
    batcher = make(drain, sink, client, backends={1: backend}, max_attempts=3)
    run_until(batcher, lambda: good.id in sink.replies)
    assert backend.batches == [1]
    assert set(sink.replies) == {expired_job.id, poison.id, good.id}
    assert isinstance(sink.replies[expired_job.id].error, Unavailable)
    assert isinstance(sink.replies[poison.id].error, Internal)
    assert any(c[0] == "lpush" and c[1][0] == keys.DEADLETTER for c in client.calls)
    acked = {
        t
        for name, args in client.calls
        if name == "hdel" and args[0] == keys.UNACKED
        for t in args[1:]
    }
    assert acked == {m.id for m in (expired_job, expired, cancelled, poison, good)}


class FlakyClient(FakeClient):
    """Redis that cannot be reached for the first ``down`` round trips of the batcher."""

    def __init__(self, down: int) -> None:
        super().__init__()
        self.down = down
        self.refused = 0

    def run(self, commands: Any) -> list:
        if self.refused < self.down:
            self.refused += 1
            raise redis.ConnectionError(
                "Error 111 connecting to 127.0.0.1:6379. Connection refused."
            )
        return super().run(commands)


def test_replies_wait_out_a_redis_outage_and_the_batch_never_runs_again() -> None:
    drain, sink, client, backend = FakeDrain(), FakeSink(), FlakyClient(down=3), Doubler()
    msgs = [message(1), message(1)]
    for m in msgs:
        drain.put(m)
    inflight = InFlight()
    batcher = make(drain, sink, client, backends={1: backend}, inflight=inflight)
    run_until(batcher, lambda: ("execute", ()) in client.calls)
    assert client.refused == 3  # tried again until Redis answered
    assert backend.batches == [2]  # ran once: its replies were held, not given up
    assert [c for c in client.calls if c[0] == "reply"] == [("reply", (m.id,)) for m in msgs]
    assert ("hdel", (keys.UNACKED, *[m.id for m in msgs])) in client.calls
    assert inflight.snapshot() == []


def test_a_batcher_that_loses_redis_while_admitting_lets_go_of_what_it_popped() -> None:
    class Unreachable(FakeSink):
        def cancelled(self, msgs: Any) -> set[str]:
            list(msgs)
            raise redis.ConnectionError("Redis closed the connection")

    drain, client, backend = FakeDrain(), FakeClient(), Doubler()
    drain.put(message(1))
    inflight = InFlight()
    batcher = make(drain, Unreachable(), client, backends={1: backend}, inflight=inflight)
    run_until(batcher, lambda: drain.taken)
    # Not held for ever (the heartbeat would keep it from the visibility timeout): let go,
    # for the visibility timeout to bring back; never run.
    assert inflight.snapshot() == [] and backend.batches == []


def test_offline_messages_a_batch_has_no_room_for_go_back_and_their_share_is_refunded() -> None:
    from conch.worker.offline_share import OfflineShare

    class Spy(OfflineShare):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, tuple]] = []

        def took(self, rows: int, messages: int) -> None:
            self.calls.append(("took", (rows, messages)))
            super().took(rows, messages)

        def refund(self, rows: int) -> None:
            self.calls.append(("refund", (rows,)))
            super().refund(rows)

    drain, sink, client, backend = FakeDrain(), FakeSink(), FakeClient(), Doubler()
    online = message(3)
    offline = message(2, priority=broker.PRIORITY_OFFLINE, deadline=0.0)
    drain.put(online)
    drain.put(offline)
    inflight = InFlight()
    batcher = make(
        drain, sink, client, backends={1: backend}, policy=BatchPolicy(4, 0.0), inflight=inflight
    )
    batcher.offline_share = spy = Spy()
    run_until(batcher, lambda: online.id in sink.replies)
    assert backend.batches == [1] and offline.id not in sink.replies  # 3 + 2 rows > 4
    assert spy.calls == [("took", (2, 1)), ("refund", (2,))]
    # Back at the head of its sub-list (not carried to lead the next batch), and acked.
    requeued = [args for name, args in client.calls if name == "rpush"]
    assert [key for key, _ in requeued] == [
        broker.priority_key(drain.queue, broker.PRIORITY_OFFLINE)
    ]
    assert ("hdel", (keys.UNACKED, offline.id)) in client.calls
    assert inflight.snapshot() == []


# -- bundles: one message for many requests ------------------------------------------


def acked_tags(client: FakeClient) -> list[str]:
    """Every tag acked, in order, as often as it was."""
    return [
        t
        for name, args in client.calls
        if name == "hdel" and args[0] == keys.UNACKED
        for t in args[1:]
    ]


def test_a_bundles_requests_run_in_one_batch_each_answered_and_the_bundle_acked_once() -> None:
    drain, sink, client, backend = FakeDrain(), FakeSink(), FakeClient(), Doubler()
    msgs = [message(1), message(2), message(1)]
    tag = drain.put_bundle(msgs)
    inflight = InFlight()
    batcher = make(drain, sink, client, backends={1: backend}, inflight=inflight)
    run_until(batcher, lambda: len(sink.replies) == 3)
    assert backend.batches == [3]
    for m in msgs:
        reply = sink.replies[m.id]
        assert reply.error is None and reply.batch_size == 4
        ((_, _, shape, raw),) = reply.outputs
        x = np.frombuffer(m.inputs[0].raw, np.float32).reshape(shape)
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(shape), 2 * x)
    assert acked_tags(client) == [tag]
    assert inflight.snapshot() == []


def test_a_bundle_split_over_two_batches_is_acked_after_its_last_request() -> None:
    drain, sink, client, backend = FakeDrain(), FakeSink(), FakeClient(), Doubler()
    msgs = [message(2), message(2), message(2)]
    tag = drain.put_bundle(msgs)
    batcher = make(drain, sink, client, backends={1: backend}, policy=BatchPolicy(4, 0.0))
    run_until(batcher, lambda: len(sink.replies) == 3)
    assert backend.batches == [2, 1]  # the third request was carried to the next batch
    replied = [k for k, c in enumerate(client.calls) if c[0] == "reply"]
    acks = [k for k, c in enumerate(client.calls) if c == ("hdel", (keys.UNACKED, tag))]
    # Not acked with the first batch's replies: a worker dying then must leave the whole
    # bundle in flight, the carried request with it.
    assert len(acks) == 1 and acks[0] > max(replied)


def test_a_bundles_requests_are_admitted_one_by_one() -> None:
    drain, client, backend = FakeDrain(), FakeClient(), Doubler()
    past = time.time() - 1
    expired, cancelled, good = message(1, deadline=past), message(1, job_ttl=60), message(1)
    sink = FakeSink(cancelled={cancelled.id})
    tag = drain.put_bundle([expired, cancelled, good])
    batcher = make(drain, sink, client, backends={1: backend})
    run_until(batcher, lambda: good.id in sink.replies)
    assert backend.batches == [1] and set(sink.replies) == {good.id}
    assert acked_tags(client) == [tag]


def test_a_bundle_whose_deliveries_ran_out_is_dead_lettered_once_and_each_request_told() -> None:
    drain, sink, client, backend = FakeDrain(), FakeSink(), FakeClient(), Doubler()
    msgs = [message(1), message(1)]
    tag = drain.put_bundle(msgs, attempts=4)
    batcher = make(drain, sink, client, backends={1: backend}, max_attempts=3)
    run_until(batcher, lambda: len(sink.replies) == 2)
    assert backend.batches == []
    assert all(isinstance(sink.replies[m.id].error, Internal) for m in msgs)
    lettered = [c for c in client.calls if c[0] == "lpush" and c[1][0] == keys.DEADLETTER]
    assert len(lettered) == 1 and acked_tags(client) == [tag]


def test_a_bundle_for_a_model_that_preserves_ordering_goes_back_one_message_each() -> None:
    from conch.worker.reply_order import Sequencer

    drain, sink, client, backend = FakeDrain(), FakeSink(), FakeClient(), Doubler()
    msgs = [message(1), message(1), message(1)]
    tag = drain.put_bundle(msgs)
    batcher = make(drain, sink, client, backends={1: backend}, sequencer=Sequencer())
    run_until(batcher, lambda: tag in acked_tags(client))
    assert backend.batches == [] and sink.replies == {}
    # At the head of the queue, the first request last pushed (so first popped again),
    # each a message of its own under its own id.
    pushed = [args for name, args in client.calls if name == "rpush" and args[0] == drain.queue]
    assert [broker.decode(raw).payload["id"] for _, raw in pushed] == [m.id for m in msgs][::-1]
    assert [broker.decode(raw).tag for _, raw in pushed] == [m.id for m in msgs][::-1]


def test_a_bundles_requests_held_at_a_warm_stop_go_back_one_message_each() -> None:
    drain, sink, client = FakeDrain(), FakeSink(), FakeClient()
    msgs = [message(3), message(3)]
    tag = drain.put_bundle(msgs)

    class Stopping(Doubler):
        def execute(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
            batcher.stop()  # the carried request is handed back, not run
            return super().execute(requests)

    backend = Stopping()
    batcher = make(drain, sink, client, backends={1: backend}, policy=BatchPolicy(4, 0.0))
    run_until(batcher, lambda: tag in acked_tags(client))
    assert backend.batches == [1] and set(sink.replies) == {msgs[0].id}
    pushed = [args for name, args in client.calls if name == "rpush" and args[0] == drain.queue]
    assert [broker.decode(raw).tag for _, raw in pushed] == [msgs[1].id]
    assert acked_tags(client) == [tag]
