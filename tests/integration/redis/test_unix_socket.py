"""The whole stack on a Redis reached over a Unix socket (``unix://``, what ``conch serve``
uses for the private Redis it starts): online infer on the model queues, an async job in
Celery's result backend, and an offline batch job through Celery's broker, all on it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient
from celery import Celery

from conch.devtools.redis_server import start_private
from conch.wire.redis_url import celery_url

from harness import reference_mlp, serving
from integration.jobs.test_jobs import result, submit, wait_done
from integration.jobs.test_offline import mlp_line, put_jsonl, read_jsonl, submit_batch


@pytest.fixture(scope="module")
def unix_url() -> Iterator[str]:
    server = start_private(unix_socket=True)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def stack(model_repo: Path, unix_url: str, log_dir: Path, s3_endpoint: str) -> Iterator[str]:
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    with serving(model_repo, unix_url, log_dir, ("mlp",), worker_env=env) as (url, _, _):
        yield url


def test_every_process_reaches_redis_over_the_socket(stack: str, unix_url: str) -> None:
    path = unix_url.removeprefix("unix://").split("?")[0]
    assert unix_url == f"unix://{path}?db=0"
    clients = redis.Redis(unix_socket_path=path).client_list()
    # The worker's queue, control and Celery connections and the gateway's: none on TCP.
    assert len(clients) >= 4
    assert {c["laddr"] for c in clients} == {f"{path}:0"}, clients
    # No password, so no TCP port either: only this user may open the socket.
    assert redis.Redis(unix_socket_path=path).config_get("port") == {"port": "0"}
    assert oct(Path(path).stat().st_mode & 0o777) == oct(0o700)


def test_infer_a_job_and_a_batch_job_over_a_unix_socket(stack: str, unix_url: str, s3) -> None:
    x = np.random.default_rng(3).standard_normal((2, 64), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    client = httpclient.InferenceServerClient(stack)
    got = client.infer("mlp", [inp]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-4, atol=1e-5)

    job = submit(stack, "mlp", [inp])
    assert wait_done(stack, job)["status"] == "SUCCESS"
    np.testing.assert_allclose(
        result(stack, job).as_numpy("OUTPUT0"), reference_mlp(x), rtol=1e-4, atol=1e-5
    )
    # Celery itself reads the job's result from the same socket, spelled its way.
    app = Celery("reader", backend=celery_url(unix_url), set_as_current=False)
    app.conf.update(result_serializer="msgpack", result_accept_content=["msgpack"])
    assert app.AsyncResult(job).get(timeout=30)["model_name"] == "mlp"

    bucket = f"unix-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    put_jsonl(s3, bucket, "in.jsonl", [json.dumps(mlp_line(i)) for i in range(5)])
    spec = {"input": f"s3://{bucket}/in.jsonl", "output": f"s3://{bucket}/out.jsonl"}
    r = submit_batch(stack, "mlp", spec)
    assert r.status_code == 202, r.text
    assert wait_done(stack, r.json()["id"], timeout=60)["status"] == "SUCCESS"
    assert [line["id"] for line in read_jsonl(s3, bucket, "out.jsonl")] == [
        f"r{i}" for i in range(5)
    ]
