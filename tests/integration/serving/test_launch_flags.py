"""Triton's launch flags on real processes: --backend-config, the log flags,
--exit-timeout-secs, --exit-on-error and --model-load-thread-count, given to ``conch
worker`` and ``conch gateway`` as to tritonserver."""

from __future__ import annotations

import itertools
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient

from conch.wire import keys

from harness import (
    ROOT,
    Service,
    fresh_db,
    start_gateway,
    start_worker,
    wait_model_ready,
    wait_until,
)
from models import add_model, batch_probe, python_model

# Triton's two line heads; the group is the severity letter.
ISO8601_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ([IWE]) \d+ [\w.]+:\d+\] ")
DEFAULT_LINE = re.compile(r"([IWE])\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ [\w.]+:\d+\] ")


def _records(path: Path, head: re.Pattern[str]) -> list[tuple[str, str]]:
    """(severity letter, line) of each line that starts a log record."""
    return [(m[1], line) for line in path.read_text().splitlines() if (m := head.match(line))]


def test_backend_config_and_log_flags(tmp_path: Path, redis_url: str, log_dir: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(ROOT / "functions" / "mlp_autocomplete", repo / "mlp_autocomplete")
    db = fresh_db(redis_url, 13)
    batch = (
        "--backend-config=default-max-batch-size=16",  # every backend ...
        "--backend-config=onnxruntime,default-max-batch-size=2",  # ... but onnxruntime's own
    )
    worker_log, gateway_log = tmp_path / "worker.log", tmp_path / "gateway.log"
    worker = start_worker(
        repo,
        db,
        log_dir,
        *batch,
        "--backend-config=onnxruntime,enable-mem-arena=1",  # Triton's, not conch's: a warning
        *("--log-file", str(worker_log), "--log-format", "ISO8601", "--log-info=false"),
    )
    gateway, url = start_gateway(repo, db, log_dir, *batch, "--log-file", str(gateway_log))
    try:
        wait_model_ready(url, "mlp_autocomplete", 90, worker, gateway)
        client = httpclient.InferenceServerClient(url)
        assert client.get_model_config("mlp_autocomplete")["max_batch_size"] == 2
        meta = client.get_model_metadata("mlp_autocomplete")
        inputs = []
        for t in meta["inputs"]:
            shape = [2 if d == -1 else d for d in t["shape"]]
            inp = httpclient.InferInput(t["name"], shape, t["datatype"])
            inp.set_data_from_numpy(np.ones(shape, np.float32))
            inputs.append(inp)
        assert client.infer("mlp_autocomplete", inputs).get_response()["outputs"]
    finally:
        gateway.stop()
        worker.stop()
    # The worker: ISO8601 lines, warnings and errors only, the ignored setting named.
    records = _records(worker_log, ISO8601_LINE)
    assert any("--backend-config onnxruntime,enable-mem-arena=1 ignored" in x for _, x in records)
    assert {letter for letter, _ in records} <= {"W", "E"}, records
    assert not ISO8601_LINE.search(worker.log())  # nothing went to stderr
    # The gateway: Triton's default lines, info lines among them, gunicorn's too.
    records = _records(gateway_log, DEFAULT_LINE)
    assert any(letter == "I" and "Listening at: http://" in x for letter, x in records), records
    assert not DEFAULT_LINE.search(gateway.log())


def _held(db: str) -> bool:
    """A worker holds a request (popped, not yet answered)."""
    return redis.Redis.from_url(db).zcard(keys.UNACKED_INDEX) > 0


def _stop_during_a_call(
    service: Service, url: str, db: str, seconds: float
) -> tuple[float, int | None, list[object]]:
    """SIGTERM ``service`` while the batch probe (behind ``url``) runs a call that takes
    ``seconds``: how long the stop took, the exit code, and what the call gets (its
    output array or an exception, once it ends)."""
    got: list[object] = []

    def call() -> None:
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[seconds]], np.float32))
        client = httpclient.InferenceServerClient(url, network_timeout=300)
        try:
            got.append(client.infer("batch_probe", [x]).as_numpy("Y"))
        except Exception as exc:
            got.append(exc)
        finally:
            client.close()

    threading.Thread(target=call, daemon=True).start()
    wait_until(lambda: _held(db), 30, "a worker to take the request", service)
    start = time.monotonic()
    code = service.stop(signal.SIGTERM, timeout=120)
    return time.monotonic() - start, code, got


@pytest.mark.parametrize("role", ["worker", "gateway"])
def test_exit_timeout_bounds_the_shutdown(
    tmp_path: Path, redis_url: str, log_dir: Path, role: str
) -> None:
    """The worker's warm shutdown and the gateway's graceful one wait for work in flight,
    but no longer than --exit-timeout-secs (Triton's default of 30 s, or the 60 s the
    worker's batchers are joined for, would hold these stops for the whole call)."""
    repo = tmp_path / "models"
    batch_probe(repo / "batch_probe")
    db = fresh_db(redis_url, 14)
    # The other part, quick to stop: the cut-off call below still waits at the end.
    if role == "worker":
        other, url = start_gateway(repo, db, log_dir, "--exit-timeout-secs", "1")
    else:
        other = start_worker(repo, db, log_dir, "--exit-timeout-secs", "1")
    started: list[Service] = []

    def start(seconds: str) -> tuple[Service, str]:
        flag = ("--exit-timeout-secs", seconds)
        if role == "worker":
            service, at = start_worker(repo, db, log_dir, *flag), url
        else:
            service, at = start_gateway(repo, db, log_dir, *flag)
        started.append(service)
        wait_model_ready(at, "batch_probe", 90, service, other)
        return service, at

    try:
        # Work that finishes within the timeout is finished: its caller gets the answer.
        service, at = start("60")
        took, code, got = _stop_during_a_call(service, at, db, 2.0)
        wait_until(lambda: bool(got), 30, "the call's answer")
        assert isinstance(got[0], np.ndarray), got
        assert code == 0 and took < 60, (took, code)
        # Work that would outlast it does not hold the process: it exits at the timeout.
        service, at = start("2")
        took, code, _ = _stop_during_a_call(service, at, db, 120.0)
        assert took < 20, (took, service.log()[-3000:])
        if role == "worker":  # a hard exit, and the log says why
            assert code != 0
            assert "exit timeout: work still in flight 2 s after shutdown began" in service.log()
    finally:
        for s in [*started, other]:
            s.stop()


# Each load sleeps LOAD_S in ``initialize`` and appends "<model> <start> <end>" to the file
# its LOG parameter names; a model named "broken..." fails to load instead.
SLOW_LOAD_S = 1.0
SLOW_LOAD = f"""
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if args["model_name"].startswith("broken"):
            raise RuntimeError("this model never loads")
        started = time.time()
        time.sleep({SLOW_LOAD_S})
        with open(config["parameters"]["LOG"]["string_value"], "a") as f:
            f.write(f"{{args['model_name']}} {{started}} {{time.time()}}\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
"""


def _slow_loads(repo: Path, names: list[str], log: Path) -> None:
    for name in names:
        python_model(
            repo / name,
            'backend: "python"\nmax_batch_size: 1\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            f'parameters {{ key: "LOG" value: {{ string_value: "{log}" }} }}\n',
            SLOW_LOAD,
        )


def _loads(log: Path) -> list[tuple[str, float, float]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return sorted(
        ((m, float(a), float(b)) for m, a, b in (ln.split() for ln in lines)), key=lambda e: e[1]
    )


@pytest.mark.parametrize("threads", [1, 4])
def test_model_load_thread_count_loads_that_many_at_once(
    tmp_path: Path, redis_url: str, log_dir: Path, threads: int
) -> None:
    """Four models whose loads take a second each: with one thread they load one after
    another, with four all at once (Triton's default)."""
    repo, log = tmp_path / "models", tmp_path / "loads.log"
    names = [f"slow{i}" for i in range(4)]
    _slow_loads(repo, names, log)
    worker = start_worker(
        repo, fresh_db(redis_url, 13), log_dir, f"--model-load-thread-count={threads}"
    )
    try:
        wait_until(lambda: len(_loads(log)) == 4, 90, "four loads", worker)
    finally:
        worker.stop()
    loads = _loads(log)
    overlapping = sum(start < loads[0][2] for _, start, _ in loads[1:])
    if threads == 1:
        for (m1, _, end), (m2, start, _) in itertools.pairwise(loads):
            assert start >= end, f"{m2} began loading at {start} while {m1} loaded until {end}"
    else:
        assert overlapping == 3, loads  # each began before the first had finished


@pytest.mark.parametrize("exit_on_error", [True, False])
def test_exit_on_error_stops_a_worker_whose_model_fails_to_load(
    tmp_path: Path, redis_url: str, log_dir: Path, exit_on_error: bool
) -> None:
    """Triton's --exit-on-error=true: a model that fails to load at start stops the worker
    (status 1, Triton's words and the model's reason in its log). False (conch's default,
    given here in Triton's spelling): the model is unavailable with its reason, and the
    others are served."""
    repo, log = tmp_path / "models", tmp_path / "loads.log"
    add_model(repo / "add")
    _slow_loads(repo, ["broken"], log)
    db = fresh_db(redis_url, 13)
    flag = f"--exit-on-error={str(exit_on_error).lower()}"
    worker = start_worker(repo, db, log_dir, flag)
    gateway, url = start_gateway(repo, db, log_dir)
    try:
        if exit_on_error:
            assert worker.proc.wait(timeout=90) == 1, worker.log()[-3000:]
            logged = worker.log()
            assert "failed to load all models ('broken': " in logged, logged[-3000:]
            assert "this model never loads" in logged
            return
        wait_model_ready(url, "add", 90, worker, gateway)
        index = {
            m["name"]: m for m in httpclient.InferenceServerClient(url).get_model_repository_index()
        }
        assert index["broken"]["state"] == "UNAVAILABLE"
        assert "this model never loads" in index["broken"]["reason"]
        assert worker.alive()
    finally:
        gateway.stop()
        worker.stop()


def test_exit_on_error_stops_a_worker_whose_startup_model_is_not_there(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    """As Triton's L0_lifecycle has it: explicit mode, a --load-model that no repository
    holds, --exit-on-error=true: the start fails, the log names the model and Triton's
    reason."""
    repo = tmp_path / "models"
    add_model(repo / "add")
    worker = start_worker(
        repo,
        fresh_db(redis_url, 13),
        log_dir,
        *("--model-control-mode=explicit", "--load-model=does-not-exist"),
        "--exit-on-error=true",
    )
    try:
        assert worker.proc.wait(timeout=90) == 1, worker.log()[-3000:]
    finally:
        worker.stop()
    assert "failed to load all models ('does-not-exist': " in worker.log()
    assert "model not found in any model repository" in worker.log()
