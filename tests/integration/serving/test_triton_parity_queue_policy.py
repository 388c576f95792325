"""Triton's queue policy fires on time (issue 29 point 3, issue 40; Triton's L0_model_queue).

The models batch dynamically with a long ``max_queue_delay`` and preferred sizes 4 and 8,
as L0_model_queue's are. A request whose queue timeout passes while its batch is forming
is answered (REJECT) or put behind the rest of its level (DELAY) at its timeout, and the
requests behind it that make a preferred batch run at once, not at the end of the delay.
Within a batch that forms, higher priorities go first, also for an ensemble's step (the
client's priority and timeout reach it). Triton's own bounds are 100 ms where these say
1 s: this machine is shared with other tests, and what fails without the fix waits the
whole delay (``DELAY_S``). The frontends' default deadline (``REQUEST_TIMEOUT_S``) is
shorter than that delay, as a wait the model's own queue imposes must outlast it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.devtools.redis_server import start_private

from harness import start_gateway, start_grpc, start_worker, wait_grpc_model_ready, wait_model_ready
from integration.serving.test_triton_parity import IDENTITY_MODEL, python_model
from models import ensemble, ensemble_step

DELAY_S = 4.0  # each model's max_queue_delay
SOON_S = 1.0  # "at once" (Triton: 100 ms)
REQUEST_TIMEOUT_S = 2.0  # the frontends' default deadline, shorter than DELAY_S


def queue_config(policy: str, levels: str = "", preferred: str = "4, 8") -> str:
    return f"""
backend: "python"
max_batch_size: 32
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{
  preferred_batch_size: [ {preferred} ]
  max_queue_delay_microseconds: {int(DELAY_S * 1e6)}
  {levels}
  default_queue_policy {{ {policy} }}
}}
"""


# L0_model_queue's test_priority_with_policy: level 1 (DELAY) and level 2 (REJECT), each
# with a queue timeout longer than the delay that a request may shorten.
LONG_TIMEOUT = f"allow_timeout_override: true default_timeout_microseconds: {int(DELAY_S * 1.1e6)}"
TWO_POLICIES = f"""priority_levels: 2 default_priority_level: 2
  priority_queue_policy {{ key: 2 value: {{ timeout_action: REJECT {LONG_TIMEOUT} }} }}"""

MODELS = {
    "reject": queue_config("default_timeout_microseconds: 100000"),
    "delay": queue_config("timeout_action: DELAY default_timeout_microseconds: 100000"),
    "override": queue_config("allow_timeout_override: true default_timeout_microseconds: 1000000"),
    "levels": queue_config("", levels="priority_levels: 2 default_priority_level: 2"),
    "policies": queue_config(
        f"timeout_action: DELAY {LONG_TIMEOUT}", levels=TWO_POLICIES, preferred="4, 8, 32"
    ),
    # L0_http's onnx_zero_1_float32_queue: one request fills it.
    "bounded": queue_config("max_queue_size: 1", preferred="8"),
}


# As L0_model_queue's ``ensemble_zero_1_float32``: one step, the model's tensors as its own.
ENSEMBLES = {"levels_ensemble": "levels", "policies_ensemble": "policies"}
IO = (
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]'
)


@dataclass(frozen=True)
class Urls:
    http: str
    grpc: str

    def of(self, protocol: str) -> str:
        return self.http if protocol == "http" else self.grpc


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[Urls]:
    repo = tmp_path_factory.mktemp("queue-policy") / "models"
    for name, config in MODELS.items():
        python_model(repo, name, config, IDENTITY_MODEL)
    for name, model in ENSEMBLES.items():
        ensemble(repo, name, IO, [ensemble_step(model, {"X": "X"}, {"Y": "Y"})], 32)
    server = start_private()
    deadline = ("--request-timeout-secs", str(REQUEST_TIMEOUT_S))
    worker = start_worker(repo, server.url, log_dir)
    gateway, url = start_gateway(repo, server.url, log_dir, *deadline)
    grpc, grpc_url = start_grpc(repo, server.url, log_dir, *deadline)
    try:
        for name in [*MODELS, *ENSEMBLES]:
            wait_model_ready(url, name, 120, worker, gateway)
            wait_grpc_model_ready(grpc_url, name, 60, grpc)
        yield Urls(url, grpc_url)
    finally:
        grpc.stop()
        gateway.stop()
        worker.stop()
        server.stop()


@pytest.fixture(scope="module")
def url(urls: Urls) -> str:
    return urls.http


@dataclass
class Answer:
    seconds: float  # from its own send
    error: str = ""
    at: float = 0.0  # when it came, from the first send's time


@dataclass(frozen=True)
class Send:
    at: float  # seconds after the first
    rows: int
    priority: int = 0
    timeout_us: int = 0


def send_all(url: str, model: str, sends: list[Send], protocol: str = "http") -> list[Answer]:
    """Each request from a thread of its own, at its time; how long each took to answer."""
    answers: list[Answer | None] = [None] * len(sends)
    start = time.monotonic()
    api = httpclient if protocol == "http" else grpcclient

    def one(k: int, send: Send) -> None:
        time.sleep(max(0.0, start + send.at - time.monotonic()))
        x = np.full((send.rows, 16), k + 1, np.float32)
        tensor = api.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        began = time.monotonic()
        client = (
            httpclient.InferenceServerClient(url, network_timeout=60)
            if protocol == "http"
            else grpcclient.InferenceServerClient(url)
        )
        try:
            result = client.infer(model, [tensor], priority=send.priority, timeout=send.timeout_us)
            assert np.array_equal(result.as_numpy("Y"), x)
            answers[k] = Answer(time.monotonic() - began, at=time.monotonic() - start)
        except InferenceServerException as exc:
            now = time.monotonic()
            answers[k] = Answer(now - began, exc.message(), now - start)
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
    together at once as a preferred batch of 4, the 1 row waits out the delay (longer than
    the frontends' default deadline, which it outlasts)."""
    sends = [Send(0.0, 2), Send(0.1, 1, priority=default), Send(0.3, 2, priority=1)]
    first, lone, urgent = send_all(url, "levels", sends)
    assert not (first.error or lone.error or urgent.error)
    assert 0.2 < first.seconds < 0.3 + SOON_S, first
    assert urgent.seconds < SOON_S, urgent
    assert DELAY_S - 0.5 < lone.seconds < DELAY_S + 5, lone


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_ensembles_priority_reaches_its_step(urls: Urls, protocol: str) -> None:
    """The same through an ensemble (Triton's ensemble gives each step the client's
    priority): the level-1 request still joins the front of the step's forming batch."""
    sends = [Send(0.0, 2), Send(0.1, 1), Send(0.3, 2, priority=1)]
    first, lone, urgent = send_all(urls.of(protocol), "levels_ensemble", sends, protocol)
    assert not (first.error or lone.error or urgent.error)
    assert 0.2 < first.seconds < 0.3 + SOON_S, first
    assert urgent.seconds < SOON_S, urgent
    assert DELAY_S - 0.5 < lone.seconds < DELAY_S + 5, lone


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["policies", "policies_ensemble"])
def test_each_level_keeps_its_own_policy(urls: Urls, protocol: str, model: str) -> None:
    """L0_model_queue's test_priority_with_policy, a request every 0.2 s: at level 1 two
    rows, one row whose 1 s timeout delays it (DELAY), two rows; at level 2 two rows whose
    2 s timeout rejects them (REJECT), three rows, six rows. The first pair and the third
    make 4 once the one row goes behind its level; the two rows rejected at level 2 leave
    the delayed row and the three to make 4; the six wait out the delay. A timeout the
    queue policy takes is not a deadline: the delayed row is answered, not given up on.
    Each answer's time is read from the first send (a late send cannot make it look
    early)."""
    sends = [
        Send(0.0, 2, priority=1),
        Send(0.2, 1, priority=1, timeout_us=1_000_000),
        Send(0.4, 2, priority=1),
        Send(0.6, 2, priority=2, timeout_us=2_000_000),
        Send(0.8, 3, priority=2),
        Send(1.0, 6, priority=2),
    ]
    first, delayed, third, rejected, three, six = send_all(
        urls.of(protocol), model, sends, protocol
    )
    assert "Request timeout expired" in rejected.error
    assert rejected.at < 2.6 + SOON_S, rejected
    for answer in (first, delayed, third, three, six):
        assert not answer.error, answer
    for answer in (first, third):  # at 1.2 s, when the one row's queue timeout passed
        assert 1.1 < answer.at < 1.2 + SOON_S, answer
    for answer in (delayed, three):  # at 2.6 s, when the two rows at level 2 were refused
        assert 2.5 < answer.at < 2.6 + SOON_S, answer
    assert 1.0 + DELAY_S - 0.2 < six.at < 1.0 + DELAY_S + 5, six


def test_a_request_its_batch_holds_still_fills_a_bounded_queue(urls: Urls) -> None:
    """L0_http's test_descriptive_status_code: a raw binary request waits in a forming
    batch (no preferred size yet, a long delay) and fills a queue of one, so the next
    request is refused at once with Triton's 503 and words, over HTTP and gRPC; the first
    is answered when its delay ends. (A worker had taken it off the Redis list, where the
    bound was counted, so nothing was refused.)"""
    body = np.arange(8, dtype=np.float32).tobytes()
    url = f"http://{urls.http}/v2/models/bounded/infer"
    raw = {"Inference-Header-Content-Length": "0"}
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(requests.post, url, data=body, headers=raw, timeout=60)
        time.sleep(0.5)
        second = requests.post(url, data=body, headers=raw, timeout=60)
        assert second.status_code == 503, second.text
        assert "Exceeds maximum queue size" in second.json()["error"]
        x = grpcclient.InferInput("X", [1, 8], "FP32")
        x.set_data_from_numpy(np.frombuffer(body, np.float32).reshape(1, 8))
        with pytest.raises(InferenceServerException) as refused:
            grpcclient.InferenceServerClient(urls.grpc).infer("bounded", [x])
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "Exceeds maximum queue size" in refused.value.message()
        answered = first.result()
    assert answered.status_code == 200, answered.text
    header = int(answered.headers["Inference-Header-Content-Length"])
    assert answered.content[header:] == body
