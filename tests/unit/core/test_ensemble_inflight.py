"""An ensemble's ``max_inflight_requests`` (Triton 2.63): each step has at most that many
requests in flight over all the ensemble's requests; a step past it waits for one to be
answered, until its request's deadline. The graph walk (``ensemble_run.run``) with the
in-process slots an embedded server uses; the fleet's, over Redis, are tested through
the real path in tests/integration/serving/test_ensemble_inflight.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from conch.core import ensemble_run
from conch.core.ensemble_graph import Step, Tensor, max_inflight
from conch.core.errors import InvalidArgument, Unavailable
from conch.core.model_config import parse_config

ENSEMBLE = """
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{
  {limit}
  step [
    {{ model_name: "fast" model_version: -1
      input_map {{ key: "X" value: "IN" }} output_map {{ key: "Y" value: "mid" }} }},
    {{ model_name: "slow" model_version: -1
      input_map {{ key: "X" value: "mid" }} output_map {{ key: "Y" value: "OUT" }} }}
  ]
}}
"""
STEP = """
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
RAW = bytes(4)


def entry(limit: int) -> SimpleNamespace:
    text = ENSEMBLE.format(limit=f"max_inflight_requests: {limit}" if limit else "")
    return SimpleNamespace(name="ens", config=parse_config(text, model="ens", source="test"))


class Gauge:
    """Counts each step model's requests in flight (sent, not yet answered)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}

    def start(self, step: Step, tensors: dict[str, Tensor], outputs: list[str]) -> Call:
        with self.lock:
            self.now[step.model] = self.now.get(step.model, 0) + 1
            self.most[step.model] = max(self.most.get(step.model, 0), self.now[step.model])
        return Call(self, step.model, tensors)

    def answered(self, model: str) -> None:
        with self.lock:
            self.now[model] -= 1


class Call:
    def __init__(self, gauge: Gauge, model: str, tensors: dict[str, Tensor]) -> None:
        self.gauge, self.model, self.tensors = gauge, model, tensors

    def wait(self) -> dict[str, Tensor]:
        time.sleep(self.gauge.seconds)
        self.gauge.answered(self.model)
        return {"Y": self.tensors["X"]}

    def cancel(self) -> None:
        self.gauge.answered(self.model)


def run_many(ens: SimpleNamespace, gauge: Gauge, n: int, deadline: float = 0.0) -> list:
    step_cfg = parse_config(STEP, model="step", source="test")
    slots = ensemble_run.InProcessSlots()

    def one(_: int) -> dict[str, Tensor]:
        return ensemble_run.run(
            ens,
            {"IN": ("FP32", (1,), RAW)},
            ["OUT"],
            gauge.start,
            lambda s: step_cfg,
            slots.until(deadline),
        )

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_the_config_field_is_read() -> None:
    assert max_inflight(entry(3).config) == 3
    assert max_inflight(entry(0).config) == 0


def test_each_step_has_at_most_the_limit_in_flight() -> None:
    gauge = Gauge(0.05)
    results = run_many(entry(2), gauge, 8)
    assert results == [{"OUT": ("FP32", (1,), RAW)}] * 8
    assert gauge.most == {"fast": 2, "slow": 2}
    assert gauge.now == {"fast": 0, "slow": 0}


def test_without_the_field_nothing_waits() -> None:
    gauge = Gauge(0.1)
    run_many(entry(0), gauge, 8)
    assert gauge.most["fast"] == 8


def test_a_wait_ends_at_the_requests_deadline() -> None:
    gauge = Gauge(1.0)
    ens, step_cfg = entry(1), parse_config(STEP, model="step", source="test")
    slots = ensemble_run.InProcessSlots()
    holder = threading.Thread(
        target=ensemble_run.run,
        args=(ens, {"IN": ("FP32", (1,), RAW)}, ["OUT"], gauge.start, lambda s: step_cfg),
        kwargs={"slots": slots.until(0.0)},
    )
    holder.start()
    time.sleep(0.1)  # it holds step 0's one slot for a second
    began = time.time()
    with pytest.raises(Unavailable) as err:
        ensemble_run.run(
            ens,
            {"IN": ("FP32", (1,), RAW)},
            ["OUT"],
            gauge.start,
            lambda s: step_cfg,
            slots.until(began + 0.2),
        )
    assert 0.15 < time.time() - began < 0.8
    assert err.value.message == (
        "ensemble 'ens' step 0 ('fast') failed: Request timeout expired for ensemble 'ens': "
        "step 0 ('fast') had max_inflight_requests 1 requests in flight until the "
        "request's deadline"
    )
    holder.join()


def test_a_step_that_cannot_be_sent_gives_its_slot_back() -> None:
    ens, step_cfg = entry(1), parse_config(STEP, model="step", source="test")
    slots = ensemble_run.InProcessSlots()

    def refuse(step: Step, tensors: dict[str, Tensor], outputs: list[str]) -> Call:
        raise InvalidArgument("no")

    for _ in range(3):  # a leaked slot would make the second wait forever
        with pytest.raises(InvalidArgument):
            ensemble_run.run(
                ens,
                {"IN": ("FP32", (1,), RAW)},
                ["OUT"],
                refuse,
                lambda s: step_cfg,
                slots.until(time.time() + 1),
            )
