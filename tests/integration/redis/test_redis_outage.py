"""Redis goes away and comes back: SIGKILLed under load, restarted from its append-only file.

All of it real: a redis-server with ``appendonly yes`` (``appendfsync everysec``), a worker
and a gateway, driven over plain HTTP. The model is a Python model that writes down the
id of every request it runs, so the test can tell what ran, and how many times.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from conch.frontend.producer import OUTAGE_GRACE_S
from conch.wire import keys, outage

from harness import DurableRedis, start_gateway, start_worker, wait_model_ready, wait_until

MODEL = "sleepy"  # the load and the jobs
SLOW = "sleepy_slow"  # requests held in the model when Redis dies, on their own queue

# Y = X + 1, after sleeping for the batch's largest X; each run's request ids go to a file.
MODEL_PY = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = json.loads(args["model_config"])["parameters"]["log"]["string_value"]

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        with open(self.log, "a") as f:
            f.write("".join(r.request_id() + "\\n" for r in requests))
        time.sleep(float(max(x.max() for x in xs)))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]) for x in xs]
"""


@dataclass
class Answer:
    id: str
    sent: float  # monotonic
    took: float
    status: int
    retry_after: str | None
    body: dict[str, Any]

    @property
    def answered(self) -> float:
        return self.sent + self.took


@dataclass
class Stack:
    url: str
    metrics_url: str
    redis: DurableRedis
    runs: Path  # one line per request run: its id

    def ran(self) -> Counter[str]:
        return Counter(self.runs.read_text().split())


@pytest.fixture()
def stack(tmp_path: Path, log_dir: Path) -> Iterator[Stack]:
    repo, data = tmp_path / "models", tmp_path / "redis"
    data.mkdir()
    runs = tmp_path / "runs.txt"
    runs.touch()
    for name in (MODEL, SLOW):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
        (repo / name / "config.pbtxt").write_text(
            'backend: "python"\nmax_batch_size: 8\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            "dynamic_batching { max_queue_delay_microseconds: 0 }\n"
            f'parameters {{ key: "log" value: {{ string_value: "{runs}" }} }}\n'
            # Slow requests run side by side: none waits for another to finish.
            + ("instance_group [ { count: 3 kind: KIND_CPU } ]\n" if name == SLOW else "")
        )
    server = DurableRedis(data)
    worker = start_worker(repo, server.url, log_dir, "--models", f"{MODEL},{SLOW}")
    gateway, url = start_gateway(repo, server.url, log_dir, threads=64)
    try:
        for name in (MODEL, SLOW):
            wait_model_ready(url, name, 90, worker, gateway)
        yield Stack(url, gateway.metrics_url, server, runs)
        assert worker.alive() and gateway.alive()  # they rode it out, nobody restarted them
    finally:
        gateway.stop()
        worker.stop()
        server.stop()


def request(rid: str, x: float) -> dict[str, Any]:
    """An infer request body; ``x`` (the seconds it sleeps) is exact in FP32, as is x + 1."""
    return {"id": rid, "inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [x]}]}


def infer(url: str, rid: str, seconds: float, model: str = MODEL) -> Answer:
    sent = time.monotonic()
    r = requests.post(
        f"http://{url}/v2/models/{model}/infer", json=request(rid, seconds), timeout=60
    )
    took = time.monotonic() - sent
    answer = Answer(rid, sent, took, r.status_code, r.headers.get("Retry-After"), r.json())
    if r.status_code == 200:
        assert answer.body["outputs"][0]["data"] == [seconds + 1], answer
    return answer


def running(stack: Stack, ids: list[str]) -> None:
    wait_until(lambda: set(ids) <= set(stack.ran()), 30, f"{ids} to run")


def assert_outage_answer(a: Answer | requests.Response) -> None:
    """Triton's error body, a 503 that says Redis is away, and when to retry."""
    if isinstance(a, requests.Response):
        status, retry, body = a.status_code, a.headers.get("Retry-After"), a.json()
    else:
        status, retry, body = a.status, a.retry_after, a.body
    assert status == 503 and retry == "1", (status, retry, body)
    assert set(body) == {"error"} and "Redis" in body["error"], body


def test_the_dataset_id_is_set_once_and_read_back(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    first, second = outage.dataset(client), outage.dataset(client)
    assert first == second and first.id and first.run_id and first.appendonly is False
    client.delete(keys.DATASET)  # as a Redis that came back empty
    assert outage.lost(first, outage.dataset(client)) is not None


def test_a_short_outage_delays_the_answers_in_flight(stack: Stack) -> None:
    """Redis back within the grace: requests in flight get their answers, run once."""
    with ThreadPoolExecutor(3) as pool:
        for k in range(3):  # each instance answers a batch first: its connections are not new
            warm = [pool.submit(infer, stack.url, f"warm-{k}-{i}", 0.125, SLOW) for i in range(3)]
            assert [f.result().status for f in warm] == [200] * 3
        ids = [f"short-{i}" for i in range(3)]
        futures = [pool.submit(infer, stack.url, rid, 1.0, SLOW) for rid in ids]
        running(stack, ids)  # in the model, for a second, when Redis dies
        stack.redis.kill()
        killed = time.monotonic()
        time.sleep(0.3)
        stack.redis.start()
        assert time.monotonic() - killed < OUTAGE_GRACE_S
        answers = [f.result() for f in futures]
    assert [a.status for a in answers] == [200] * 3, answers
    assert all(stack.ran()[rid] == 1 for rid in ids)


def test_sigkill_under_load_gives_quick_503s_then_recovers(stack: Stack) -> None:
    url = stack.url
    stop = threading.Event()
    answers: list[Answer] = []
    counter = itertools.count()

    def load(n: int) -> None:
        while not stop.is_set():
            answers.append(infer(url, f"load-{n}-{next(counter)}", 0.015625))

    jobs = []
    for i in range(10):
        r = requests.post(f"http://{url}/v2/models/{MODEL}/jobs", json=request(f"job-{i}", 0.0625))
        assert r.status_code == 202, r.text
        jobs.append(r.json()["id"])
    with ThreadPoolExecutor(8) as pool:
        loaders = [pool.submit(load, n) for n in range(5)]
        # Two requests in the model when Redis dies, for longer than the grace.
        slow = [pool.submit(infer, url, f"slow-{i}", OUTAGE_GRACE_S + 1, SLOW) for i in range(2)]
        running(stack, ["slow-0", "slow-1"])
        time.sleep(0.5)  # load before the crash

        stack.redis.kill()
        killed = time.monotonic()
        while time.monotonic() - killed < OUTAGE_GRACE_S + 1:  # every route that needs Redis
            for path in ("/v2/health/ready", f"/v2/jobs/{jobs[0]}", "/v2/models/stats"):
                r = requests.get(f"http://{url}{path}", timeout=5)
                assert_outage_answer(r)
            r = requests.post(f"http://{url}/v2/models/{MODEL}/jobs", json={"inputs": []})
            assert r.status_code == 400, r.text  # a bad request is still a 400
            r = requests.get(f"http://{stack.metrics_url}/metrics", timeout=5)
            assert_outage_answer(r)
            assert requests.get(f"http://{url}/v2/health/live").status_code == 200
            time.sleep(0.2)
        restarting = time.monotonic()
        stack.redis.start()
        back = time.monotonic()
        time.sleep(3)
        stop.set()
        for f in loaders:
            f.result()
        in_flight = [f.result() for f in slow]

    # Every answer is a 200 or a 503 that says Redis is away; none waited long.
    assert {a.status for a in answers} <= {200, 503}
    for a in answers + in_flight:
        if a.status != 200:
            assert_outage_answer(a)
    during = [a for a in answers if killed + 0.1 < a.sent < restarting]
    assert during and all(a.took < 1.0 for a in during), [a for a in during if a.took >= 1.0]
    down = [a for a in during if a.answered < restarting]
    assert down and all(a.status == 503 for a in down), [a for a in down if a.status != 503]
    worst = max(answers, key=lambda a: a.answered - max(a.sent, killed))
    assert worst.answered - max(worst.sent, killed) < OUTAGE_GRACE_S + 1.0, worst
    # In the model past the grace: a 503 at the grace, not at their deadline.
    for a in in_flight:
        assert_outage_answer(a)
        assert OUTAGE_GRACE_S - 0.1 < a.answered - killed < OUTAGE_GRACE_S + 1.0, a
    # Back within seconds: requests sent a second after Redis answers all succeed.
    after = [a for a in answers if a.sent > back + 1.0]
    assert after and all(a.status == 200 for a in after), [a for a in after if a.status != 200]
    assert requests.get(f"http://{url}/v2/health/ready").status_code == 200

    # Every job submitted before the crash finishes, with its result.
    def done() -> bool:
        states = [requests.get(f"http://{url}/v2/jobs/{j}").json()["status"] for j in jobs]
        assert "FAILURE" not in states
        return all(s == "SUCCESS" for s in states)

    wait_until(done, 30, "every job to finish")
    for j in jobs:
        r = requests.get(f"http://{url}/v2/jobs/{j}/result")
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0625], r.text

    # Nothing ran twice: not what was answered, not the jobs, not the requests that got a
    # 503 while they ran (their replies came after the grace).
    ran = stack.ran()
    assert [rid for rid, n in ran.items() if n > 1] == []
    assert all(ran[a.id] == 1 for a in answers if a.status == 200)
    assert all(ran[f"job-{i}"] == 1 for i in range(10))
    assert ran["slow-0"] == ran["slow-1"] == 1
