"""Triton's rate limiter across the fleet (issue 32, point 3), through real workers.

Two Python models and a sequence model share a global resource of one copy; two workers
serve the three, with ``--rate-limit execution_count``. Every execution records when it
ran, and no two of them may overlap, over every model and both workers. Then a worker is
SIGKILLed while one of its executions holds the copy: the copy is free again once that
hold's lease ends, and the other worker runs. A worker stopped while one of its instances
waits for the copy exits at once, and the request it held is run by another worker. A
request whose deadline passes while it waits for the copy never runs.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

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


def sequence_config(name: str, log: Path) -> str:
    """``config``'s, as a sequence model whose instances hold one sequence each."""
    one_each = config(name, log).replace("max_batch_size: 4", "max_batch_size: 1")
    return one_each + "sequence_batching { max_sequence_idle_microseconds: 30000000 }\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rate-limited")
    log = root / "executions.log"
    for name in ("left", "right", "holder", "waiting"):
        python_model(root / "models" / name, config(name, log), RECORDER)
    python_model(root / "models" / "ordered", sequence_config("ordered", log), RECORDER)
    return root


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 14)


def infer(url: str, model: str, seconds: float, timeout_s: float = 0, **sequence: Any) -> None:
    """One execution of ``seconds``; ``timeout_s``, if given, is the request's deadline;
    ``sequence``: tritonclient's sequence arguments (``sequence_id``...)."""
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), seconds, np.float32))
    client.infer(model, [x], timeout=int(timeout_s * 1e6) or None, **sequence)


def quietly(url: str, model: str, seconds: float, timeout_s: float = 0) -> None:
    """``infer``, for a call that is meant to end badly (its worker killed)."""
    with contextlib.suppress(Exception):
        infer(url, model, seconds, timeout_s)


def outcomes(url: str, model: str) -> tuple[int, int]:
    """(successes, failures) the statistics count for ``model``."""
    stats = httpclient.InferenceServerClient(url).get_inference_statistics(model)
    inference = stats["model_stats"][0]["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


def executions(repo: Path) -> list[tuple[str, float, float]]:
    path = repo / "executions.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(m, float(a), float(b)) for m, a, b in (ln.split() for ln in lines)]


@pytest.fixture(scope="module")
def fleet(repo: Path, db: str, log_dir: Path) -> Iterator[str]:
    flags = ("--rate-limit=execution_count",)
    models = repo / "models"
    workers = [
        start_worker(models, db, log_dir, "--models", "left,right,ordered", *flags)
        for _ in range(2)
    ]
    gateway, url = start_gateway(models, db, log_dir)
    try:
        for m in ("left", "right", "ordered"):
            wait_model_ready(url, m, 90, *workers, gateway)
        yield url
    finally:
        gateway.stop()
        for w in workers:
            w.stop()


def test_models_sharing_a_resource_never_execute_at_once(fleet: str, repo: Path) -> None:
    run_together(
        [
            threading.Thread(target=infer, args=(fleet, model, 0.05))
            for _ in range(12)
            for model in ("left", "right")
        ]
    )
    ran = one_at_a_time(repo)
    assert {m for m, _, _ in ran} == {"left", "right"}


def run_together(calls: list[threading.Thread]) -> None:
    for t in calls:
        t.start()
    for t in calls:
        t.join()


def one_at_a_time(repo: Path, since: float = 0.0) -> list[tuple[str, float, float]]:
    """The executions that started at ``since`` or later, in order, none overlapping
    another."""
    ran = sorted((e for e in executions(repo) if e[1] >= since), key=lambda e: e[1])
    for (m1, _, end), (m2, start, _) in itertools.pairwise(ran):
        assert start >= end, f"{m2} started at {start} while {m1} ran until {end}"
    return ran


def test_a_sequence_models_steps_hold_the_copy_too(fleet: str, repo: Path) -> None:
    """Four sequences (one per instance slot over the two workers, so that without the
    limiter they would run side by side) beside calls to the other two models: no two
    executions overlap, the sequences' steps included."""
    since = time.time()

    def sequence(k: int) -> None:
        for step in range(3):
            infer(
                fleet,
                "ordered",
                0.05,
                sequence_id=1000 + k,
                sequence_start=step == 0,
                sequence_end=step == 2,
            )

    calls = [threading.Thread(target=sequence, args=(k,)) for k in range(4)]
    calls += [
        threading.Thread(target=infer, args=(fleet, model, 0.05))
        for _ in range(4)
        for model in ("left", "right")
    ]
    run_together(calls)
    assert [m for m, _, _ in one_at_a_time(repo, since)].count("ordered") == 12


def test_a_sigkilled_workers_hold_is_freed(fleet: str, repo: Path, db: str, log_dir: Path) -> None:
    models = repo / "models"
    holder = start_worker(models, db, log_dir, "--models", "holder", "--rate-limit=execution_count")
    try:
        wait_model_ready(fleet, "holder", 90, holder)
        # Its deadline ends the call once the kill has been seen: a call with no worker
        # left to answer it would keep the gateway waiting, at its stop, for its exit timeout.
        threading.Thread(target=quietly, args=(fleet, "holder", 60.0, LEASE_S), daemon=True).start()
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


def test_a_worker_stopped_while_waiting_for_the_copy_hands_its_request_back(
    fleet: str, repo: Path, db: str, log_dir: Path
) -> None:
    """The stop must end the wait (not the holder's execution, nor the worker's exit
    timeout), and the request must be run elsewhere, not lost nor failed."""
    models = repo / "models"
    flags = ("--rate-limit=execution_count",)
    holder = start_worker(models, db, log_dir, "--models", "holder", *flags)
    waiter = start_worker(models, db, log_dir, "--models", "waiting", *flags)
    successor = None
    try:
        wait_model_ready(fleet, "holder", 90, holder)
        wait_model_ready(fleet, "waiting", 90, waiter)
        held = threading.Event()
        threading.Thread(
            target=lambda: (quietly(fleet, "holder", 10.0), held.set()), daemon=True
        ).start()
        time.sleep(1.5)  # the holder's execution has the only copy
        answered: list[str] = []

        def wait_for_the_copy() -> None:
            try:
                infer(fleet, "waiting", 0.0)
                answered.append("ok")
            except Exception as exc:
                answered.append(repr(exc))

        threading.Thread(target=wait_for_the_copy, daemon=True).start()
        time.sleep(1.0)  # the waiter popped it and waits for the copy
        assert not answered, answered
        waiter.stop()
        assert not held.is_set(), "the waiter exited only once the holder let go of the copy"
        successor = start_worker(models, db, log_dir, "--models", "waiting", *flags)
        wait_until(lambda: bool(answered), 60, "the handed-back request to run", successor)
        assert answered == ["ok"]
    finally:
        for w in (holder, waiter, successor):
            if w is not None:
                w.stop()


def test_a_request_whose_deadline_passes_while_it_waits_for_the_copy_never_runs(
    fleet: str, repo: Path, db: str, log_dir: Path
) -> None:
    """Popped at once by an idle worker, so in time when admitted, the request then waits
    for the copy the holder's execution has: past its deadline by the time the copy is
    free, it is dropped, not run."""
    models = repo / "models"
    flags = ("--rate-limit=execution_count",)
    holder = start_worker(models, db, log_dir, "--models", "holder", *flags)
    waiter = start_worker(models, db, log_dir, "--models", "waiting", *flags)
    try:
        wait_model_ready(fleet, "holder", 90, holder)
        wait_model_ready(fleet, "waiting", 90, waiter)
        before = outcomes(fleet, "waiting")
        since = time.time()
        held = threading.Thread(target=infer, args=(fleet, "holder", 2.5))
        held.start()
        time.sleep(1.0)  # the holder's execution has the only copy
        with pytest.raises(InferenceServerException, match="timeout"):
            infer(fleet, "waiting", 0.0, timeout_s=0.5)
        held.join()
        time.sleep(0.5)  # the waiter had the copy next, and would have run it by now
        assert [m for m, start, _ in executions(repo) if start >= since] == ["holder"]
        success, fail = outcomes(fleet, "waiting")
        assert (success - before[0], fail - before[1]) == (0, 1)  # dropped, not run
    finally:
        for w in (holder, waiter):
            w.stop()


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
