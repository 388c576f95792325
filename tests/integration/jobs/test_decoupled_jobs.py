"""Async jobs and offline batch jobs on a decoupled model (issue 30, point 3): each
request's result holds all its responses, in order, through the real path (a real
Redis, worker, gateway and S3-API server)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from harness import fresh_db, serving
from integration.http.test_generate import REPEAT, REPEAT_CONFIG
from integration.jobs.test_jobs import wait_done
from integration.jobs.test_offline import put_jsonl, read_jsonl, submit_batch


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path, s3_endpoint: str
) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("decoupled-jobs") / "models"
    (repo / "repeat" / "1").mkdir(parents=True)
    (repo / "repeat" / "1" / "model.py").write_text(REPEAT)
    (repo / "repeat" / "config.pbtxt").write_text(REPEAT_CONFIG)
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    with serving(repo, fresh_db(redis_url, 10), log_dir, ("repeat",), worker_env=env) as (
        url,
        _,
        _,
    ):
        yield url


def repeat_request(values: list[int], request_id: str = "") -> dict:
    body: dict = {
        "inputs": [
            {"name": "IN", "datatype": "INT32", "shape": [len(values)], "data": values},
            {"name": "DELAY_MS", "datatype": "INT32", "shape": [1], "data": [10]},
        ]
    }
    if request_id:
        body["id"] = request_id
    return body


def outs(doc: dict) -> list[tuple[int, int]]:
    """Each response's (IDX, OUT)."""
    pairs = []
    for response in doc["responses"]:
        by_name = {o["name"]: o["data"][0] for o in response["outputs"]}
        pairs.append((by_name["IDX"], by_name["OUT"]))
    return pairs


def test_an_async_job_on_a_decoupled_model_gives_every_response_in_order(stack: str) -> None:
    r = requests.post(f"http://{stack}/v2/models/repeat/jobs", json=repeat_request([4, 5, 6], "j"))
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert wait_done(stack, job)["status"] == "SUCCESS"
    got = requests.get(f"http://{stack}/v2/jobs/{job}/result")
    assert got.status_code == 200, got.text
    doc = got.json()
    assert (doc["id"], doc["model_name"], doc["model_version"]) == ("j", "repeat", "1")
    assert outs(doc) == [(0, 4), (1, 5), (2, 6)]
    # Only the outputs asked for, in each response.
    body = repeat_request([7, 8]) | {"outputs": [{"name": "OUT"}]}
    job = requests.post(f"http://{stack}/v2/models/repeat/jobs", json=body).json()["id"]
    assert wait_done(stack, job)["status"] == "SUCCESS"
    doc = requests.get(f"http://{stack}/v2/jobs/{job}/result").json()
    assert [[o["name"] for o in r["outputs"]] for r in doc["responses"]] == [["OUT"], ["OUT"]]


def test_an_async_job_that_fails_mid_stream_reports_the_error(stack: str) -> None:
    body = repeat_request([1, -1, 3])  # -1: the model ends the request with an error
    job = requests.post(f"http://{stack}/v2/models/repeat/jobs", json=body).json()["id"]
    assert wait_done(stack, job)["status"] == "FAILURE"
    got = requests.get(f"http://{stack}/v2/jobs/{job}/result")
    assert got.status_code >= 400 and "An Error Occurred" in got.json()["error"]


def test_a_batch_job_on_a_decoupled_model_answers_each_line_with_its_responses(
    stack: str, s3
) -> None:
    bucket = f"data-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    lines = [
        json.dumps(repeat_request([10, 11, 12], "a")),
        json.dumps(repeat_request([0], "b")),  # no response, only the final flag
        json.dumps(repeat_request([20, -1], "c")),  # an error after one response
        json.dumps(repeat_request([30], "d")),
    ]
    put_jsonl(s3, bucket, "in.jsonl", lines)
    spec = {"input": f"s3://{bucket}/in.jsonl", "output": f"s3://{bucket}/out.jsonl"}
    r = submit_batch(stack, "repeat", spec)
    assert r.status_code == 202, r.text
    status = wait_done(stack, r.json()["id"], timeout=60)
    assert status["status"] == "SUCCESS", status
    assert status["progress"] == {"lines": 4, "failed": 1}
    out = read_jsonl(s3, bucket, "out.jsonl")
    assert [o["id"] for o in out] == ["a", "b", "c", "d"]
    assert outs(out[0]) == [(0, 10), (1, 11), (2, 12)]
    assert out[1]["responses"] == []
    assert out[2] == {"id": "c", "error": "An Error Occurred"}
    assert outs(out[3]) == [(0, 30)]
