"""Decoupled Python models on a real worker, from the worker's side: a request message is
published onto the model's queue as the gateway publishes it (``broker.Publisher``), with a
reply list this test owns, and the replies are read back from Redis (``Reply.unpack``).

Checked: the responses' order (``seq``) and final flags, the empty final response,
responses sent from a thread after ``execute`` returned and from an ``async def`` execute,
an error ending a request, a send after the final response (logged, the worker serving
on), a request whose model never ends it (ended at its deadline), the message acked only
with the final response, and a model that is not decoupled answering with its sender.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from conch.wire import broker, keys, worker_reports
from conch.wire.messages import InferMessage, Reply

from harness import Service, fresh_db, start_worker, wait_until

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
{policy}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""
DECOUPLED = "model_transaction_policy { decoupled: true }"

# IN = n >= 0: n responses OUT = 0..n-1 from a thread started by execute (which has
# returned by then), then the final flag alone. Negative values pick a probe.
REPEAT = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def response(k):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([k], np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if n == -1:  # one response with the final flag, then one more
                threading.Thread(target=self.twice, args=(sender,)).start()
            elif n == -2:  # one response with the final flag, sent inside execute
                sender.send(response(7), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif n == -3:
                raise RuntimeError("the model was asked to raise")
            elif n == -4:  # one response, and never the final flag
                sender.send(response(1))
            elif n == -5:  # an error response ends the request
                sender.send(response(1))
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad")))
            elif n >= 100:  # n - 100 responses, slowly
                threading.Thread(target=self.repeat, args=(sender, n - 100, 0.3)).start()
            else:
                threading.Thread(target=self.repeat, args=(sender, n, 0.0)).start()
        return None

    def repeat(self, sender, n, pause):
        time.sleep(0.2)  # well after execute returned
        for k in range(n):
            sender.send(response(k))
            time.sleep(pause)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def twice(self, sender):
        sender.send(response(1), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        sender.send(response(2))
"""

ASYNC_REPEAT = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            for k in range(n):
                await asyncio.sleep(0.05)
                out = pb_utils.Tensor("OUT", np.array([10 * k], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Not decoupled: the response goes through the sender, then execute returns None.
WITH_SENDER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = pb_utils.Tensor("OUT", (x * 2).astype(np.int32))
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

MODELS = {
    "repeat": (REPEAT, DECOUPLED),
    "async_repeat": (ASYNC_REPEAT, DECOUPLED),
    "with_sender": (WITH_SENDER, ""),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decoupled_repo")
    for name, (code, policy) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, policy=policy))
        (root / name / "1" / "model.py").write_text(code)
    return root


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 13)


@pytest.fixture(scope="module")
def worker(repo: Path, db: str, log_dir: Path) -> Iterator[Service]:
    svc = start_worker(repo, db, log_dir, "--models", ",".join(MODELS))
    client = redis.Redis.from_url(db)

    def ready() -> bool:
        states = worker_reports.model_states(worker_reports.snapshot(client))
        return all(
            states.get(m, {}).get("versions", {}).get("1") == worker_reports.READY for m in MODELS
        )

    try:
        wait_until(ready, 90, "the decoupled models ready", svc)
        yield svc
    finally:
        svc.stop()


@pytest.fixture()
def client(db: str, worker: Service) -> redis.Redis:
    return redis.Redis.from_url(db)


def send(client: redis.Redis, model: str, n: int, *, deadline_s: float = 60) -> InferMessage:
    """Publish a request with IN = ``n`` as the gateway does, replies to a list of its own."""
    msg = InferMessage(
        id=uuid.uuid4().hex,
        model=model,
        version=-1,
        inputs=[("IN", "INT32", (1,), np.array([n], np.int32).tobytes())],
        outputs=["OUT"],
        reply_to=f"{keys.REPLY_PREFIX}test-{uuid.uuid4().hex}",
        enqueued=time.time(),
        deadline=time.time() + deadline_s,
    )
    queued = broker.Publisher(client).publish(
        model, msg.to_dict(), task_id=msg.id, priority=0, reply_to=msg.reply_to
    )
    assert queued
    return msg


def replies(client: redis.Redis, msg: InferMessage, timeout: float = 15) -> list[Reply]:
    """The request's replies, up to and with the one that ends it."""
    out: list[Reply] = []
    until = time.monotonic() + timeout
    while True:
        left = until - time.monotonic()
        assert left > 0, f"no end to request {msg.id} after {[(r.seq, r.final) for r in out]}"
        got = client.blpop([msg.reply_to], timeout=max(1, int(left)))
        assert got is not None, f"request {msg.id}: no reply within {timeout} s"
        reply = Reply.unpack(got[1])
        assert reply.id == msg.id
        out.append(reply)
        if reply.final or reply.error is not None:
            return out


def values(reply: Reply) -> list[int]:
    assert reply.error is None, reply.error
    assert reply.outputs is not None
    return [int(np.frombuffer(raw, np.int32)[0]) for _, _, _, raw in reply.outputs]


def held(client: redis.Redis, msg: InferMessage) -> bool:
    """Whether the request's message is still unacked (kombu's hash, the in-flight set)."""
    return bool(
        client.hexists(keys.UNACKED, msg.id)
        or client.sismember(broker.in_flight_key(broker.queue_name(msg.model)), msg.id)
    )


def test_responses_from_a_thread_after_execute_come_in_order_then_an_empty_final(
    client: redis.Redis,
) -> None:
    msg = send(client, "repeat", 4)
    got = replies(client, msg)
    assert [r.seq for r in got] == [0, 1, 2, 3, 4]
    assert [r.final for r in got] == [False, False, False, False, True]
    assert [values(r) for r in got[:-1]] == [[0], [1], [2], [3]]
    assert got[-1].error is None and got[-1].outputs == []  # Triton's empty final response
    assert all(r.version == 1 for r in got)
    wait_until(lambda: not held(client, msg), 5, "the message acked")


def test_a_request_with_no_response_gets_the_empty_final_one_alone(client: redis.Redis) -> None:
    msg = send(client, "repeat", 0)
    (only,) = replies(client, msg)
    assert (only.seq, only.final, only.outputs, only.error) == (0, True, [], None)


def test_a_response_with_the_final_flag_inside_execute(client: redis.Redis) -> None:
    msg = send(client, "repeat", -2)
    (only,) = replies(client, msg)
    assert (only.seq, only.final, values(only)) == (0, True, [7])


def test_the_message_is_acked_only_with_the_final_response(client: redis.Redis) -> None:
    msg = send(client, "repeat", 103)  # three responses, 0.3 s apart, from a thread
    first = replies_until_seq(client, msg, 0)
    assert not first.final
    assert held(client, msg)  # execute returned long ago; the request streams on
    rest = replies(client, msg)
    assert [r.seq for r in rest] == [1, 2, 3] and rest[-1].final
    wait_until(lambda: not held(client, msg), 5, "the message acked after its final response")


def replies_until_seq(client: redis.Redis, msg: InferMessage, seq: int) -> Reply:
    got = client.blpop([msg.reply_to], timeout=10)
    assert got is not None
    reply = Reply.unpack(got[1])
    assert reply.seq == seq
    return reply


def test_an_async_execute_streams_in_the_background(client: redis.Redis) -> None:
    msgs = [send(client, "async_repeat", 3), send(client, "async_repeat", 2)]
    for msg, n in zip(msgs, (3, 2), strict=True):
        got = replies(client, msg)
        assert [r.seq for r in got] == list(range(n + 1))
        assert [values(r) for r in got[:-1]] == [[10 * k] for k in range(n)]
        assert got[-1].final and got[-1].outputs == []


def test_execute_raising_ends_the_request_with_its_error(client: redis.Redis) -> None:
    msg = send(client, "repeat", -3)
    (only,) = replies(client, msg)
    assert only.error is not None
    assert "the model was asked to raise" in only.error.message
    wait_until(lambda: not held(client, msg), 5, "the message acked")


def test_an_error_response_ends_the_request(client: redis.Redis) -> None:
    msg = send(client, "repeat", -5)
    got = replies(client, msg)
    assert [r.seq for r in got] == [0, 1]
    assert values(got[0]) == [1] and not got[0].final
    assert got[1].error is not None and got[1].error.message == "bad"


def test_a_send_after_the_final_response_is_logged_and_the_worker_serves_on(
    client: redis.Redis, worker: Service
) -> None:
    msg = send(client, "repeat", -1)
    (only,) = replies(client, msg)
    assert (only.final, values(only)) == (True, [1])
    wait_until(lambda: "after the final one" in worker.log(), 10, "the error logged", worker)
    # The model's thread then dies of Triton's exception; its traceback is written after.
    wait_until(
        lambda: "Response sender has been closed" in worker.log(), 10, "the model told", worker
    )
    assert client.llen(msg.reply_to) == 0  # nothing was sent after the final response
    again = send(client, "repeat", 1)
    assert [r.seq for r in replies(client, again)] == [0, 1]
    assert worker.alive()


def test_a_request_never_ended_by_its_model_ends_at_its_deadline(
    client: redis.Redis, worker: Service
) -> None:
    msg = send(client, "repeat", -4, deadline_s=2)
    got = replies(client, msg, timeout=10)
    assert [r.seq for r in got] == [0, 1]
    assert values(got[0]) == [1] and not got[0].final
    assert got[1].error is not None and "sent no final response" in got[1].error.message
    wait_until(lambda: "sent no final response" in worker.log(), 10, "the error logged", worker)
    wait_until(lambda: not held(client, msg), 5, "the message acked")


def test_a_model_that_is_not_decoupled_answers_once_through_its_sender(
    client: redis.Redis,
) -> None:
    msg = send(client, "with_sender", 21)
    (only,) = replies(client, msg)
    assert (only.seq, only.final, values(only)) == (0, True, [42])
