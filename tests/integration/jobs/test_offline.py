"""Offline batch jobs through the real path: JSONL in a real S3-API server (moto's server
mode), a real worker running the job's Celery task, the gateway's HTTP routes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.http as httpclient

from conch.wire import broker, job_store, keys, statistics, worker_reports
from conch.wire.work_owed import JobsWork, jobs_owed
from conch.worker.host import HEARTBEAT_S

from harness import (
    Service,
    conch,
    fresh_db,
    reference_mlp,
    serving,
    start_gateway,
    start_worker,
    wait_model_ready,
    wait_until,
)
from integration.jobs.test_jobs import result, submit, wait_done
from models import offset_model

MODELS = ("mlp", "batch_probe", "picky")


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 11)


@pytest.fixture(scope="module")
def served(model_repo: Path, db: str, log_dir: Path, s3_endpoint: str) -> Iterator[tuple]:
    """(gateway URL, worker Service)."""
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    with serving(model_repo, db, log_dir, MODELS, worker_env=env) as (url, worker, _):
        yield url, worker


@pytest.fixture(scope="module")
def stack(served: tuple) -> str:
    return served[0]


@pytest.fixture()
def bucket(s3) -> str:
    name = f"data-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def mlp_line(i: int) -> dict:
    x = np.random.default_rng(i).standard_normal((1 + i % 3, 64), dtype=np.float32)
    return {
        "id": f"r{i}",
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(x.shape),
                "data": x.ravel().tolist(),
            }
        ],
    }


def put_jsonl(s3, bucket: str, key: str, lines: list[str]) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=("\n".join(lines) + "\n").encode())


def one_row_lines(prefix: str, name: str, datatype: str, values: list) -> list[str]:
    """JSONL request lines, one value of input ``name`` each (shape [1, 1]), ids prefix+k."""
    return [
        json.dumps(
            {
                "id": f"{prefix}{k}",
                "inputs": [{"name": name, "datatype": datatype, "shape": [1, 1], "data": [v]}],
            }
        )
        for k, v in enumerate(values)
    ]


def submit_batch(url: str, model: str, spec: dict) -> requests.Response:
    return requests.post(f"http://{url}/v2/models/{model}/batch", json=spec)


def batch_jobs(db: str, model: str) -> dict[str, int]:
    """``model``'s batch jobs by state, as ``conch_jobs_total`` prints them."""
    own = statistics.read_all(redis.Redis.from_url(db), model)[1]
    return statistics.jobs_by_state(own, job_store.BATCH)


def changed(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def read_jsonl(s3, bucket: str, key: str) -> list[dict]:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    return [json.loads(line) for line in body.splitlines()]


def test_a_batch_job_answers_every_line_in_order(stack: str, db: str, s3, bucket: str) -> None:
    before = batch_jobs(db, "mlp")
    lines = [json.dumps(mlp_line(i)) for i in range(150)]
    lines.insert(
        7,
        json.dumps(
            {
                "id": "bad",
                "inputs": [{"name": "NOPE", "datatype": "FP32", "shape": [1, 1], "data": [1]}],
            }
        ),
    )
    lines.insert(9, "{not json")
    put_jsonl(s3, bucket, "in/requests.jsonl", lines)
    spec = {"input": f"s3://{bucket}/in/requests.jsonl", "output": f"s3://{bucket}/out/r.jsonl"}
    r = submit_batch(stack, "mlp", spec)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["kind"] == "batch" and job["status"] == "PENDING"
    assert r.headers["Location"] == f"/v2/jobs/{job['id']}"
    status = wait_done(stack, job["id"], timeout=60)
    assert status["status"] == "SUCCESS", status
    assert status["progress"] == {"lines": 152, "failed": 2}
    assert status["output"] == spec["output"]
    assert changed(before, batch_jobs(db, "mlp")) == {"submitted": 1, "succeeded": 1}
    assert requests.get(f"http://{stack}/v2/jobs/{job['id']}/result").json() == status
    out = read_jsonl(s3, bucket, "out/r.jsonl")
    assert len(out) == 152
    assert out[7] == {"id": "bad", "error": out[7]["error"]} and "NOPE" in out[7]["error"]
    assert "error" in out[9] and "parse" in out[9]["error"]
    answers = [o for k, o in enumerate(out) if k not in (7, 9)]
    for i, got in enumerate(answers):
        want = reference_mlp(
            np.array(mlp_line(i)["inputs"][0]["data"], np.float32).reshape(1 + i % 3, 64)
        )
        assert got["id"] == f"r{i}" and got["model_name"] == "mlp"
        (output,) = got["outputs"]
        assert output["name"] == "OUTPUT0" and output["shape"] == list(want.shape)
        np.testing.assert_allclose(np.array(output["data"]).reshape(want.shape), want, atol=1e-5)


def test_lines_go_packed_and_a_failing_line_fails_alone(stack: str, s3, bucket: str) -> None:
    """Lines the model can run together go as requests of many rows (line_packing); a pack
    the model fails is sent again a line at a time, so only the bad line fails."""
    values = [float(k) for k in range(40)]
    values[21] = -1.0  # the one line the model refuses
    put_jsonl(s3, bucket, "picky.jsonl", one_row_lines("p", "X", "FP32", values))
    spec = {"input": f"s3://{bucket}/picky.jsonl", "output": f"s3://{bucket}/picky-out.jsonl"}
    job = submit_batch(stack, "picky", spec).json()["id"]
    status = wait_done(stack, job, timeout=60)
    assert status["status"] == "SUCCESS" and status["progress"] == {"lines": 40, "failed": 1}
    out = read_jsonl(s3, bucket, "picky-out.jsonl")
    assert [o["id"] for o in out] == [f"p{k}" for k in range(40)]
    assert out[21] == {"id": "p21", "error": "negative X"}
    doubled = [o["outputs"][0]["data"][0] for k, o in enumerate(out) if k != 21]
    assert doubled == [2 * v for k, v in enumerate(values) if k != 21]
    rows = [o["outputs"][0]["data"][1] for k, o in enumerate(out) if k != 21]
    # Lines 0-7, 8-15, 24-31 and 32-39 each came as one request of 8 rows (the model's
    # max_batch_size); the pack of 16-23 failed for line 21 and was sent again line by line.
    assert rows.count(8.0) == 32 and rows.count(1.0) == 7, rows


def test_bad_batch_jobs_are_refused_before_anything_is_queued(
    stack: str, db: str, bucket: str
) -> None:
    client = redis.Redis.from_url(db)
    queued, records = client.llen(broker.JOBS_QUEUE), len(client.keys("conch.job.*"))
    good_in = f"s3://{bucket}/in.jsonl"
    for model, spec, want in (
        ("mlp", {"input": "/etc/passwd", "output": f"s3://{bucket}/o"}, "s3://bucket/key"),
        ("mlp", {"input": f"s3://{bucket}/../x", "output": f"s3://{bucket}/o"}, "refused"),
        ("mlp", {"input": good_in, "output": f"s3://{bucket}/a//b"}, "refused"),
        ("mlp", {"input": good_in, "output": good_in}, "must not be"),
        ("mlp", {"input": good_in}, "output"),
        ("mlp", {"input": good_in, "output": f"s3://{bucket}/o", "extra": 1}, "batch job is"),
        ("no_such_model", {"input": good_in, "output": f"s3://{bucket}/o"}, "unknown model"),
    ):
        r = submit_batch(stack, model, spec)
        assert r.status_code == 400, (spec, r.status_code, r.text)
        assert want in r.json()["error"], (spec, r.json())
    r = requests.post(f"http://{stack}/v2/models/mlp/batch", data=b"{oops")
    assert r.status_code == 400 and "parse" in r.json()["error"]
    assert client.llen(broker.JOBS_QUEUE) == queued
    assert len(client.keys("conch.job.*")) == records


def test_a_missing_input_object_fails_the_job_and_says_so(
    served: tuple, db: str, bucket: str
) -> None:
    stack, worker = served
    before = batch_jobs(db, "mlp")
    spec = {"input": f"s3://{bucket}/absent.jsonl", "output": f"s3://{bucket}/out.jsonl"}
    r = submit_batch(stack, "mlp", spec)
    assert r.status_code == 202, r.text
    status = wait_done(stack, r.json()["id"], timeout=60)
    assert status["status"] == "FAILURE" and "absent.jsonl" in status["error"], status
    assert changed(before, batch_jobs(db, "mlp")) == {"submitted": 1, "failed": 1}
    # The job's own error, not the worker's: Celery logs it as expected, with no traceback.
    wait_until(lambda: "absent.jsonl" in worker.log(), 10, "the worker to log the failure")
    failure = [line for line in worker.log().splitlines() if "absent.jsonl" in line]
    assert not [line for line in failure if "raised unexpected" in line], failure


def _probe(value: float) -> list[httpclient.InferInput]:
    i = httpclient.InferInput("X", [1, 1], "FP32")
    i.set_data_from_numpy(np.full((1, 1), value, np.float32))
    return [i]


def test_online_outranks_async_which_outranks_offline(stack: str, db: str, s3, bucket: str) -> None:
    """Point 4 of issue 3: a batch is filled from the highest priority down."""
    client = redis.Redis.from_url(db)
    probe_line = json.dumps(
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [0.05]}]}
    )
    put_jsonl(s3, bucket, "probe.jsonl", [probe_line] * 6)
    offline = broker.priority_key(broker.queue_name("batch_probe"), broker.PRIORITY_OFFLINE)
    with ThreadPoolExecutor(4) as pool:
        blocker = pool.submit(
            lambda: httpclient.InferenceServerClient(stack).infer("batch_probe", _probe(2.0))
        )
        wait_until(lambda: client.zcard(keys.UNACKED_INDEX) > 0, 10, "the blocker to start")
        # Queued in the worst order: offline work first, then async jobs, then online.
        spec = {"input": f"s3://{bucket}/probe.jsonl", "output": f"s3://{bucket}/probe-out.jsonl"}
        batch_job = submit_batch(stack, "batch_probe", spec).json()["id"]
        # The six lines go as one message of six rows (line_packing).
        wait_until(lambda: client.llen(offline) == 1, 10, "the offline message to be queued")
        jobs = [submit(stack, "batch_probe", _probe(0.05)) for _ in range(6)]
        online = [
            pool.submit(
                lambda: httpclient.InferenceServerClient(stack).infer("batch_probe", _probe(0.05))
            )
            for _ in range(3)
        ]
        after = blocker.result().as_numpy("Y")[0][0] + 1
        online_y = [tuple(f.result().as_numpy("Y")[0]) for f in online]
    job_y = sorted(tuple(result(stack, j).as_numpy("Y")[0]) for j in jobs if wait_done(stack, j))
    assert wait_done(stack, batch_job, timeout=60)["status"] == "SUCCESS"
    offline_y = [tuple(o["outputs"][0]["data"]) for o in read_jsonl(s3, bucket, "probe-out.jsonl")]
    # Next execution: the 3 online requests, and 5 async jobs in the free slots; then
    # the last job. The offline message waits while online or async work runs (this
    # model's rows cost seconds, so a tenth of its time buys none of it: OfflineShare),
    # and run together once it is quiet, as the one request of six rows they were packed in.
    assert online_y == [(after, 8)] * 3, online_y
    assert job_y == [(after, 8)] * 5 + [(after + 1, 1)], job_y
    assert offline_y == [(after + 2, 1)] * 6, offline_y


def test_a_job_longer_than_the_visibility_timeout_runs_once(
    model_repo: Path, redis_url: str, log_dir: Path, s3_endpoint: str, s3, bucket: str
) -> None:
    # kombu restores any message unacked for longer than the visibility timeout, even
    # one a live worker is running; the job's keepalive must stop that.
    db = fresh_db(redis_url, 10)
    env = {"AWS_ENDPOINT_URL": s3_endpoint, "CONCH_VISIBILITY_TIMEOUT_S": "3"}
    with serving(model_repo, db, log_dir, ("batch_probe",), worker_env=env) as (url, worker, _):
        line = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [7.0]}]}
        put_jsonl(s3, bucket, "slow.jsonl", [json.dumps(line)])
        spec = {"input": f"s3://{bucket}/slow.jsonl", "output": f"s3://{bucket}/slow-out.jsonl"}
        job = submit_batch(url, "batch_probe", spec).json()["id"]
        assert wait_done(url, job, timeout=60)["status"] == "SUCCESS"
        client = redis.Redis.from_url(db)
        wait_until(lambda: client.llen(broker.JOBS_QUEUE) == 0, 5, "the jobs queue to drain")
        time.sleep(2)  # a restored copy would have started by now
        assert worker.log().count(f"conch.batch_job[{job}] received") == 1, worker.log()[-3000:]
        assert client.llen(broker.JOBS_QUEUE) == 0


def test_a_job_whose_worker_is_killed_is_run_again_by_another(
    model_repo: Path, redis_url: str, log_dir: Path, s3_endpoint: str, s3, bucket: str
) -> None:
    db = fresh_db(redis_url, 9)
    env = {"AWS_ENDPOINT_URL": s3_endpoint, "CONCH_VISIBILITY_TIMEOUT_S": "3"}
    fast = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [0.01]}]}
    slow = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [4.0]}]}
    put_jsonl(
        s3, bucket, "k.jsonl", [json.dumps(fast)] * 3 + [json.dumps(slow)] + [json.dumps(fast)] * 3
    )
    spec = {"input": f"s3://{bucket}/k.jsonl", "output": f"s3://{bucket}/k-out.jsonl"}
    with serving(model_repo, db, log_dir, ("batch_probe",), worker_env=env) as (url, worker, _):
        job = submit_batch(url, "batch_probe", spec).json()["id"]
        # The slow line is executing once the job has sent every line (none answered yet).
        client = redis.Redis.from_url(db)
        wait_until(lambda: client.zcard(keys.UNACKED_INDEX) >= 2, 20, "the job to run", worker)
        time.sleep(0.5)
        worker.stop(signal.SIGKILL)
        status = requests.get(f"http://{url}/v2/jobs/{job}").json()
        assert status["status"] == "STARTED", status
        second = start_worker(model_repo, db, log_dir, "--models", "batch_probe", env=env)
        try:
            status = wait_done(url, job, timeout=90)
            assert status["status"] == "SUCCESS", status
            assert status["progress"] == {"lines": 7, "failed": 0}
            assert f"conch.batch_job[{job}] received" in second.log()
        finally:
            second.stop()
    out = read_jsonl(s3, bucket, "k-out.jsonl")
    assert len(out) == 7 and all("outputs" in o for o in out), out


def test_a_cancelled_batch_job_stops_and_writes_nothing(
    stack: str, db: str, s3, bucket: str
) -> None:
    line = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [0.1]}]}
    put_jsonl(s3, bucket, "long.jsonl", [json.dumps(line)] * 400)
    before = batch_jobs(db, "batch_probe")
    spec = {"input": f"s3://{bucket}/long.jsonl", "output": f"s3://{bucket}/long-out.jsonl"}
    job = submit_batch(stack, "batch_probe", spec).json()["id"]

    def running() -> bool:
        status = requests.get(f"http://{stack}/v2/jobs/{job}").json()
        return status["status"] == "STARTED" and status["progress"]["lines"] > 0

    wait_until(running, 30, "the job to answer its first lines")
    r = requests.delete(f"http://{stack}/v2/jobs/{job}")
    assert r.status_code == 200, r.text
    status = wait_done(stack, job, timeout=30)
    assert status["status"] == "REVOKED" and "cancelled" in status["error"], status
    assert status["progress"]["lines"] < 400
    wait_until(
        lambda: changed(before, batch_jobs(db, "batch_probe")) == {"submitted": 1, "cancelled": 1},
        10,
        "the driver to count its end",
    )
    client = redis.Redis.from_url(db)
    offline = broker.priority_key(broker.queue_name("batch_probe"), broker.PRIORITY_OFFLINE)
    wait_until(lambda: client.llen(offline) == 0, 30, "the offline work already queued to drain")
    time.sleep(1)
    assert requests.get(f"http://{stack}/v2/jobs/{job}").json()["status"] == "REVOKED"
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=bucket, Key="long-out.jsonl")


def test_a_line_past_the_size_bound_is_an_error_line_and_the_rest_run(
    model_repo: Path, redis_url: str, log_dir: Path, s3_endpoint: str, s3, bucket: str
) -> None:
    db = fresh_db(redis_url, 9)
    env = {"AWS_ENDPOINT_URL": s3_endpoint, "CONCH_MAX_INPUT_BYTES": "4096"}
    small = json.dumps(mlp_line(0))  # under 4 KiB of JSON
    big = json.dumps({**mlp_line(1), "id": "x" * 10_000})  # over it
    assert len(small) < 4096 < len(big)
    put_jsonl(s3, bucket, "sizes.jsonl", [small, big, small])
    spec = {"input": f"s3://{bucket}/sizes.jsonl", "output": f"s3://{bucket}/sizes-out.jsonl"}
    with serving(model_repo, db, log_dir, ("mlp",), worker_env=env) as (url, _, _):
        job = submit_batch(url, "mlp", spec).json()["id"]
        status = wait_done(url, job, timeout=60)
    assert status["status"] == "SUCCESS" and status["progress"] == {"lines": 3, "failed": 1}
    out = read_jsonl(s3, bucket, "sizes-out.jsonl")
    assert "outputs" in out[0] and "outputs" in out[2]
    assert "4096 bytes" in out[1]["error"], out[1]


def test_conch_batch_runs_a_job_with_a_progress_bar(stack: str, s3, bucket: str) -> None:
    put_jsonl(s3, bucket, "cli.jsonl", [json.dumps(mlp_line(i)) for i in range(40)])
    cmd = conch("batch", "-u", stack, "-m", "mlp")
    done = subprocess.run(
        [*cmd, "--input", f"s3://{bucket}/cli.jsonl", "--output", f"s3://{bucket}/cli-out.jsonl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().splitlines()[-1]
    assert "40 lines answered" in done.stderr and " lines" in done.stderr  # the tqdm bar
    assert requests.get(f"http://{stack}/v2/jobs/{job}").json()["status"] == "SUCCESS"
    assert len(read_jsonl(s3, bucket, "cli-out.jsonl")) == 40
    refused = subprocess.run(
        [*cmd, "--input", "/etc/passwd", "--output", f"s3://{bucket}/x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "s3://bucket/key" in refused.stderr, refused.stderr


def test_an_unwritable_output_fails_the_job_before_any_work(stack: str, s3, bucket: str) -> None:
    put_jsonl(s3, bucket, "w.jsonl", [json.dumps(mlp_line(0))])
    spec = {"input": f"s3://{bucket}/w.jsonl", "output": "s3://no-such-bucket-here/out.jsonl"}
    job = submit_batch(stack, "mlp", spec).json()["id"]
    status = wait_done(stack, job, timeout=60)
    assert status["status"] == "FAILURE" and "cannot write" in status["error"], status
    assert status["progress"] == {"lines": 0, "failed": 0}
    # Raised by the task, stored by Celery, answered with the error's own status.
    r = requests.get(f"http://{stack}/v2/jobs/{job}/result")
    assert r.status_code == 400 and "no-such-bucket-here" in r.json()["error"]


def test_a_job_on_a_model_that_exists_only_through_its_load_overrides(
    tmp_path: Path, redis_url: str, log_dir: Path, s3_endpoint: str, s3, bucket: str
) -> None:
    """Explicit mode: ``fresh`` exists only in its load request (a config override and a
    ``file:`` override; nothing on disk). The job's task must read the model through the
    overrides, as the gateway that accepted the job does: a repository opened without
    them has no such model, and the job would fail."""
    repo = tmp_path / "models"
    repo.mkdir()
    offset_model(tmp_path / "elsewhere" / "offset", 1, 1.0)  # Y = X + 1, outside the repository
    onnx_bytes = (tmp_path / "elsewhere" / "offset" / "1" / "model.onnx").read_bytes()
    config = json.dumps(
        {
            "name": "fresh",
            "platform": "onnxruntime_onnx",
            "max_batch_size": 8,
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}],
        }
    )
    lines = [
        {
            "id": f"r{i}",
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [i] * 4}],
        }
        for i in range(5)
    ]
    put_jsonl(s3, bucket, "fresh.jsonl", [json.dumps(line) for line in lines])
    spec = {"input": f"s3://{bucket}/fresh.jsonl", "output": f"s3://{bucket}/fresh-out.jsonl"}
    db = fresh_db(redis_url, 12)
    flags = ("--model-control-mode", "explicit")
    worker = start_worker(repo, db, log_dir, *flags, env={"AWS_ENDPOINT_URL": s3_endpoint})
    gateway, url = start_gateway(repo, db, log_dir, *flags, "--allow-model-upload")
    try:
        client = httpclient.InferenceServerClient(url)
        wait_until(client.is_server_ready, 60, "the gateway", worker, gateway)
        client.load_model("fresh", config=config, files={"file:1/model.onnx": onnx_bytes})
        wait_model_ready(url, "fresh", 60, worker, gateway)
        assert not (repo / "fresh").exists()
        r = submit_batch(url, "fresh", spec)
        assert r.status_code == 202, r.text
        status = wait_done(url, r.json()["id"], timeout=60)
    finally:
        gateway.stop()
        worker.stop()
    assert status["status"] == "SUCCESS", status
    assert status["progress"] == {"lines": 5, "failed": 0}
    out = read_jsonl(s3, bucket, "fresh-out.jsonl")
    assert [o["id"] for o in out] == [f"r{i}" for i in range(5)]
    for i, o in enumerate(out):
        assert o["model_name"] == "fresh"
        (output,) = o["outputs"]
        assert output["name"] == "Y" and output["shape"] == [1, 4]
        assert output["data"] == [i + 1.0] * 4


# --- only the workers that take batch jobs run them (--batch-jobs) -------------------------


def _job_received(worker: Service, job: str) -> bool:
    """Celery's log line for a task its consumer took."""
    return f"conch.batch_job[{job}] received" in worker.log()


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _celery_ready(worker: Service) -> None:
    """Until the worker's Celery consumer is up (and would take a job it consumes)."""
    wait_until(lambda: f"@{_worker_id(worker)} ready." in worker.log(), 60, "Celery", worker)


def _worker_id(worker: Service) -> str:
    ids = re.findall(r"conch@(\S+) v\d", worker.log())
    return ids[0] if ids else "(not yet)"


def test_only_workers_that_take_batch_jobs_run_their_drivers(
    model_repo: Path, redis_url: str, log_dir: Path, s3_endpoint: str, s3, bucket: str
) -> None:
    """Two workers serve the model, one started with --batch-jobs=false (a GPU group's,
    whose scaler does not count jobs): every job's driver runs on the other one, while
    both are up and idle and the jobs are submitted together."""
    db = fresh_db(redis_url, 12)
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    taker = start_worker(model_repo, db, log_dir, "--models", "batch_probe", env=env)
    other = start_worker(
        model_repo, db, log_dir, "--models", "batch_probe", "--batch-jobs=false", env=env
    )
    gateway, url = start_gateway(model_repo, db, log_dir)
    try:
        for worker in (taker, other):
            _celery_ready(worker)
        line = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [0.2]}]}
        put_jsonl(s3, bucket, "g.jsonl", [json.dumps(line)] * 3)
        jobs = [
            submit_batch(
                url,
                "batch_probe",
                {"input": f"s3://{bucket}/g.jsonl", "output": f"s3://{bucket}/g{k}"},
            ).json()["id"]
            for k in range(4)
        ]
        for job in jobs:
            assert wait_done(url, job, timeout=90)["status"] == "SUCCESS"
            assert _job_received(taker, job)
        assert "conch.batch_job[" not in other.log()
    finally:
        gateway.stop()
        other.stop()
        taker.stop()


def test_a_job_waits_while_no_worker_takes_jobs_and_runs_once_one_starts(
    model_repo: Path, redis_url: str, log_dir: Path, s3_endpoint: str, s3, bucket: str
) -> None:
    """With only a --batch-jobs=false worker up, a batch job stays queued (the work the
    jobs queue owes: one waiting, none running) while the worker serves its model online,
    idles (its Celery consumer has no queue: no busy loop), keeps its report alive
    (heartbeats) and shuts down cleanly; a worker that takes jobs then runs it."""
    db = fresh_db(redis_url, 12)
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    client = redis.Redis.from_url(db)
    other = start_worker(
        model_repo, db, log_dir, "--models", "batch_probe", "--batch-jobs=false", env=env
    )
    gateway, url = start_gateway(model_repo, db, log_dir)
    taker = None
    try:
        wait_model_ready(url, "batch_probe", 60, other, gateway)
        _celery_ready(other)
        line = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [0.01]}]}
        put_jsonl(s3, bucket, "w.jsonl", [json.dumps(line)] * 2)
        spec = {"input": f"s3://{bucket}/w.jsonl", "output": f"s3://{bucket}/w-out.jsonl"}
        job = submit_batch(url, "batch_probe", spec).json()["id"]
        online = httpclient.InferenceServerClient(url).infer("batch_probe", _probe(0.01))
        assert online.as_numpy("Y").shape == (1, 2)  # the model queue is the batchers'

        # Longer than a report lives (four beats): only the heartbeat keeps it.
        idle_s = HEARTBEAT_S * 4 + 1
        before = _cpu_seconds(other.pid)
        time.sleep(idle_s)
        busy = (_cpu_seconds(other.pid) - before) / idle_s
        assert busy < 0.05, f"an idle worker with no Celery queue used {busy:.0%} of a core"
        (report,) = worker_reports.snapshot(client)
        assert report["id"] == _worker_id(other)
        assert requests.get(f"http://{url}/v2/jobs/{job}").json()["status"] == "PENDING"
        assert jobs_owed(client) == JobsWork(waiting=1, in_flight=0)

        taker = start_worker(model_repo, db, log_dir, "--models", "batch_probe", env=env)
        status = wait_done(url, job, timeout=90)
        assert status["status"] == "SUCCESS" and status["progress"] == {"lines": 2, "failed": 0}
        assert _job_received(taker, job) and not _job_received(other, job)
        assert jobs_owed(client) == JobsWork(waiting=0, in_flight=0)
        stopping = time.monotonic()
        assert other.stop() == 0 and time.monotonic() - stopping < 10
        assert "Warm shutdown" in other.log()
    finally:
        gateway.stop()
        other.stop()
        if taker is not None:
            taker.stop()


def batch_job_outputs(
    url: str, s3, model: str, input_name: str, arrays: list[np.ndarray], *, timeout: float = 90
) -> list[np.ndarray]:
    """Run ``arrays`` (FP32, one input each) through ``model`` as an S3 batch job: each
    line's one output, in order, once the job succeeded with every line answered."""
    bucket = f"batch-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    lines = [
        json.dumps(
            {
                "id": f"r{i}",
                "inputs": [
                    {
                        "name": input_name,
                        "datatype": "FP32",
                        "shape": list(x.shape),
                        "data": x.ravel().tolist(),
                    }
                ],
            }
        )
        for i, x in enumerate(arrays)
    ]
    put_jsonl(s3, bucket, "in.jsonl", lines)
    spec = {"input": f"s3://{bucket}/in.jsonl", "output": f"s3://{bucket}/out.jsonl"}
    r = submit_batch(url, model, spec)
    assert r.status_code == 202, r.text
    status = wait_done(url, r.json()["id"], timeout=timeout)
    assert status["status"] == "SUCCESS", status
    out = read_jsonl(s3, bucket, "out.jsonl")
    assert [o["id"] for o in out] == [f"r{i}" for i in range(len(arrays))]
    answers = []
    for o in out:
        (output,) = o["outputs"]
        answers.append(np.array(output["data"], np.float32).reshape(output["shape"]))
    return answers
