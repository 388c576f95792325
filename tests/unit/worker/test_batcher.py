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
from conch.wire.messages import InferMessage, Reply
from conch.worker.batcher import Batcher, BatchPolicy, InFlight

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
        self.queued: list[tuple[str, bytes, int]] = []
        self.waiting = 0
        self.taken: list[tuple[str, int]] = []  # (how, count) of every pop that took some

    def put(self, msg: InferMessage, attempts: int = 1) -> None:
        raw = broker.envelope(
            msg.to_dict(), task_id=msg.id, queue=self.queue, priority=0, reply_to=msg.reply_to
        )
        self.queued.append((msg.id, raw, attempts))

    def pop(
        self, count: int, bulk: int | None = None, held: bool = True, how: str = "pop"
    ) -> list[tuple[str, bytes, int]]:
        # The fake's messages are all online (priority 0): ``bulk`` limits none of them.
        taken, self.queued = self.queued[:count], self.queued[count:]
        self.waiting = len(self.queued)
        if taken:
            self.taken.append((how, len(taken)))
        return taken

    def wait(self, timeout: float) -> None:
        time.sleep(min(timeout, 0.01))

    def queue_pop(self, pipe: Any, count: int, bulk: int | None = None, held: bool = True) -> None:
        pipe.execute_command("POP", count)

    def popped(
        self, result: Any, count: int, bulk: int | None = None, held: bool = True
    ) -> list[tuple[str, bytes, int]]:
        return self.pop(count, bulk, held, how="with the replies")


class FakeSink:
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
        "inputs": [("X", "FP32", (rows, 4), x.tobytes())],
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
    return Batcher(
        client=client,  # type: ignore[arg-type]
        model="m",
        backends=kwargs.pop("backends"),
        policy=kwargs.pop("policy", BatchPolicy(8, 0.0)),
        inflight=kwargs.pop("inflight", InFlight()),
        drain=drain,  # type: ignore[arg-type]
        sink=sink,  # type: ignore[arg-type]
        link=client,  # type: ignore[arg-type]
        idle_poll=0.01,
        **kwargs,
    )


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
        x = np.frombuffer(m.inputs[0][3], np.float32).reshape(shape)
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


def test_bulk_share_lets_batch_job_lines_take_a_share_of_the_time_while_online_work_runs() -> None:
    import math

    from conch.worker.batcher import BulkShare

    now = [100.0]
    share = BulkShare(clock=lambda: now[0])
    assert share.allowance() is None  # nothing online about: lines take every slot
    earned = 0.04 * BulkShare.SHARE / (1 - BulkShare.SHARE)  # per 40 ms online batch
    runs = 0
    while share.allowance() in (None, 0):  # online batches of 8 rows, 5 ms a row
        share.ran(0.04, protected_rows=8, bulk_rows=0)
        runs += 1
    assert runs == math.ceil(0.005 / earned)  # lines get SHARE of the time, no more
    assert share.allowance() == 1
    share.took(1, 1)  # a pop took the line: its time is spent
    share.ran(0.045, protected_rows=8, bulk_rows=1)
    assert share.allowance() == int((runs * earned + earned * 45 / 40 - 0.005) / 0.005)
    for _ in range(1000):  # however long online work runs, unused credit stays bounded
        share.ran(0.04, protected_rows=8, bulk_rows=0)
    assert share.allowance() == int(BulkShare.MAX_CREDIT_S / 0.005)
    now[0] += BulkShare.QUIET_S + 0.01
    assert share.allowance() is None  # online went quiet: every slot again
    assert share.held_for() is None


def test_bulk_share_counts_the_rows_a_batch_job_message_carries() -> None:
    """A batch job's message carries many lines (line_packing): the credit buys messages at
    their rows' cost, and one message is affordable even when it costs more than the cap."""
    import math

    from conch.worker.batcher import BulkShare

    now = [100.0]
    share = BulkShare(clock=lambda: now[0])
    for _ in range(1000):  # online batches of 8 rows, 10 ms a row
        share.ran(0.08, protected_rows=8, bulk_rows=0)
    assert share.allowance() == 1  # before any message ran: one, whatever it holds
    share.took(16, 1)  # a message of 16 rows, 160 ms: spent when taken, before it runs
    assert share.allowance() == 0  # so the pop before it runs takes no other
    share.ran(0.24, protected_rows=8, bulk_rows=16)
    assert share.allowance() == 0  # its cost is owed
    runs = 0
    while not share.allowance():
        share.ran(0.08, protected_rows=8, bulk_rows=0)
        runs += 1
    # Paid back at SHARE of the time: from MAX_CREDIT_S less the message's 160 ms (plus the
    # share its own execution earned) up to one message's cost, the cap now, above MAX_CREDIT_S.
    k = BulkShare.SHARE / (1 - BulkShare.SHARE)
    assert runs == math.ceil((0.16 - (BulkShare.MAX_CREDIT_S - 0.16 + 0.24 * k)) / (0.08 * k))
    for _ in range(1000):
        share.ran(0.08, protected_rows=8, bulk_rows=0)
    assert share.allowance() == 1


def test_bulk_share_does_not_take_time_spent_on_lines_for_quiet() -> None:
    """Online requests that come while lines run wait unseen in the queue: a long run of
    lines right after online work must not make the model look quiet (every slot to lines)."""
    from conch.worker.batcher import BulkShare

    now = [100.0]
    share = BulkShare(clock=lambda: now[0])
    share.ran(0.04, protected_rows=8, bulk_rows=0)
    for _ in range(3):  # lines alone, 0.4 s each: 1.2 s since online rows last ran
        now[0] += 0.4
        share.ran(0.4, protected_rows=0, bulk_rows=32)
    assert share.allowance() is not None and share.held_for() is not None
    now[0] += BulkShare.QUIET_S + 0.01  # then nothing at all for QUIET_S: quiet
    assert share.allowance() is None


def test_bulk_share_fills_a_pop_with_the_messages_that_run_briefly() -> None:
    """With every slot theirs, lines come a few rows' worth at a time (LINES_RUN_S), so an
    online request that comes next waits for little; at least one message, whatever it holds."""
    from conch.worker.batcher import BulkShare

    share = BulkShare()
    assert share.fill(64) == 64  # nothing known of the messages yet: the pop's count
    share.took(64, 2)  # two messages of 32 rows
    share.ran(0.32, protected_rows=0, bulk_rows=64)  # 5 ms a row
    assert BulkShare.LINES_RUN_S / 0.005 < 32  # less than one message's rows run in it...
    assert share.fill(64) == 1  # ...so one message a pop, not the two that fill 64 rows
    cheap = BulkShare()
    cheap.took(16, 4)  # messages of 4 rows, 0.1 ms a row: the pop's rows decide
    cheap.ran(0.0016, protected_rows=0, bulk_rows=16)
    assert cheap.fill(64) == 16
