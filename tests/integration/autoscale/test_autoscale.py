"""The local autoscaler through the real path: a gateway, ``conch autoscale`` (or ``conch
serve --workers``) starting and retiring real workers on a slow Python model, and clients
that count every request that fails.

- Under load the group grows to MAX; as the load falls it shrinks back to MIN by SIGTERM,
  and no request fails meanwhile.
- A group at zero: a request waits in the queue while a worker starts, and succeeds within
  its timeout; idle again, the group goes back to zero. A batch job submitted at zero
  (it waits on conch.jobs, no model's queue) starts a worker too, and completes.
- ``--scale-to-zero`` makes only the models it names read ready with no worker; other
  models keep Triton's readiness, and a model whose worker failed it is still not ready.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.http as httpclient

from conch.backends.completion import complete
from conch.core.errors import Unavailable
from conch.devtools.redis_server import start_private
from conch.frontend.model_view import SCALED_TO_ZERO, ModelView
from conch.settings import Settings
from conch.wire import worker_reports
from conch.wire.broker import JOBS_QUEUE, in_flight_key

from harness import (
    Service,
    conch,
    start_gateway,
    start_serve,
    start_worker,
    wait_model_ready,
    wait_until,
)
from integration.jobs.test_jobs import wait_done

SLEEP_S = 0.1  # what one request costs the model: a worker runs about 10 a second
VISIBILITY_TIMEOUT_S = 30
SLEEPY = f"""
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            time.sleep({SLEEP_S})
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return out
"""
FAILS = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this model never loads")

    def execute(self, requests):
        return []
"""


def _python_model(root: Path, name: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(code)
    (root / name / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """A Redis of this module's own: worker reports here are the autoscaler's workers only."""
    server = start_private()
    yield server.url
    server.stop()


@pytest.fixture()
def db(broker: str) -> str:
    redis.Redis.from_url(broker).flushdb()
    return broker


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One slow model, alone: ``conch serve``'s strict readiness counts every model."""
    root = tmp_path_factory.mktemp("autoscale") / "models"
    _python_model(root, "sleepy", SLEEPY)
    return root


def _workers(db: str, model: str = "sleepy") -> int:
    """Live workers that report ``model`` (loading or ready)."""
    reports = worker_reports.snapshot(redis.Redis.from_url(db))
    return sum(model in r.get("models", {}) for r in reports)


def _infer(client: httpclient.InferenceServerClient, value: float, **kw) -> np.ndarray:
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return client.infer("sleepy", [x], **kw).as_numpy("Y")


class Load:
    """Clients that each send requests back to back, checking every answer, until
    ``stop``; every exception or wrong answer is kept in ``errors``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ok = 0
        self.errors: list[str] = []
        self.slowest_s = 0.0
        self._lock = threading.Lock()
        self._threads: list[tuple[threading.Thread, threading.Event]] = []

    def add(self, clients: int) -> None:
        for _ in range(clients):
            done = threading.Event()
            t = threading.Thread(target=self._client, args=(done, len(self._threads)))
            self._threads.append((t, done))
            t.start()

    def remove(self, clients: int) -> None:
        for _ in range(clients):
            t, done = self._threads.pop()
            done.set()
            t.join(timeout=60)

    def stop(self) -> None:
        self.remove(len(self._threads))

    def _client(self, done: threading.Event, n: int) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=120)
        k = 0
        while not done.is_set():
            value = float(n * 100_000 + k)
            k += 1
            started = time.monotonic()
            try:
                got = _infer(client, value)
                wrong = None if got.tolist() == [2 * value] else f"{value}: got {got}"
            except Exception as exc:  # every failure counts, whatever it is
                wrong = f"{value}: {type(exc).__name__}: {exc}"
            with self._lock:
                self.slowest_s = max(self.slowest_s, time.monotonic() - started)
                if wrong is None:
                    self.ok += 1
                else:
                    self.errors.append(wrong)


def test_workers_follow_the_load_up_and_back_down_and_no_request_fails(
    repo: Path, db: str, log_dir: Path
) -> None:
    gateway, url = start_gateway(repo, db, log_dir, threads=32)
    scaler = Service(
        "autoscale",
        conch(
            "autoscale",
            *("--model-repository", str(repo), "--redis-url", db, "--models", "sleepy"),
            *("--workers", "1:3", "--target-work-per-worker", "2"),
            *("--scale-down-cooldown-secs", "3", "--scale-poll-secs", "0.3"),
            *("--exit-timeout-secs", "20"),
        ),
        log_dir,
        # A request a retired worker dropped would come back only after this: it would
        # not fail, but it would be slow (see slowest_s below).
        env={"CONCH_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S)},
    )
    load = Load(url)
    try:
        wait_model_ready(url, "sleepy", 90, scaler, gateway)
        assert _workers(db) == 1  # MIN, with nothing owed
        # 12 clients back to back owe about 12 requests: ceil(12 / 2) = 6, capped at 3.
        load.add(12)
        wait_until(lambda: _workers(db) == 3, 90, "the group to grow to MAX", scaler, gateway)
        grown_at = load.ok
        time.sleep(2)
        assert load.ok > grown_at  # served meanwhile
        # Two clients left owe at most 2, ceil(2 / 2) = 1: after the cooldown the group
        # shrinks back to MIN, retiring two workers by SIGTERM while requests keep coming
        # (one may wait in the queue while the other runs).
        load.remove(10)
        wait_until(lambda: _workers(db) == 1, 60, "the group to shrink to MIN", scaler, gateway)
        before = load.ok
        time.sleep(1)
        assert load.ok > before  # the remaining worker serves on
    finally:
        load.stop()
        scaler.stop()
        gateway.stop()
    print(f"autoscale under load: {load.ok} answered, slowest {load.slowest_s:.2f} s")
    assert load.errors == [], f"{len(load.errors)} failed of {load.ok + len(load.errors)}"
    assert load.ok > 50
    # Retired by SIGTERM, not lost: each finished its batch and handed back what it held
    # (nothing waited for the visibility timeout), and exited cleanly.
    assert load.slowest_s < VISIBILITY_TIMEOUT_S / 2, load.slowest_s
    log = scaler.log()
    assert log.count("retiring worker") >= 2 + 1  # two on the way down, the last at exit
    assert log.count("retired (exit status 0)") >= 2
    assert _workers(db) == 0  # the autoscaler's exit retired its workers


def _serve_at_zero(
    repo: Path, db: str, log_dir: Path, maximum: int, env: dict[str, str] | None = None
) -> tuple[Service, str]:
    """``conch serve --workers 0:MAX`` (HTTP only), once ready; its URL."""
    serve, url, _ = start_serve(
        repo,
        db,
        log_dir,
        "--allow-grpc=false",
        *("--workers", f"0:{maximum}", "--scale-down-cooldown-secs", "2"),
        *("--scale-poll-secs", "0.3"),
        env=env,
    )
    try:
        wait_until(lambda: _ready(url), 60, "conch serve to be ready at zero workers", serve)
    except BaseException:
        serve.stop()
        raise
    return serve, url


def test_a_request_to_a_group_at_zero_waits_for_a_worker_and_succeeds(
    repo: Path, db: str, log_dir: Path
) -> None:
    serve, url = _serve_at_zero(repo, db, log_dir, 2)
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    try:
        # At zero, by design: ready, and the model reads ready, so a client that waits for
        # readiness sends the request that starts a worker.
        assert client.is_model_ready("sleepy")
        assert client.get_model_repository_index() == [
            {"name": "sleepy", "version": "1", "state": "READY", "reason": SCALED_TO_ZERO}
        ]
        time.sleep(1)
        assert _workers(db) == 0  # nothing owed: nothing started
        started = time.monotonic()
        # Triton's timeout parameter (microseconds): the request's deadline in the queue.
        got = _infer(client, 21.0, timeout=30_000_000)
        waited = time.monotonic() - started
        assert got.tolist() == [42.0]
        assert waited < 30
        assert _workers(db) == 1  # one request owed: one worker, not MAX
        # Idle again: back to zero after the cooldown.
        wait_until(lambda: _workers(db) == 0, 60, "the group to go back to zero", serve)
        assert client.is_model_ready("sleepy") and _ready(url)
    finally:
        serve.stop()
    print(f"scale from zero: the request waited {waited:.1f} s for a worker")


def test_a_batch_job_submitted_at_zero_starts_a_worker_and_completes(
    repo: Path, db: str, log_dir: Path, s3_endpoint: str, s3
) -> None:
    """A batch job waits on conch.jobs, which no model's queue counts: the autoscaler of
    ``conch serve --workers 0:1`` counts it too (``--jobs``), so a worker starts, runs
    the job's driver and its lines, and the group goes back to zero once it is done."""
    bucket = f"zero-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    values = [1.0, 2.5, -4.0]
    lines = [
        {"id": f"r{k}", "inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [v]}]}
        for k, v in enumerate(values)
    ]
    s3.put_object(
        Bucket=bucket, Key="in.jsonl", Body="".join(json.dumps(x) + "\n" for x in lines).encode()
    )
    serve, url = _serve_at_zero(repo, db, log_dir, 1, env={"AWS_ENDPOINT_URL": s3_endpoint})
    try:
        time.sleep(1)
        assert _workers(db) == 0  # nothing owed: nothing started
        r = requests.post(
            f"http://{url}/v2/models/sleepy/batch",
            json={"input": f"s3://{bucket}/in.jsonl", "output": f"s3://{bucket}/out.jsonl"},
            timeout=30,
        )
        assert r.status_code == 202, r.text
        status = wait_done(url, r.json()["id"], timeout=90)
        assert status["status"] == "SUCCESS", status
        assert status["progress"] == {"lines": 3, "failed": 0}
        body = s3.get_object(Bucket=bucket, Key="out.jsonl")["Body"].read().decode()
        answers = [json.loads(line) for line in body.splitlines()]
        assert [a["id"] for a in answers] == ["r0", "r1", "r2"]
        assert [a["outputs"][0]["data"] for a in answers] == [[2 * v] for v in values]
        assert serve.log().count("started worker") == 1
        wait_until(lambda: _workers(db) == 0, 60, "the group to go back to zero", serve)
        assert redis.Redis.from_url(db).scard(in_flight_key(JOBS_QUEUE)) == 0
    finally:
        serve.stop()


def _ready(url: str) -> bool:
    try:
        return requests.get(f"http://{url}/v2/health/ready", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def test_scale_to_zero_makes_only_the_models_it_names_ready_without_a_worker(
    repo: Path, db: str, log_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    _python_model(root, "sleepy", SLEEPY)
    _python_model(root, "other", SLEEPY.replace('"sleepy"', '"other"'))
    _python_model(root, "fails", FAILS)
    gateway, url = start_gateway(root, db, log_dir, "--scale-to-zero", "sleepy,fails")
    worker = start_worker(root, db, log_dir, "--models", "fails")
    client = httpclient.InferenceServerClient(url)
    try:
        wait_until(lambda: "'fails' is unavailable" in worker.log(), 60, "'fails' to fail", worker)
        time.sleep(1.5)  # the gateway's view of the worker reports is at most 1 s old
        assert client.is_model_ready("sleepy")  # named, no worker: waits for one
        assert not client.is_model_ready("other")  # not named: Triton's meaning
        assert not client.is_model_ready("fails")  # named, but its worker failed it
        assert not client.is_server_ready()  # strict readiness: 'other' is not served
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert index["sleepy"]["state"] == "READY"
        assert index["other"]["state"] == "UNAVAILABLE"
        assert index["fails"]["state"] == "UNAVAILABLE"
        ready = requests.post(f"http://{url}/v2/repository/index", json={"ready": True}, timeout=5)
        assert [row["name"] for row in ready.json()] == ["sleepy"]
        # A model the repository does not have is still unknown (400), as in Triton.
        unknown = requests.get(f"http://{url}/v2/models/nope/ready", timeout=5)
        assert unknown.status_code == 400 and "unknown model" in unknown.json()["error"]
        # The failed model's requests fail at once with its reason; the others wait.
        with pytest.raises(httpclient.InferenceServerException) as exc:
            x = httpclient.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.ones(1, np.float32))
            client.infer("fails", [x])
        assert exc.value.status() == "503" and "never loads" in str(exc.value)
    finally:
        worker.stop()
        gateway.stop()


def test_a_scale_to_zero_model_is_ready_with_no_worker_or_a_loading_one_never_a_failed_one(
    repo: Path, db: str
) -> None:
    """The rule, state by state, on the worker reports real workers publish."""
    client = redis.Redis.from_url(db)
    settings = Settings(model_repository=repo, redis_url=db, scale_to_zero=["sleepy"])
    named = ModelView(settings, client, complete=complete)
    unnamed = ModelView(dataclasses.replace(settings, scale_to_zero=[]), client, complete=complete)

    def ready() -> tuple[bool, bool]:
        for view in (named, unnamed):
            view.refresh()  # no cached worker states
        return named.version_ready("sleepy", 1), unnamed.version_ready("sleepy", 1)

    def report(versions: dict[str, str], reason: str | None = None) -> None:
        state = {"versions": versions, "reason": reason, "loading": "LOADING" in versions.values()}
        worker_reports.publish(client, "w1", {"sleepy": state}, ttl_s=30)

    assert ready() == (True, False)  # at zero
    assert named.index()[0] == {
        "name": "sleepy",
        "version": "1",
        "state": "READY",
        "reason": SCALED_TO_ZERO,
    }
    assert unnamed.index()[0]["state"] == "UNAVAILABLE"
    report({"1": "LOADING"})
    assert ready() == (True, False)  # a worker is starting
    report({"1": "READY"})
    assert ready() == (True, True)
    report({}, "model 'sleepy' failed to load: boom")  # every live worker failed it
    assert ready() == (False, False)
    with pytest.raises(Unavailable, match="boom"):
        named.check_available("sleepy")
    report({}, "unloaded")
    assert ready() == (False, False)
    worker_reports.withdraw(client, "w1")
    assert ready() == (True, False)  # at zero again
