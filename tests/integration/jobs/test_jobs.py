"""Async jobs through the real path: submit over HTTP, poll, fetch the infer response.

The bodies are made and read by the stock tritonclient (``generate_request_body`` and
``parse_response_body``), so a job carries exactly what an infer call would.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.http as httpclient
from celery import Celery
from tritonclient.utils import InferenceServerException

from conch.job_client import JobClient, JobPending
from conch.wire import keys

from harness import fresh_db, serving, start_gateway, wait_until, waiting
from models import add_inputs

MODELS = ("add_batched", "step", "batch_probe", "mlp")


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 12)


@pytest.fixture(scope="module")
def stack(model_repo: Path, db: str, log_dir: Path) -> Iterator[str]:
    with serving(model_repo, db, log_dir, MODELS, threads=32) as (url, _, _):
        yield url


def submit(url: str, model: str, inputs: list, outputs: list | None = None, **kw) -> str:
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, **kw
    )
    headers = {} if json_size is None else {"Inference-Header-Content-Length": str(json_size)}
    r = requests.post(f"http://{url}/v2/models/{model}/jobs", data=body, headers=headers)
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["Location"] == f"/v2/jobs/{job['id']}"
    assert job["status"] == "PENDING" and job["model_name"] == model
    return job["id"]


def wait_done(url: str, job_id: str, timeout: float = 30) -> dict:
    status: dict = {}

    def done() -> bool:
        nonlocal status
        status = requests.get(f"http://{url}/v2/jobs/{job_id}").json()
        return status["status"] not in ("PENDING", "STARTED")

    wait_until(done, timeout, f"job {job_id}")
    return status


def result(url: str, job_id: str) -> httpclient.InferResult:
    r = requests.get(f"http://{url}/v2/jobs/{job_id}/result")
    assert r.status_code == 200, r.text
    length = r.headers.get("Inference-Header-Content-Length")
    return httpclient.InferenceServerClient.parse_response_body(
        r.content, header_length=None if length is None else int(length)
    )


def test_a_job_answers_what_infer_answers(stack: str) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    job = submit(stack, "add_batched", add_inputs(a), request_id="mine")
    status = wait_done(stack, job)
    assert status["status"] == "SUCCESS" and "finished" in status, status
    got = result(stack, job)
    np.testing.assert_array_equal(got.as_numpy("OUT"), a + a)
    resp = got.get_response()
    assert resp["id"] == "mine" and resp["model_name"] == "add_batched"
    assert resp["model_version"] == "1"
    # The same request as an infer call, for comparison.
    direct = httpclient.InferenceServerClient(stack).infer("add_batched", add_inputs(a))
    np.testing.assert_array_equal(direct.as_numpy("OUT"), got.as_numpy("OUT"))


def test_a_job_keeps_the_output_encoding_the_client_asked_for(stack: str) -> None:
    x = np.random.default_rng(3).standard_normal((2, 64), dtype=np.float32)
    i = httpclient.InferInput("INPUT0", [2, 64], "FP32")
    i.set_data_from_numpy(x, binary_data=False)  # a JSON request ...
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)  # ... binary result
    job = submit(stack, "mlp", [i], [out])
    wait_done(stack, job)
    r = requests.get(f"http://{stack}/v2/jobs/{job}/result")
    assert r.headers["Content-Type"] == "application/octet-stream"
    length = int(r.headers["Inference-Header-Content-Length"])
    got = httpclient.InferenceServerClient.parse_response_body(r.content, header_length=length)
    direct = httpclient.InferenceServerClient(stack).infer("mlp", [i]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got.as_numpy("OUTPUT0"), direct, rtol=1e-6)
    # And a JSON-only job comes back as JSON.
    job = submit(stack, "mlp", [i], [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    wait_done(stack, job)
    r = requests.get(f"http://{stack}/v2/jobs/{job}/result")
    assert r.headers["Content-Type"] == "application/json"
    np.testing.assert_allclose(
        np.array(r.json()["outputs"][0]["data"], np.float32).reshape(2, -1), direct, rtol=1e-6
    )


def test_celery_reads_a_job_result(stack: str, db: str) -> None:
    a = np.ones((1, 4), np.float32)
    job = submit(stack, "add_batched", add_inputs(a))
    app = Celery("reader", broker=db, backend=db, set_as_current=False)
    app.conf.update(result_serializer="msgpack", result_accept_content=["msgpack"])
    got = app.AsyncResult(job).get(timeout=30)
    assert got["model_name"] == "add_batched"
    (out,) = got["outputs"]
    assert out["name"] == "OUT" and out["shape"] == [1, 4]
    np.testing.assert_array_equal(np.frombuffer(out["data"], np.float32), [2, 2, 2, 2])


def test_a_job_whose_timeout_passes_in_the_queue_fails_and_says_why(stack: str) -> None:
    # A backlog on the one-at-a-time step model, then a job allowed 1 ms to start.
    blockers = [submit(stack, "step", [_step_input(0.0)]) for _ in range(5)]
    job = submit(stack, "step", [_step_input(1.0)], timeout=1000)
    status = wait_done(stack, job)
    assert status["status"] == "FAILURE" and "timeout" in status["error"], status
    r = requests.get(f"http://{stack}/v2/jobs/{job}/result")
    assert r.status_code == 503 and "Request timeout expired" in r.json()["error"]
    for b in blockers:
        assert wait_done(stack, b)["status"] == "SUCCESS"


def _step_input(value: float) -> httpclient.InferInput:
    i = httpclient.InferInput("X", [1, 4], "FP32")
    i.set_data_from_numpy(np.full((1, 4), value, np.float32))
    return i


def test_pending_unknown_and_malformed_jobs(stack: str, db: str) -> None:
    client = redis.Redis.from_url(db)
    # Still queued behind a backlog: 202 with the status and a Retry-After.
    backlog = [submit(stack, "step", [_step_input(0.0)]) for _ in range(10)]
    r = requests.get(f"http://{stack}/v2/jobs/{backlog[-1]}/result")
    assert r.status_code == 202 and r.json()["status"] == "PENDING"
    assert r.headers["Retry-After"] == "1"
    unknown = "0123456789abcdef0123456789abcdef"
    for path in (f"/v2/jobs/{unknown}", f"/v2/jobs/{unknown}/result"):
        r = requests.get(f"http://{stack}{path}")
        assert r.status_code == 404 and "unknown job" in r.json()["error"]
    r = requests.get(f"http://{stack}/v2/jobs//result", allow_redirects=False)
    assert r.status_code == 404 and "error" in r.json()
    for bad in ("0123", "..%2F..%2Fetc", "X" * 32, "celery-task-meta-x"):
        r = requests.get(f"http://{stack}/v2/jobs/{bad}")
        assert r.status_code in (400, 404), (bad, r.status_code)
        assert "error" in r.json()
    # Bad requests are refused before anything is queued or recorded.
    records = len(client.keys("conch.job.*"))
    depth = waiting(db, "add_batched")
    for body, model, want in (
        (b"{not json", "add_batched", "parse"),
        (
            b'{"inputs":[{"name":"A","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}',
            "add_batched",
            "B",
        ),
        (
            b'{"inputs":[{"name":"A","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}',
            "no_such_model",
            "unknown model",
        ),
    ):
        r = requests.post(f"http://{stack}/v2/models/{model}/jobs", data=body)
        assert r.status_code == 400 and want in r.json()["error"], (r.status_code, r.text)
    assert len(client.keys("conch.job.*")) == records
    assert waiting(db, "add_batched") == depth
    for job in backlog:
        wait_done(stack, job)


def test_online_requests_overtake_queued_jobs_and_jobs_fill_free_slots(stack: str, db: str) -> None:
    """Point 4 of issue 3: online work outranks async jobs; jobs only backfill."""
    client = redis.Redis.from_url(db)

    def probe(value: float, rows: int = 1) -> list[httpclient.InferInput]:
        i = httpclient.InferInput("X", [rows, 1], "FP32")
        i.set_data_from_numpy(np.full((rows, 1), value, np.float32))
        return [i]

    # A one-second batch keeps the instance busy while the rest queues up.
    with ThreadPoolExecutor(4) as pool:
        blocker = pool.submit(
            lambda: httpclient.InferenceServerClient(stack).infer("batch_probe", probe(1.0))
        )
        # Popped (so in kombu's unacked index) means executing: it runs alone.
        wait_until(lambda: client.zcard(keys.UNACKED_INDEX) > 0, 10, "the blocker to start")
        jobs = [submit(stack, "batch_probe", probe(0.05)) for _ in range(10)]
        online = [
            pool.submit(
                lambda: httpclient.InferenceServerClient(stack).infer("batch_probe", probe(0.05))
            )
            for _ in range(3)
        ]
        first = blocker.result().as_numpy("Y")[0]
        online_y = [f.result().as_numpy("Y")[0] for f in online]
    job_y = []
    for job in jobs:
        assert wait_done(stack, job)["status"] == "SUCCESS"
        job_y.append(result(stack, job).as_numpy("Y")[0])
    after = first[0] + 1
    # The three online requests, though queued after ten jobs, run in the very next
    # execution, and five jobs fill its free slots (max_batch_size 8) ...
    assert [tuple(y) for y in online_y] == [(after, 8)] * 3, online_y
    assert sorted(tuple(y) for y in job_y) == [(after, 8)] * 5 + [(after + 1, 5)] * 5, job_y


def test_a_full_job_queue_refuses_with_503(model_repo: Path, redis_url: str, log_dir: Path) -> None:
    # No worker: the jobs wait (scale from zero) until the bound refuses the fourth.
    db = fresh_db(redis_url, 9)
    env = {"CONCH_MAX_QUEUED_JOBS": "3"}
    gateway, url = start_gateway(model_repo, db, log_dir, threads=4, env=env)
    try:
        for _ in range(3):
            submit(url, "step", [_step_input(0.0)])
        r = requests.post(
            f"http://{url}/v2/models/step/jobs",
            json={"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]},
        )
        assert r.status_code == 503, r.text
        assert (
            "maximum queue size" in r.json()["error"]
            and "CONCH_MAX_QUEUED_JOBS" in r.json()["error"]
        )
        client = redis.Redis.from_url(db)
        assert waiting(db, "step") == 3
        assert len(client.keys("conch.job.*")) == 3  # the refused job left no record
    finally:
        gateway.stop()


def test_a_cancelled_job_never_runs(stack: str) -> None:
    client = httpclient.InferenceServerClient(stack)

    def executed() -> int:
        return client.get_inference_statistics("step")["model_stats"][0]["inference_count"]

    before = executed()
    backlog = [submit(stack, "step", [_step_input(float(i))]) for i in range(8)]
    victim = backlog[-1]
    r = requests.delete(f"http://{stack}/v2/jobs/{victim}")
    assert r.status_code == 200 and r.json()["status"] == "REVOKED", r.text
    for job in backlog[:-1]:
        assert wait_done(stack, job)["status"] == "SUCCESS"
    r = requests.get(f"http://{stack}/v2/jobs/{victim}/result")
    assert r.status_code == 400 and "cancelled" in r.json()["error"]
    wait_until(lambda: executed() - before == 7, 10, "the statistics of the seven jobs")
    time.sleep(0.5)
    assert executed() - before == 7  # the cancelled one was dropped, not run
    # A finished job cannot be cancelled; an unknown one is a 404.
    r = requests.delete(f"http://{stack}/v2/jobs/{backlog[0]}")
    assert r.status_code == 400 and "already finished (SUCCESS)" in r.json()["error"]
    r = requests.delete(f"http://{stack}/v2/jobs/{'f' * 32}")
    assert r.status_code == 404


def test_the_job_client_submits_waits_and_cancels(stack: str) -> None:
    jc = JobClient(stack)
    job = jc.submit("step", [_step_input(2.0)], request_id="c1")
    got = jc.result(job, wait=30)
    np.testing.assert_array_equal(got.as_numpy("Y"), np.full((1, 4), 3.0, np.float32))
    assert got.get_response()["id"] == "c1"
    # Behind a backlog: not finished at once, finished within a long poll.
    backlog = [jc.submit("step", [_step_input(float(i))]) for i in range(10)]
    with pytest.raises(JobPending):
        jc.result(backlog[-1])
    np.testing.assert_array_equal(
        jc.result(backlog[-1], wait=30).as_numpy("Y"), np.full((1, 4), 10.0, np.float32)
    )
    for bad in ("abc", "61", "-1", "nan"):
        r = requests.get(f"http://{stack}/v2/jobs/{job}/result?wait={bad}")
        assert r.status_code == 400 and "wait" in r.json()["error"], bad
    # A cancelled job's result is an error tritonclient's way, with its status.
    more = [jc.submit("step", [_step_input(0.0)]) for _ in range(6)]
    assert jc.cancel(more[-1])["status"] == "REVOKED"
    with pytest.raises(InferenceServerException) as err:
        jc.result(more[-1], wait=5)
    assert err.value.status() == "400" and "cancelled" in str(err.value)
    with pytest.raises(InferenceServerException) as err:
        jc.submit("no_such_model", [_step_input(0.0)])
    assert err.value.status() == "400"
    for m in more[:-1]:
        jc.result(m, wait=30)
