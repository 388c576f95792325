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


@pytest.fixture()
def entry(tmp_path: Path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(CONFIG)
    for v in ("1", "2"):
        (tmp_path / "m" / v / "model.py").write_text("class TritonPythonModel: pass\n")
    e = ModelRepository(tmp_path, complete=complete).read_model("m")
    assert e.error is None, e.error
    return e


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
    assert msg.deadline == pytest.approx(before + 30, abs=0.1) and msg.timeout_us == 0
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
