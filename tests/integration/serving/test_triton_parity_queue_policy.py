"""Triton's queue policy fires on time (issue 29 point 3; Triton's L0_model_queue).

The models batch dynamically with a long ``max_queue_delay`` and preferred sizes 4 and 8,
as L0_model_queue's are. A request whose queue timeout passes while its batch is forming
is answered (REJECT) or put behind the rest (DELAY) at its timeout, and the requests behind
it that make a preferred batch run at once, not at the end of the delay. Within a batch
that forms, higher priorities go first. Triton's own bounds are 100 ms where these say
1 s: this machine is shared with other tests, and what fails without the fix waits the
whole delay (``DELAY_S``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.devtools.redis_server import start_private

from harness import start_gateway, start_worker, wait_model_ready
from integration.serving.test_triton_parity import IDENTITY_MODEL, python_model

DELAY_S = 4.0  # each model's max_queue_delay
SOON_S = 1.0  # "at once" (Triton: 100 ms)


def queue_config(policy: str, levels: str = "") -> str:
    return f"""
backend: "python"
max_batch_size: 32
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: {int(DELAY_S * 1e6)}
  {levels}
  default_queue_policy {{ {policy} }}
}}
"""


MODELS = {
    "reject": queue_config("default_timeout_microseconds: 100000"),
    "delay": queue_config("timeout_action: DELAY default_timeout_microseconds: 100000"),
    "override": queue_config("allow_timeout_override: true default_timeout_microseconds: 1000000"),
    "levels": queue_config("", levels="priority_levels: 2 default_priority_level: 2"),
}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("queue-policy") / "models"
    for name, config in MODELS.items():
        python_model(repo, name, config, IDENTITY_MODEL)
    server = start_private()
    worker = start_worker(repo, server.url, log_dir)
    gateway, url = start_gateway(repo, server.url, log_dir)
    try:
        for name in MODELS:
            wait_model_ready(url, name, 120, worker, gateway)
        yield url
    finally:
        gateway.stop()
        worker.stop()
        server.stop()


@dataclass
class Answer:
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class Send:
    at: float  # seconds after the first
    rows: int
    priority: int = 0
    timeout_us: int = 0


def send_all(url: str, model: str, sends: list[Send]) -> list[Answer]:
    """Each request from a thread of its own, at its time; how long each took to answer."""
    answers: list[Answer | None] = [None] * len(sends)
    start = time.monotonic()

    def one(k: int, send: Send) -> None:
        time.sleep(max(0.0, start + send.at - time.monotonic()))
        x = np.full((send.rows, 16), k + 1, np.float32)
        tensor = httpclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        began = time.monotonic()
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        try:
            result = client.infer(model, [tensor], priority=send.priority, timeout=send.timeout_us)
            assert np.array_equal(result.as_numpy("Y"), x)
            answers[k] = Answer(time.monotonic() - began)
        except InferenceServerException as exc:
            answers[k] = Answer(time.monotonic() - began, exc.message())
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(k, s)) for k, s in enumerate(sends)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DELAY_S + 30)
    assert all(a is not None for a in answers)
    return answers  # type: ignore[return-value]


ONE_THEN_TWO_PAIRS = [Send(0.0, 1), Send(0.2, 2), Send(0.2, 2)]


def test_a_rejected_request_never_holds_back_a_preferred_batch(url: str) -> None:
    first, *rest = send_all(url, "reject", ONE_THEN_TWO_PAIRS)
    assert "Request timeout expired" in first.error
    assert first.seconds < SOON_S  # at its 100 ms timeout, not at the end of the delay
    for answer in rest:
        assert not answer.error and answer.seconds < SOON_S, answer


def test_a_delayed_request_goes_behind_and_waits_its_own_delay(url: str) -> None:
    first, *rest = send_all(url, "delay", ONE_THEN_TWO_PAIRS)
    assert not first.error
    assert DELAY_S - 0.5 < first.seconds < DELAY_S + 5, first
    for answer in rest:
        assert not answer.error and answer.seconds < SOON_S, answer


def test_a_shorter_timeout_overrides_the_policys_and_a_longer_one_does_not(url: str) -> None:
    sends = [Send(0.0, 1, timeout_us=100_000), Send(0.2, 2), Send(0.2, 2)]
    first, *rest = send_all(url, "override", sends)
    assert "Request timeout expired" in first.error and first.seconds < SOON_S
    for answer in rest:
        assert not answer.error and answer.seconds < SOON_S, answer
    # 10 s asks for more than the policy's 1 s: the policy's holds. The pairs behind wait
    # for it (Triton: 0.7-1.1 s after they were sent), not for the whole delay.
    sends = [Send(0.0, 1, timeout_us=10_000_000), Send(0.2, 2), Send(0.2, 2)]
    first, *rest = send_all(url, "override", sends)
    assert "Request timeout expired" in first.error
    assert 0.9 < first.seconds < 1.0 + SOON_S, first
    for answer in rest:
        assert not answer.error and 0.6 < answer.seconds < 0.8 + SOON_S, answer


@pytest.mark.parametrize("default", [0, 2**32], ids=["unset", "past-the-last-level"])
def test_a_higher_priority_joins_the_front_of_a_forming_batch(url: str, default: int) -> None:
    """2 rows and 1 row at the default level, then 2 rows at level 1: the last two go
    together at once as a preferred batch of 4, the 1 row waits out the delay."""
    sends = [Send(0.0, 2), Send(0.1, 1, priority=default), Send(0.3, 2, priority=1)]
    first, lone, urgent = send_all(url, "levels", sends)
    assert not (first.error or lone.error or urgent.error)
    assert 0.2 < first.seconds < 0.3 + SOON_S, first
    assert urgent.seconds < SOON_S, urgent
    assert DELAY_S - 0.5 < lone.seconds < DELAY_S + 5, lone
