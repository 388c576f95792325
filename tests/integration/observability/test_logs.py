"""Logs on the real path: a worker, a gateway and a gRPC server, each writing JSON lines
(``--log-format json``) to its own ``--log-file``.

- A request's client id and conch's message id are on the lines about it in the
  gateway's log and in the worker's, the same conch id in both.
- Triton's logging extension: ``POST v2/logging`` on the gateway turns verbose lines on
  in the worker too; gRPC's LogSettings changes the gateway's settings; wrong values
  are refused with Triton's error body (HTTP 400, gRPC INVALID_ARGUMENT) and change
  nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness import fresh_db, start_gateway, start_grpc, start_worker, wait_model_ready, wait_until
from models import add_inputs, add_model, python_model

# A Python model that logs a warning (whatever the verbose level) as it executes. (Its test
# runs before the gRPC one, which turns warnings off for a while.)
TALKER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pb_utils.Logger.log_warn("talker executes")
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""


TALKER_CONFIG = (
    'backend: "python"\nmax_batch_size: 4\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
)


class Stack:
    def __init__(self, url: str, grpc_url: str, logs: dict[str, Path], repo: Path, db: str) -> None:
        self.url = url
        self.grpc_url = grpc_url
        self.logs = logs
        self.repo = repo
        self.db = db

    def lines(self, process: str) -> list[dict[str, Any]]:
        """Every line of ``process``'s log file, each a JSON object."""
        text = self.logs[process].read_text() if self.logs[process].exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def settings(self) -> dict[str, Any]:
        return requests.get(f"http://{self.url}/v2/logging", timeout=10).json()

    def post(self, body: Any) -> requests.Response:
        data = body if isinstance(body, str) else json.dumps(body)
        return requests.post(f"http://{self.url}/v2/logging", data=data, timeout=10)


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("logs")
    repo = root / "models"
    add_model(repo / "add")
    python_model(repo / "talker", TALKER_CONFIG, TALKER)
    db = fresh_db(redis_url, 9)
    logs = {name: root / f"{name}.log" for name in ("worker", "gateway", "grpc")}

    def flags(name: str) -> tuple[str, ...]:
        return ("--log-format", "json", "--log-file", str(logs[name]))

    worker = start_worker(repo, db, log_dir, *flags("worker"))
    gateway, url = start_gateway(repo, db, log_dir, *flags("gateway"))
    grpc, grpc_url = start_grpc(repo, db, log_dir, *flags("grpc"))
    try:
        for model in ("add", "talker"):
            wait_model_ready(url, model, 90, worker, gateway)
        yield Stack(url, grpc_url, logs, repo, db)
    finally:
        for service in (grpc, gateway, worker):
            service.stop()


def _infer(url: str, request_id: str) -> None:
    client = httpclient.InferenceServerClient(url)
    inputs = add_inputs(np.ones((1, 4), np.float32))
    try:
        assert client.infer("add", inputs, request_id=request_id).get_response()["id"] == request_id
    finally:
        client.close()


def _about(lines: list[dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    """The lines about ``request_id`` (alone, or in a batch)."""
    return [
        line
        for line in lines
        if line.get("request_id") == request_id
        or (isinstance(line.get("request_id"), list) and request_id in line["request_id"])
    ]


def _conch_ids(lines: list[dict[str, Any]], request_id: str) -> set[str]:
    out = set()
    for line in lines:
        ids, conch = line["request_id"], line["conch_id"]
        if isinstance(ids, list):
            out.add(conch[ids.index(request_id)])
        else:
            out.add(conch)
    return out - {""}


def test_verbose_lines_name_the_request_in_the_gateway_and_the_worker(stack: Stack) -> None:
    before = stack.settings()
    assert before["log_format"] == "json" and before["log_verbose_level"] == 0
    assert before["log_file"] == str(stack.logs["gateway"])
    _infer(stack.url, "quiet-1")  # verbose lines are off: nothing is written about it

    answer = stack.post({"log_verbose_level": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {**before, "log_verbose_level": 1}
    assert stack.settings()["log_verbose_level"] == 1

    # The worker hears of the change through Redis: once it has, each request it runs
    # has a verbose line naming it.
    tries = iter(range(1000))

    def worker_names_a_request() -> bool:
        request_id = f"loud-{next(tries)}"
        _infer(stack.url, request_id)
        time.sleep(0.2)
        return bool(_about(stack.lines("worker"), request_id))

    wait_until(worker_names_a_request, 30, "the worker's verbose lines")
    _infer(stack.url, "loud-checked")
    time.sleep(0.5)
    gateway, worker = (_about(stack.lines(p), "loud-checked") for p in ("gateway", "worker"))
    assert gateway and worker, (gateway, worker)
    assert all(line["level"] == "VERBOSE" for line in gateway + worker)
    # The same conch id on both sides: one message, from the gateway's queue to the worker.
    assert len(_conch_ids(gateway, "loud-checked")) == 1
    assert _conch_ids(gateway, "loud-checked") == _conch_ids(worker, "loud-checked")
    assert any("executing" in line["message"] for line in worker)
    assert not any(_about(stack.lines(p), "quiet-1") for p in ("gateway", "worker"))

    assert stack.post({"log_verbose_level": 0}).status_code == 200


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("not json", "failed to parse the request JSON buffer"),
        ([1], "must be a JSON object"),
        ({"log_verbose_level": -1}, "'log_verbose_level' must be an integer >= 0"),
        ({"log_info": "off"}, "'log_info' must be a boolean"),
        ({"log_format": "xml", "log_info": False}, "invalid log_format 'xml'"),
        ({"log_colour": True}, "unknown log setting 'log_colour'"),
        ({"log_file": "/tmp/elsewhere.log"}, "log_file cannot be changed"),
    ],
)
def test_a_wrong_setting_is_a_400_that_changes_nothing(stack: Stack, body: Any, error: str) -> None:
    before = stack.settings()
    answer = stack.post(body)
    assert answer.status_code == 400
    assert set(answer.json()) == {"error"} and error in answer.json()["error"]
    assert stack.settings() == before


def test_a_python_models_own_lines_name_the_request(stack: Stack) -> None:
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    client = httpclient.InferenceServerClient(stack.url)
    try:
        client.infer("talker", [x], request_id="py-1")
    finally:
        client.close()
    wait_until(
        lambda: bool(_about(stack.lines("worker"), "py-1")), 10, "the model's line about py-1"
    )
    (line,) = _about(stack.lines("worker"), "py-1")
    assert (line["level"], line["message"], line["file"]) == (
        "WARNING",
        "talker executes",
        "model.py",
    )
    assert line["conch_id"]


def test_a_worker_started_later_follows_the_apis_settings(
    stack: Stack, tmp_path: Path, log_dir: Path
) -> None:
    """The API's settings are kept in Redis: a worker that starts after the change (one
    the autoscaler adds) writes verbose lines though its flags say --log-verbose 0."""
    assert stack.post({"log_verbose_level": 1}).status_code == 200
    late_log = tmp_path / "late.log"
    late = start_worker(
        stack.repo,
        stack.db,
        log_dir,
        *("--log-verbose", "0", "--log-format", "json", "--log-file", str(late_log)),
    )
    try:

        def verbose() -> bool:
            text = late_log.read_text() if late_log.exists() else ""
            return any(json.loads(x)["level"] == "VERBOSE" for x in text.splitlines())

        wait_until(verbose, 30, "the late worker's verbose lines", late)
    finally:
        late.stop()
        assert stack.post({"log_verbose_level": 0}).status_code == 200


def test_grpc_log_settings_change_the_gateway_too(stack: Stack) -> None:
    client = grpcclient.InferenceServerClient(stack.grpc_url)
    try:
        got = client.get_log_settings(as_json=True)["settings"]
        assert got["log_format"] == {"string_param": "json"}
        assert got["log_file"] == {"string_param": str(stack.logs["grpc"])}
        changed = client.update_log_settings({"log_warning": False}, as_json=True)["settings"]
        assert changed["log_warning"] == {"bool_param": False}
        wait_until(lambda: not stack.settings()["log_warning"], 15, "the gateway to follow")
        with pytest.raises(InferenceServerException) as err:
            client.update_log_settings({"log_format": "xml"})
        assert "StatusCode.INVALID_ARGUMENT" in str(err.value.status())
        assert "invalid log_format 'xml'" in err.value.message()
        client.update_log_settings({"log_warning": True})
    finally:
        client.close()
    wait_until(lambda: stack.settings()["log_warning"], 15, "the gateway to follow back")
