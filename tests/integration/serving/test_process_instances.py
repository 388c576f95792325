"""Model instances as processes (``--instance-form process``), through the real path: a real
worker spawns a child per instance; the gateway, Redis and tritonclient are real. Each
test checks what a thread instance already guarantees: served, counted, warmed up,
reloaded, handed back on SIGTERM, and nothing lost when one dies."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.http as httpclient

from conch.wire import keys, sequences, worker_reports
from conch.wire.work_owed import work_owed

from harness import (
    fresh_db,
    start_gateway,
    start_worker,
    wait_model_ready,
    wait_until,
)
from models import python_model, seq_onnx_accumulator, slow_model

PID_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(
            "pid_requests", "Requests this model ran", pb_utils.MetricFamily.COUNTER
        )
        self.ran = self.family.Metric({"model": args["model_name"]})

    def execute(self, requests):
        time.sleep(0.05)  # long enough for both instances to have work at once
        self.ran.increment(len(requests))
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("PID", np.full((1,), os.getpid(), np.int64))]
            )
            for _ in requests
        ]
"""

PID_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value: {
  data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
"""

MODELS = "pid,slow,seq,threaded"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("process_instances") / "models"
    python_model(root / "pid", PID_CONFIG, PID_MODEL)
    slow_model(root / "slow", seconds=1.0, max_batch_size=8, delay_us=100_000)
    seq_onnx_accumulator(root / "seq", "direct", max_batch_size=4, idle_us=60_000_000)
    # The worker's flag says process; this model's own parameter says thread, and wins.
    python_model(
        root / "threaded",
        PID_CONFIG.replace("count: 2", "count: 1")
        + 'parameters { key: "instance_form" value: { string_value: "thread" } }\n',
        PID_MODEL,
    )
    return root


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 13)


# A dead instance's requests come back after the visibility timeout: short, for the test.
ENV = {"CONCH_VISIBILITY_TIMEOUT_S": "2"}


@pytest.fixture(scope="module")
def stack(repo: Path, db: str, log_dir: Path) -> Iterator[tuple[str, str, object]]:
    """(gateway URL, its metrics address, the worker) with every model as processes."""
    worker = start_worker(
        repo,
        db,
        log_dir,
        "--models",
        MODELS,
        "--instance-form",
        "process",
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
        env=ENV,
    )
    gateway, url = start_gateway(repo, db, log_dir, threads=32)
    try:
        for model in MODELS.split(","):
            wait_model_ready(url, model, 120, worker, gateway)
        yield url, gateway.metrics_url, worker
    finally:
        gateway.stop()
        worker.stop()


def report(db: str) -> dict:
    (only,) = worker_reports.snapshot(redis.Redis.from_url(db))
    return only


def children(db: str, model: str) -> dict[str, int]:
    """instance name -> pid of ``model``'s process instances, as the worker reports them."""
    return {i["instance"]: i["pid"] for i in report(db)["instances"] if i["model"] == model}


def pid_of(url: str, model: str = "pid") -> int:
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    return int(client.infer(model, [x]).as_numpy("PID")[0])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_each_instance_runs_in_a_process_of_its_own(stack, db: str) -> None:
    """Requests run in the worker's children, one per instance, each counted and measured;
    a model whose config says thread stays in the worker."""
    url, metrics, worker = stack
    pids = children(db, "pid")
    assert sorted(pids) == ["pid_0_0", "pid_0_1"]
    assert worker.pid not in pids.values() and len(set(pids.values())) == 2
    with ThreadPoolExecutor(8) as pool:
        seen = set(pool.map(lambda _: pid_of(url), range(40)))
    assert seen == set(pids.values())  # both instances served, and only they did
    assert pid_of(url, "threaded") == worker.pid
    assert "threaded" not in {i["model"] for i in report(db)["instances"]}
    # Triton's statistics and the worker's own telemetry count them, warmup excluded.
    stats = requests.get(f"http://{url}/v2/models/pid/stats", timeout=10).json()
    assert stats["model_stats"][0]["inference_count"] == 40
    wait_until(
        lambda: report(db)["stats"].get("pid", {}).get("requests") == 40, 10, "the telemetry"
    )
    # Each child's resident memory, in the report and on the metrics port.
    for inst in (i for i in report(db)["instances"] if i["model"] == "pid"):
        assert inst["host_bytes"] > 10 * 2**20
        assert inst["gpu_bytes"] is None  # no GPU metrics here
    text = requests.get(f"http://{metrics}/metrics", timeout=10).text
    # The children's own custom metrics, summed: 40 requests and one warmup each.
    assert 'pid_requests{model="pid"} 42' in text.splitlines(), text
    for name in ("pid_0_0", "pid_0_1"):
        assert any(
            line.startswith("conch_instance_memory_bytes{")
            and f'instance="{name}"' in line
            and 'memory="host"' in line
            for line in text.splitlines()
        ), text


def test_the_logging_api_reaches_the_children(stack, db: str) -> None:
    """POST v2/logging turns verbose lines on in the worker's children too: a child's
    drain loop then logs each batch it runs, with the child's pid."""
    url, _, worker = stack
    pids = set(children(db, "pid").values())
    verbose = requests.post(f"http://{url}/v2/logging", json={"log_verbose_level": 1}, timeout=10)
    assert verbose.status_code == 200, verbose.text
    try:

        def a_child_says_so() -> bool:
            pid_of(url)
            return any(
                "executing 1 request" in line and any(f" {p} " in line for p in pids)
                for line in worker.log().splitlines()
            )

        wait_until(a_child_says_so, 30, "a child's verbose line", worker)
    finally:
        requests.post(f"http://{url}/v2/logging", json={"log_verbose_level": 0}, timeout=10)


def test_a_killed_instance_loses_nothing_and_comes_back(stack, db: str) -> None:
    """SIGKILL a child mid-batch: its requests are redelivered and answered, and the worker
    starts the instance again, which then serves."""
    url, metrics, worker = stack
    r = redis.Redis.from_url(db)
    before = children(db, "slow")
    pool = ThreadPoolExecutor(6)

    def slow(value: float) -> np.ndarray:
        x = httpclient.InferInput("X", [1, 4], "FP32")
        x.set_data_from_numpy(np.full((1, 4), value, np.float32))
        client = httpclient.InferenceServerClient(url, network_timeout=120)
        return client.infer("slow", [x]).as_numpy("Y")

    try:
        futures = [pool.submit(slow, float(i)) for i in range(6)]

        # Counted in requests: the gateway may send them as one bundle.
        def taken() -> bool:
            return work_owed(r, ["slow"])["slow"].in_flight >= 6

        wait_until(taken, 30, "the batch to be taken", worker)
        # The work owed counts what a child holds as it counts a thread's: in flight.
        assert work_owed(r, ["slow"])["slow"].in_flight == 6
        (victim,) = before.values()
        os.kill(victim, signal.SIGKILL)
        for i, f in enumerate(futures):
            np.testing.assert_array_equal(f.result(timeout=90), np.full((1, 4), i + 1.0))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    assert worker.alive()
    wait_until(
        lambda: set(children(db, "slow").values()) - {victim},
        60,
        "the instance to start again",
        worker,
    )
    assert not alive(victim)
    (inst,) = (i for i in report(db)["instances"] if i["model"] == "slow")
    assert inst["restarts"] == 1
    text = requests.get(f"http://{metrics}/metrics", timeout=10).text
    assert 'conch_redeliveries_total{model="slow"} ' in text
    assert 'conch_redeliveries_total{model="slow"} 0' not in text
    assert r.zcard(keys.UNACKED_INDEX) == 0
    np.testing.assert_array_equal(slow(9.0), np.full((1, 4), 10.0))


def test_a_sequence_goes_on_after_its_instance_dies(stack, db: str) -> None:
    """The child holding a sequence is killed between two steps: the instance started
    again offers the sequence back, and it goes on from its state in Redis."""
    url, _, _ = stack
    client = httpclient.InferenceServerClient(url, network_timeout=60)

    def step(value: int, **flags: bool) -> int:
        x = httpclient.InferInput("INPUT", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[value]], np.int32))
        out = client.infer("seq", [x], sequence_id=31337, **flags)
        return int(out.as_numpy("OUTPUT")[0, 0])

    assert step(10, sequence_start=True) == 10
    holder = redis.Redis.from_url(db).hget(
        sequences.record_key("seq", sequences.token(31337)), "owner"
    )
    ((name, victim),) = children(db, "seq").items()
    assert holder is not None and holder.decode().endswith(f"/{name}")
    os.kill(victim, signal.SIGKILL)
    assert step(5) == 15
    assert step(1, sequence_end=True) == 16
    wait_until(  # the report says so at the worker's next beat
        lambda: children(db, "seq").get(name, victim) != victim, 10, "the new child's report"
    )


def test_a_reload_switches_to_new_processes(stack, repo: Path, db: str) -> None:
    """A changed config loads new children beside the serving ones, switches, and stops
    the old: requests sent throughout all succeed."""
    url, _, worker = stack
    old = children(db, "pid")
    config = repo / "pid" / "config.pbtxt"
    done = threading.Event()
    answered: list[int] = []

    def keep_asking() -> None:
        while not done.is_set():
            answered.append(pid_of(url))

    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(keep_asking) for _ in range(2)]
        time.sleep(0.5)
        config.write_text(config.read_text().replace("count: 2", "count: 3"))
        try:
            wait_until(lambda: len(children(db, "pid")) == 3, 90, "three new instances", worker)
            new = children(db, "pid")
            wait_until(lambda: not any(alive(p) for p in old.values()), 60, "the old to exit")
            time.sleep(0.5)
        finally:
            done.set()
        for f in running:
            f.result(timeout=60)  # no request failed
    assert not set(new.values()) & set(old.values())
    assert set(answered[-4:]) <= set(new.values())


def test_sigterm_stops_every_child_and_hands_back(
    repo: Path, redis_url: str, log_dir: Path
) -> None:
    """SIGTERM to the worker alone: its children finish, hand back what they hold and
    exit; none is left behind."""
    db = fresh_db(redis_url, 12)
    worker = start_worker(
        repo, db, log_dir, "--models", "pid", "--instance-form", "process", env=ENV
    )
    gateway, url = start_gateway(repo, db, log_dir)
    try:
        wait_model_ready(url, "pid", 120, worker, gateway)
        pids = list(children(db, "pid").values())
        assert len(pids) >= 2 and all(alive(p) for p in pids)  # 3 after the reload test
        assert pid_of(url) in pids
        os.kill(worker.pid, signal.SIGTERM)  # the worker alone, not its process group
        worker.proc.wait(timeout=60)
        wait_until(lambda: not any(alive(p) for p in pids), 30, "the children to exit")
        assert redis.Redis.from_url(db).zcard(keys.UNACKED_INDEX) == 0
    finally:
        gateway.stop()
        worker.stop()


def test_a_wrong_instance_form_is_a_load_error(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    root = tmp_path / "models"
    python_model(
        root / "odd",
        PID_CONFIG + 'parameters { key: "instance_form" value: { string_value: "fiber" } }\n',
        PID_MODEL,
    )
    db = fresh_db(redis_url, 11)
    worker = start_worker(root, db, log_dir)
    gateway, url = start_gateway(root, db, log_dir)
    try:
        wait_until(
            lambda: (
                "instance_form must be one of thread, process, not 'fiber'"
                in str(requests.post(f"http://{url}/v2/repository/index", timeout=10).json())
            ),
            60,
            "the load error",
            worker,
        )
    finally:
        gateway.stop()
        worker.stop()


def _no_cuda() -> str | None:
    from conch.backends.onnxruntime import gpu_available

    has_gpu, why = gpu_available()
    return None if has_gpu else f"no CUDA GPU for onnxruntime here ({why})"


@pytest.mark.gpu
def test_kind_gpu_instances_share_one_gpu_as_processes(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    """Two KIND_GPU instances as two processes on GPU 0: both serve, and each reports the
    GPU memory NVML sees it hold."""
    problem = _no_cuda()
    if problem:
        pytest.skip(problem)
    import shutil

    from harness import ROOT, reference_mlp
    from models import rng_input

    root = tmp_path / "models"
    shutil.copytree(ROOT / "functions" / "mlp", root / "mlp")
    config = root / "mlp" / "config.pbtxt"
    config.write_text(
        config.read_text().replace("KIND_CPU", "KIND_GPU").replace("count: 1", "count: 2")
    )
    db = fresh_db(redis_url, 10)
    worker = start_worker(root, db, log_dir, "--instance-form", "process")
    gateway, url = start_gateway(root, db, log_dir)
    try:
        wait_model_ready(url, "mlp", 180, worker, gateway)
        x = rng_input((4, 64), seed=3)

        def one(_: int) -> np.ndarray:
            inp = httpclient.InferInput("INPUT0", [4, 64], "FP32")
            inp.set_data_from_numpy(x)
            client = httpclient.InferenceServerClient(url)
            return client.infer("mlp", [inp]).as_numpy("OUTPUT0")

        with ThreadPoolExecutor(8) as pool:
            for got in pool.map(one, range(64)):
                np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-3, atol=1e-3)
        wait_until(
            lambda: all((i["gpu_bytes"] or 0) > 0 for i in report(db)["instances"]),
            30,
            "each child's GPU memory in the report",
            worker,
        )
        assert len(report(db)["instances"]) == 2
    finally:
        gateway.stop()
        worker.stop()
