"""An ensemble's ``max_inflight_requests`` through the real path (issue 40, point 5).

Triton 2.63's ``ensemble_scheduling { max_inflight_requests: N }`` lets each step of an
ensemble have at most N requests in flight, over all the ensemble's requests: a step
past it waits until one of its requests is answered (backpressure on the steps ahead).
conch runs an ensemble's graph in whichever process received the request, so the count
is kept in Redis and holds over all of them.

A private redis-server, a worker, a gateway of two HTTP processes and a gRPC server
serve two-step ensembles over Python models with four instances each, which log when
each execution ran; stock tritonclient sends twelve requests at once, half over HTTP
and half over gRPC. With the bound, no more than N executions of a step overlap; without
it, all four instances run at once. An embedded server (``conch.Server``) keeps the
bound in its own process.
"""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import conch
from conch.devtools.redis_server import start_private
from conch.wire.keys import ENSEMBLE_SLOTS_PREFIX

from harness import start_gateway, start_grpc, start_worker, wait_model_ready

# Sleeps for its config's "seconds" parameter, then appends "began ended requests" to
# the file its "log" parameter names, and answers its input.
GAUGE_MODEL = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.log = params["log"]["string_value"]
        self.seconds = float(params["seconds"]["string_value"])

    def execute(self, requests):
        began = time.time()
        time.sleep(self.seconds)
        with open(self.log, "a") as f:
            f.write(f"{began} {time.time()} {len(requests)}\\n")
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""

IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
LIMIT = 2
INSTANCES = 4
SECONDS = 0.4
REQUESTS = 12  # half over HTTP, half over gRPC, all at once


def gauge(root: Path, name: str, seconds: float, logs: Path) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(GAUGE_MODEL))
    (folder / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: 0\n{IO}'
        f"instance_group [ {{ kind: KIND_CPU count: {INSTANCES} }} ]\n"
        f'parameters {{ key: "log" value: {{ string_value: "{logs / name}" }} }}\n'
        f'parameters {{ key: "seconds" value: {{ string_value: "{seconds}" }} }}\n'
    )


def pipeline(root: Path, name: str, first: str, second: str, limit: int) -> None:
    """Ensemble ``name``: IN -> ``first`` -> ``second`` -> OUT."""
    bound = f"max_inflight_requests: {limit}" if limit else ""
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"ensemble_scheduling {{ {bound} step [\n"
        f'  {{ model_name: "{first}" model_version: -1\n'
        '    input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },\n'
        f'  {{ model_name: "{second}" model_version: -1\n'
        '    input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } }\n'
        "] }\n"
    )


MODELS = ("bounded", "free", "single")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("inflight")
    repo, logs = root / "models", root / "logs"
    logs.mkdir()
    for name in ("bounded_a", "bounded_b", "free_a", "free_b", "single_a", "single_b"):
        gauge(repo, name, 1.5 if name == "single_a" else SECONDS, logs)
    pipeline(repo, "bounded", "bounded_a", "bounded_b", LIMIT)
    pipeline(repo, "free", "free_a", "free_b", 0)
    pipeline(repo, "single", "single_a", "single_b", 1)
    server = start_private()
    worker = start_worker(repo, server.url, log_dir)
    gateway, url = start_gateway(repo, server.url, log_dir, workers=2)
    grpc, grpc_url = start_grpc(repo, server.url, log_dir)
    try:
        for m in MODELS:
            wait_model_ready(url, m, 120, worker, gateway, grpc)
        yield {"http": url, "grpc": grpc_url, "logs": logs, "redis": server.url}
    finally:
        grpc.stop()
        gateway.stop()
        worker.stop()
        server.stop()


def call(stack: dict, model: str, i: int) -> float:
    """One request, over HTTP for even ``i`` and gRPC for odd; its answer."""
    module = httpclient if i % 2 == 0 else grpcclient
    client = (
        httpclient.InferenceServerClient(stack["http"], network_timeout=60)
        if module is httpclient
        else grpcclient.InferenceServerClient(stack["grpc"])
    )
    x = module.InferInput("IN", [1], "FP32")
    x.set_data_from_numpy(np.array([float(i)], np.float32))
    try:
        return float(client.infer(model, [x]).as_numpy("OUT")[0])
    finally:
        client.close()


def most_at_once(log: Path) -> int:
    """The most requests the logged executions ran at one time."""
    events = []
    for line in log.read_text().split("\n"):
        if line:
            began, ended, requests = line.split()
            events += [(float(began), int(requests)), (float(ended), -int(requests))]
    now = most = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts
        now += change
        most = max(most, now)
    return most


def burst(stack: dict, model: str) -> list[float]:
    with ThreadPoolExecutor(REQUESTS) as pool:
        return list(pool.map(lambda i: call(stack, model, i), range(REQUESTS)))


def test_each_step_runs_at_most_the_bound_over_http_and_grpc(stack: dict) -> None:
    assert burst(stack, "bounded") == [float(i) for i in range(REQUESTS)]
    assert most_at_once(stack["logs"] / "bounded_a") == LIMIT
    assert most_at_once(stack["logs"] / "bounded_b") == LIMIT
    # Every slot was given back: nothing left held in Redis.
    client = redis.Redis.from_url(stack["redis"])
    assert not list(client.scan_iter(f"{ENSEMBLE_SLOTS_PREFIX}*"))


def test_without_the_bound_every_instance_runs_at_once(stack: dict) -> None:
    assert burst(stack, "free") == [float(i) for i in range(REQUESTS)]
    assert most_at_once(stack["logs"] / "free_a") == INSTANCES


def test_a_request_waiting_for_a_slot_ends_at_its_deadline(stack: dict) -> None:
    """The ensemble "single" allows one request per step; its first step takes 1.5 s. A second
    request whose timeout is 0.3 s waits for the slot and fails when it ends, as a
    request past its deadline does, never reaching the step."""
    first = threading.Thread(target=call, args=(stack, "single", 0))
    first.start()
    time.sleep(0.5)  # the first request holds the first step's one slot
    client = httpclient.InferenceServerClient(stack["http"], network_timeout=60)
    x = httpclient.InferInput("IN", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], np.float32))
    began = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        client.infer("single", [x], timeout=300_000)
    assert time.monotonic() - began < 1.0
    assert err.value.status() == "503"
    assert "Request timeout expired for ensemble 'single'" in err.value.message()
    first.join()
    assert len((stack["logs"] / "single_a").read_text().splitlines()) == 1


def test_an_embedded_server_keeps_the_bound_in_its_process(tmp_path: Path) -> None:
    """conch.Server runs every graph in its own process, and counts the slots there."""
    repo, logs = tmp_path / "models", tmp_path / "logs"
    logs.mkdir()
    for name in ("in_a", "in_b"):
        gauge(repo, name, SECONDS, logs)
    pipeline(repo, "in_process", "in_a", "in_b", LIMIT)
    with conch.Server(repo) as server:
        model = server.model("in_process")

        def one(i: int) -> float:
            [answer] = list(model.infer({"IN": np.array([float(i)], np.float32)}))
            return float(answer.outputs["OUT"][0])

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(8))) == [float(i) for i in range(8)]
    assert most_at_once(logs / "in_a") == LIMIT
    assert most_at_once(logs / "in_b") == LIMIT
