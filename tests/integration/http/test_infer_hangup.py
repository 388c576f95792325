"""An HTTP infer call whose client hangs up while its request waits in the queue withdraws
the request (triton-inference-server/server#7077), as the generate extension's does.

One worker serves ``nap`` (one instance, dynamically batched: it sleeps the largest X of
its batch, then writes one line per execution, each request's X); two gateways carry the
calls, on gunicorn's gevent worker (conch's own connection loop) and on its gthread worker
(WSGI). A call keeps the instance busy; a second call waits in the queue behind it, and its
client closes its socket: the second never runs, the first and a later one are answered.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient

from conch.wire.work_owed import work_owed

from harness import (
    connect,
    fresh_db,
    start_gateway,
    start_worker,
    wait_model_ready,
    wait_until,
)
from models import python_model

NAP = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = json.loads(args["model_config"])["parameters"]["LOG"]["string_value"]

    def execute(self, requests):
        xs = [float(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().max()) for r in requests]
        time.sleep(max(xs))
        with open(self.log, "a") as f:
            f.write(" ".join(map(str, xs)) + "\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros((1, 1), np.float32))])
                for r in requests]
"""
BUSY_S = 2.5  # the first call's run: the second waits behind it all along


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("hangup")
    log = root / "executions.log"
    python_model(
        root / "models" / "nap",
        'backend: "python"\nmax_batch_size: 4\ndynamic_batching { }\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'parameters {{ key: "LOG" value: {{ string_value: "{log}" }} }}\n',
        NAP,
    )
    repo = root / "models"
    db = fresh_db(redis_url, 10)
    worker = start_worker(repo, db, log_dir, "--models", "nap")
    gevent_gw, gevent_url = start_gateway(repo, db, log_dir)
    wsgi_gw, wsgi_url = start_gateway(repo, db, log_dir, env={"CONCH_HTTP_WORKER_CLASS": "gthread"})
    try:
        for url in (gevent_url, wsgi_url):
            wait_model_ready(url, "nap", 90, worker, gevent_gw, wsgi_gw)
        yield {"gevent": gevent_url, "gthread": wsgi_url, "db": db, "log": str(log)}
    finally:
        gevent_gw.stop()
        wsgi_gw.stop()
        worker.stop()


def _infer(url: str, seconds: float) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), seconds, np.float32))
    client.infer("nap", [x])


def _counts(url: str) -> tuple[int, int]:
    stats = httpclient.InferenceServerClient(url).get_inference_statistics("nap")
    inference = stats["model_stats"][0]["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


def _owed(db: str) -> tuple[int, int]:
    """``nap``'s requests (waiting, taken by a worker and not yet answered)."""
    owed = work_owed(redis.Redis.from_url(db), ["nap"])["nap"]
    return owed.waiting, owed.in_flight


def _executions(log: str) -> list[list[float]]:
    path = Path(log)
    text = path.read_text() if path.exists() else ""
    return [[float(x) for x in line.split()] for line in text.splitlines()]


@pytest.mark.parametrize("server", ["gevent", "gthread"])
def test_a_queued_request_whose_client_hangs_up_never_runs(
    stack: dict[str, str], server: str
) -> None:
    url, db = stack[server], stack["db"]
    before, ran_before = _counts(url), len(_executions(stack["log"]))
    busy = threading.Thread(target=_infer, args=(url, BUSY_S))
    busy.start()
    wait_until(lambda: _owed(db) == (0, 1), 10, "the first taken by the worker")
    # The second call: JSON, on a socket of its own, its answer never read.
    body = json.dumps(
        {"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [0.75]}]}
    ).encode()
    sock = connect(url)
    sock.sendall(
        b"POST /v2/models/nap/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    wait_until(lambda: _owed(db) == (1, 1), 5, "the second call queued")
    sock.close()
    wait_until(lambda: _owed(db) == (0, 1), 2, "the second call withdrawn")
    assert busy.is_alive(), "the first still runs: no worker took the second"
    busy.join()
    _infer(url, 0.125)  # others are served as before
    ran = _executions(stack["log"])[ran_before:]
    assert ran == [[BUSY_S], [0.125]], ran  # the withdrawn one (0.75) never ran
    success, fail = _counts(url)
    assert (success - before[0], fail - before[1]) == (2, 1)  # it counts as cancelled
