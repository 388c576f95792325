"""The one message builder (conch.frontend.calls): version, lane, deadline and queue policy."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conch.backends.completion import complete
from conch.core.errors import NotFound, Unavailable
from conch.core.inference import InferRequest, InputTensor
from conch.core.repository import ModelRepository
from conch.frontend import calls
from conch.wire import broker
from conch.wire.messages import InferMessage

from models import ensemble, ensemble_step

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
version_policy: { all { } }
dynamic_batching {
  priority_levels: 2 default_priority_level: 2
  default_queue_policy { max_queue_size: 7 default_timeout_microseconds: 500000 }
}
"""

# A queue policy that takes the request's timeout.
OVERRIDABLE = CONFIG.replace(
    "default_queue_policy { max_queue_size: 7 default_timeout_microseconds: 500000 }",
    "max_queue_delay_microseconds: 4000000 default_queue_policy { timeout_action: DELAY "
    "default_timeout_microseconds: 500000 allow_timeout_override: true }",
)


def read_model(root: Path, name: str, config: str, versions: tuple[str, ...] = ("1",)):
    for v in versions:
        (root / name / v).mkdir(parents=True)
        (root / name / v / "model.py").write_text("class TritonPythonModel: pass\n")
    (root / name / "config.pbtxt").write_text(config)
    e = ModelRepository(root, complete=complete).read_model(name)
    assert e.error is None, e.error
    return e


@pytest.fixture()
def entry(tmp_path: Path):
    return read_model(tmp_path, "m", CONFIG, ("1", "2"))


def req(**params) -> InferRequest:
    return InferRequest(
        id="rid",
        inputs=[InputTensor("X", "FP32", (1, 1), b"\0\0\0\0")],
        outputs=None,
        binary_data_output=False,
        parameters={"k": "v", **params},
    )


def test_no_version_is_the_workers_latest(entry) -> None:
    for asked in ("", "-1", -1, None):
        to = calls.target(entry, asked)
        assert to.latest and to.version == 2 and to.wire_version == calls.LATEST
    to = calls.target(entry, "1")
    assert not to.latest and to.wire_version == 1
    with pytest.raises(NotFound):
        calls.target(entry, 3)


def test_an_online_call_takes_the_queue_policy(entry) -> None:
    before = time.time()
    call = calls.build(calls.target(entry, ""), req(), default_timeout_s=30)
    msg = call.msg
    assert msg.model == "m" and msg.version == -1 and call.version == 2
    assert msg.outputs == ["Y"] and msg.params == {"k": "v"} and msg.client_id == "rid"
    assert msg.priority == broker.online_step(2) and call.max_queue_size == 7
    assert msg.queue_deadline == pytest.approx(before + 0.5, abs=0.1)
    # The default deadline counts from when the queue policy's timeout would let it go.
    assert msg.deadline == pytest.approx(before + 30.5, abs=0.1) and msg.timeout_us == 0
    assert msg.chain == [] and msg.reply_to is None and msg.job_ttl == 0


def test_the_deadline_rule(entry) -> None:
    to, now = calls.target(entry, ""), time.time()
    # A timeout replaces the default ...
    msg = calls.build(to, req(timeout=90_000_000), default_timeout_s=30).msg
    assert msg.deadline == pytest.approx(now + 90, abs=0.1) and msg.timeout_us == 90_000_000
    # ... and only shortens an inherited deadline.
    caller = calls.Caller(deadline=now + 5, chain=("a", "b"))
    assert calls.build(to, req(timeout=90_000_000), caller=caller).msg.deadline == now + 5
    msg = calls.build(to, req(timeout=200_000), caller=caller).msg
    assert msg.deadline == pytest.approx(now + 0.2, abs=0.1) and msg.chain == ["a", "b"]
    with pytest.raises(Unavailable, match="Request timeout expired for model 'm'"):
        calls.build(to, req(), caller=calls.Caller(deadline=now - 1))


def test_a_timeout_the_queue_policy_takes_sets_no_deadline(tmp_path: Path) -> None:
    """Triton reads 'timeout' as the queue policy's own where the policy allows the
    override: it shortens the queue timeout and bounds nothing else; so does an
    ensemble's, which its steps take. Elsewhere it stays conch's deadline."""
    to, now = calls.target(read_model(tmp_path, "o", OVERRIDABLE), ""), time.time()
    msg = calls.build(to, req(timeout=100_000), default_timeout_s=30).msg
    assert msg.queue_deadline == pytest.approx(now + 0.1, abs=0.05)
    assert msg.deadline == pytest.approx(now + 30 + 0.1 + 4, abs=0.1)
    io = (
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]'
    )
    ensemble(tmp_path, "e", io, [ensemble_step("o", {"X": "X"}, {"Y": "Y"})], 4)
    outer = ModelRepository(tmp_path, complete=complete).read_model("e")
    msg = calls.build(calls.target(outer, ""), req(timeout=100_000), default_timeout_s=30).msg
    assert msg.deadline == pytest.approx(now + 30, abs=0.1) and msg.timeout_us == 100_000


def test_the_clients_priority_level_travels(entry) -> None:
    """Kept beside the queue step it picked, for an ensemble's steps to ask again."""
    msg = calls.build(calls.target(entry, ""), req(priority=2**32), default_timeout_s=30).msg
    assert msg.priority_level == 2**32 and msg.priority == broker.online_step(2)
    assert InferMessage.from_dict(msg.to_dict()).priority_level == 2**32
    plain = calls.build(calls.target(entry, ""), req(), default_timeout_s=30).msg
    assert "lvl" not in plain.to_dict()  # a message without one is as it always was


def test_work_below_online_keeps_its_step(entry) -> None:
    to = calls.target(entry, "1")
    caller = calls.Caller(deadline=time.time() + 5, priority=broker.PRIORITY_OFFLINE)
    assert calls.build(to, req(), caller=caller).msg.priority == broker.PRIORITY_OFFLINE


def test_async_and_offline_lanes(entry) -> None:
    to, now = calls.target(entry, ""), time.time()
    job = calls.build(to, req(), lane=calls.Lane.ASYNC, default_timeout_s=30)
    assert job.msg.priority == broker.PRIORITY_ASYNC and job.max_queue_size == 0
    assert job.msg.deadline == 0.0 and job.msg.queue_deadline == 0.0
    timed = calls.build(to, req(timeout=2_000_000), lane=calls.Lane.ASYNC).msg
    assert timed.deadline == pytest.approx(now + 2, abs=0.1)
    offline = calls.build(
        to, req(timeout=2_000_000), lane=calls.Lane.OFFLINE, reply_to="conch.reply.x"
    ).msg
    assert offline.priority == broker.PRIORITY_OFFLINE and offline.reply_to == "conch.reply.x"
    assert offline.deadline == 0.0 and offline.timeout_us == 0 and offline.queue_deadline == 0.0
