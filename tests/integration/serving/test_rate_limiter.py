"""Triton's rate limiter across the fleet (issue 32, point 3), through real workers.

Two Python models share a global resource of one copy; two workers serve both, with
``--rate-limit execution_count``. Every execution records when it ran, and no two of them
may overlap, over both models and both workers. Then a worker is SIGKILLed while one of
its executions holds the copy: the copy is free again once that hold's lease ends, and
the other worker runs.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conch.devtools.processes import conch
from conch.wire.rate_limits import LEASE_S

from harness import (
    Service,
    fresh_db,
    start_gateway,
    start_worker,
    wait_model_ready,
    wait_until,
)
from models import python_model

# Each execution appends "<model> <start> <end>" to the file in its parameter, after
# sleeping the seconds its input says.
RECORDER = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        self.log = json.loads(args["model_config"])["parameters"]["LOG"]["string_value"]
        self.name = args["model_name"]

    def execute(self, requests):
        started = time.time()
        seconds = max(float(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().max())
                      for r in requests)
        time.sleep(seconds)
        with open(self.log, "a") as f:
            f.write(f"{self.name} {started} {time.time()}\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros((1, 1), np.float32))])
                for r in requests]
"""


def config(name: str, log: Path, resource: str = "R") -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU
  rate_limiter {{ resources [ {{ name: "{resource}" global: true count: 1 }} ] priority: 1 }} }} ]
parameters {{ key: "LOG" value: {{ string_value: "{log}" }} }}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rate-limited")
    log = root / "executions.log"
    for name in ("left", "right", "holder"):
        python_model(root / "models" / name, config(name, log), RECORDER)
    return root


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 14)


def infer(url: str, model: str, seconds: float) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), seconds, np.float32))
    client.infer(model, [x])


def quietly(url: str, model: str, seconds: float) -> None:
    """``infer``, for a call that is meant to end badly (its worker killed)."""
    with contextlib.suppress(Exception):
        infer(url, model, seconds)


def executions(repo: Path) -> list[tuple[str, float, float]]:
    path = repo / "executions.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(m, float(a), float(b)) for m, a, b in (ln.split() for ln in lines)]


@pytest.fixture(scope="module")
def fleet(repo: Path, db: str, log_dir: Path) -> Iterator[str]:
    flags = ("--rate-limit=execution_count",)
    models = repo / "models"
    workers = [
        start_worker(models, db, log_dir, "--models", "left,right", *flags) for _ in range(2)
    ]
    gateway, url = start_gateway(models, db, log_dir)
    try:
        for m in ("left", "right"):
            wait_model_ready(url, m, 90, *workers, gateway)
        yield url
    finally:
        gateway.stop()
        for w in workers:
            w.stop()


def test_models_sharing_a_resource_never_execute_at_once(fleet: str, repo: Path) -> None:
    calls = [
        threading.Thread(target=infer, args=(fleet, model, 0.05))
        for _ in range(12)
        for model in ("left", "right")
    ]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    ran = sorted(executions(repo), key=lambda e: e[1])
    assert {m for m, _, _ in ran} == {"left", "right"}
    for (m1, _, end), (m2, start, _) in itertools.pairwise(ran):
        assert start >= end, f"{m2} started at {start} while {m1} ran until {end}"


def test_a_sigkilled_workers_hold_is_freed(fleet: str, repo: Path, db: str, log_dir: Path) -> None:
    models = repo / "models"
    holder = start_worker(models, db, log_dir, "--models", "holder", "--rate-limit=execution_count")
    try:
        wait_model_ready(fleet, "holder", 90, holder)
        threading.Thread(target=quietly, args=(fleet, "holder", 60.0), daemon=True).start()
        # Once the holder's execution has the copy, nothing else runs.
        time.sleep(1.5)
        done = threading.Event()
        threading.Thread(
            target=lambda: (infer(fleet, "left", 0.0), done.set()), daemon=True
        ).start()
        assert not done.wait(3), "left ran while the holder held the only copy"
        holder.send(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(done.is_set, LEASE_S + 15, "left to run after the holder died")
        assert time.monotonic() - killed < LEASE_S + 10
    finally:
        holder.stop()


def test_a_resource_both_global_and_per_device_refuses_the_start(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    models = tmp_path / "models"
    log = tmp_path / "executions.log"
    python_model(models / "shared", config("shared", log), RECORDER)
    per_device = config("per_device", log).replace("global: true ", "")
    python_model(models / "per_device", per_device, RECORDER)
    argv = ("--model-repository", str(models), "--redis-url", redis_url)
    worker = Service(
        "worker-conflict", conch("worker", *argv, "--rate-limit=execution_count"), log_dir
    )
    try:
        assert worker.proc.wait(timeout=60) != 0
    finally:
        worker.stop()
    assert (
        'Resource "R" is present as both global and device-specific resource in the model '
        "configuration." in worker.log()
    ), worker.log()[-2000:]
