"""Model control as Triton has it: explicit load/unload and the index through the stock
tritonclient, and poll mode following a repository folder with no failed request."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness import fresh_db, start_gateway, start_worker, wait_model_ready, wait_until
from models import add_model, offset_model


@contextlib.contextmanager
def explicit_stack(repo: Path, db: str, log_dir: Path, *flags: str) -> Iterator[str]:
    """A worker and a gateway in explicit mode; yields the gateway's address."""
    flags = ("--model-control-mode", "explicit", *flags)
    worker = start_worker(repo, db, log_dir, *flags)
    gateway, url = start_gateway(repo, db, log_dir, *flags)
    try:
        wait_until(lambda: httpclient.InferenceServerClient(url).is_server_ready(), 60, "gateway")
        yield url
    finally:
        gateway.stop()
        worker.stop()


def x_input(value: float = 1.0) -> list[httpclient.InferInput]:
    i = httpclient.InferInput("X", [1, 4], "FP32")
    i.set_data_from_numpy(np.full((1, 4), value, np.float32))
    return [i]


def test_explicit_load_unload_and_index(tmp_path: Path, redis_url: str, log_dir: Path) -> None:
    repo = tmp_path / "models"
    offset_model(repo / "offset", 1, 1.0)
    add_model(repo / "add")
    db = fresh_db(redis_url, 4)
    flags = (
        "--model-control-mode",
        "explicit",
        "--load-model",
        "add",
        "--repository-poll-secs",
        "0.5",
    )
    worker = start_worker(repo, db, log_dir, *flags)
    gateway, url = start_gateway(repo, db, log_dir, *flags, "--allow-model-upload")
    client = httpclient.InferenceServerClient(url)
    try:
        wait_model_ready(url, "add", 60, worker, gateway)
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["add"]["state"] == "READY"
        assert index["offset"] == {"name": "offset", "state": "UNAVAILABLE", "reason": "unloaded"}
        ready_only = requests.post(
            f"http://{url}/v2/repository/index", json={"ready": True}, timeout=10
        ).json()
        assert [m["name"] for m in ready_only] == ["add"]  # {"ready": true}: only what serves
        # A body nested past Triton's depth limit is a 400, not a crash; a 'ready' nested
        # that deep is no boolean, in Triton's words (its L0_http test, 250,000 deep).
        r = requests.post(
            f"http://{url}/v2/repository/index", data=b"[" * 100_000 + b"]" * 100_000, timeout=10
        )
        assert r.status_code == 400, r.text
        assert "JSON nesting depth exceeds maximum allowed limit (100)" in r.json()["error"]
        for depth in (150, 250_000):
            deep = b'{"ready":' + b"[" * depth + b"true" + b"]" * depth + b"}"
            r = requests.post(f"http://{url}/v2/repository/index", data=deep, timeout=60)
            assert r.status_code == 400, r.text
            assert "Invalid value for 'ready': expected a boolean" in r.json()["error"]
        assert requests.get(f"http://{url}/v2/health/live", timeout=10).status_code == 200
        # A body that is JSON but no object (null, a number, a string) is a 400 too.
        for scalar in (b"null", b"3", b'"add"', b"true"):
            for route in ("index", "models/add/load", "models/add/unload"):
                r = requests.post(f"http://{url}/v2/repository/{route}", data=scalar, timeout=10)
                assert r.status_code == 400 and "JSON object" in r.json()["error"], (route, r.text)
        # Their flags are booleans, as in Triton: anything else is a 400, not taken as truthy.
        r = requests.post(f"http://{url}/v2/repository/index", json={"ready": 1}, timeout=10)
        assert r.status_code == 400, r.text
        assert "Invalid value for 'ready': expected a boolean" in r.json()["error"]
        r = requests.post(
            f"http://{url}/v2/repository/models/add/unload",
            json={"parameters": {"unload_dependents": "yes"}},
            timeout=10,
        )
        assert r.status_code == 400 and "'unload_dependents'" in r.text, r.text
        assert client.is_model_ready("add")  # refused before anything was unloaded
        with pytest.raises(InferenceServerException, match="no available versions"):
            client.infer("offset", x_input())

        client.load_model("offset")  # returns once a worker has it loaded
        assert client.is_model_ready("offset")
        np.testing.assert_array_equal(
            client.infer("offset", x_input(1.0)).as_numpy("Y"), np.full((1, 4), 2.0)
        )

        # A load with a config override: the same model, now without batching.
        config = json.dumps(
            {
                "name": "offset",
                "platform": "onnxruntime_onnx",
                "max_batch_size": 0,
                "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1, 4]}],
                "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1, 4]}],
            }
        )
        client.load_model("offset", config=config)
        assert client.get_model_config("offset")["max_batch_size"] == 0
        np.testing.assert_array_equal(
            client.infer("offset", x_input(1.0)).as_numpy("Y"), np.full((1, 4), 2.0)
        )

        # A model that exists only in its load request: config plus file: overrides.
        new_config = json.dumps(
            {
                "name": "fresh",
                "platform": "onnxruntime_onnx",
                "max_batch_size": 8,
                "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}],
            }
        )
        onnx_bytes = (repo / "offset" / "1" / "model.onnx").read_bytes()
        client.load_model("fresh", config=new_config, files={"file:1/model.onnx": onnx_bytes})
        np.testing.assert_array_equal(
            client.infer("fresh", x_input(5.0)).as_numpy("Y"), np.full((1, 4), 6.0)
        )
        assert not (repo / "fresh").exists()  # nothing was written into the repository
        # A leading "/" is dropped, as Triton does; what it leads to is checked the same.
        client.load_model("fresh", config=new_config, files={"file:/1/model.onnx": onnx_bytes})
        np.testing.assert_array_equal(
            client.infer("fresh", x_input(1.0)).as_numpy("Y"), np.full((1, 4), 2.0)
        )
        for bad in (
            "file:1/../../evil.onnx",
            "file:../x",
            "file:model.onnx",
            "file:1/a\\b",
            "file:/../1/x",
        ):
            with pytest.raises(InferenceServerException, match="fresh"):
                client.load_model("fresh", config=new_config, files={bad: b"x"})
        with pytest.raises(InferenceServerException, match="config"):
            client.load_model("fresh", files={"file:1/model.onnx": onnx_bytes})

        client.unload_model("offset")
        assert not client.is_model_ready("offset")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["offset"]["state"] == "UNAVAILABLE"
        with pytest.raises(InferenceServerException):
            client.infer("offset", x_input())
        # Unknown models and bad configs are clear 400s.
        with pytest.raises(InferenceServerException, match="not in the model repository"):
            client.load_model("nope")
        with pytest.raises(InferenceServerException, match="offset"):
            client.load_model("offset", config="{not json")
    finally:
        gateway.stop()
        worker.stop()


def test_load_is_refused_without_explicit_mode(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    repo = tmp_path / "models"
    add_model(repo / "add")
    gateway, url = start_gateway(repo, fresh_db(redis_url, 5), log_dir)
    try:
        with pytest.raises(InferenceServerException, match="explicit"):
            httpclient.InferenceServerClient(url).load_model("add")
    finally:
        gateway.stop()


def test_poll_mode_switches_versions_with_no_failed_request(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    repo = tmp_path / "models"
    offset_model(repo / "offset", 1, 1.0)
    db = fresh_db(redis_url, 3)
    flags = ("--model-control-mode", "poll", "--repository-poll-secs", "0.5")
    worker = start_worker(repo, db, log_dir, *flags)
    gateway, url = start_gateway(repo, db, log_dir, *flags)
    answers: list[tuple[str, float]] = []
    failures: list[str] = []
    stop = threading.Event()

    def stream() -> None:
        client = httpclient.InferenceServerClient(url)
        while not stop.is_set():
            try:
                r = client.infer("offset", x_input(1.0))
                answers.append((r.get_response()["model_version"], float(r.as_numpy("Y")[0, 0])))
            except Exception as exc:
                failures.append(str(exc))

    try:
        wait_model_ready(url, "offset", 60, worker, gateway)
        threads = [threading.Thread(target=stream) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        # Version 2 lands as a whole folder (as repo_sync renames one into place).
        staging = tmp_path / "staging"
        offset_model(staging, 2, 2.0)
        (staging / "2").rename(repo / "offset" / "2")
        started = time.monotonic()
        wait_until(
            lambda: any(v == "2" for v, _ in answers[-5:]),
            30,
            "version 2 to serve",
            worker,
            gateway,
        )
        took = time.monotonic() - started
        time.sleep(0.5)
        # A broken version 3 (no model file) leaves version 2 serving, with the reason.
        (repo / "offset" / "3").mkdir()
        wait_until(
            lambda: (
                "3"
                in json.dumps(httpclient.InferenceServerClient(url).get_model_repository_index())
            ),
            10,
            "the index to mention version 3",
        )
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(10)
    finally:
        stop.set()
        gateway.stop()
        worker.stop()
    assert not failures, failures[:3]
    assert took < 2 * 0.5 + 3, f"version 2 took {took:.1f} s to serve"
    # Every answer came from version 1 (X+1) or version 2 (X+2), and says which.
    assert {(v, y) for v, y in answers} <= {("1", 2.0), ("2", 3.0)}
    assert answers[-1] == ("2", 3.0)


def test_a_model_removed_in_poll_mode_is_unloaded_once(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    repo = tmp_path / "models"
    offset_model(repo / "gone", 1, 1.0)
    offset_model(repo / "stays", 1, 1.0)
    db = fresh_db(redis_url, 3)
    worker = start_worker(
        repo, db, log_dir, "--model-control-mode", "poll", "--repository-poll-secs", "0.3"
    )
    try:
        wait_until(lambda: "model 'gone'" in worker.log(), 60, "gone to load", worker)
        shutil.rmtree(repo / "gone")
        wait_until(lambda: "model 'gone' unloaded" in worker.log(), 30, "gone to unload", worker)
        time.sleep(1.5)  # five more polls that no longer find it
        assert worker.log().count("model 'gone' unloaded") == 1
    finally:
        worker.stop()


CONTROLLER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 1, 4 ] },
  { name: "READY_AFTER" data_type: TYPE_BOOL dims: [ 1 ] },
  { name: "ERR" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

# Loads "offset", calls it, unloads it, then asks for a model that does not exist.
CONTROLLER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            pb_utils.load_model("offset")
            answer = pb_utils.InferenceRequest(
                model_name="offset", inputs=[pb_utils.Tensor("X", x)], requested_output_names=["Y"]
            ).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            y = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()
            pb_utils.unload_model("offset")
            ready = pb_utils.is_model_ready("offset")
            try:
                pb_utils.load_model("nope")
                err = "loaded"
            except pb_utils.TritonModelException as exc:
                err = str(exc)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("Y", y),
                        pb_utils.Tensor("READY_AFTER", np.array([ready])),
                        pb_utils.Tensor("ERR", np.array([err.encode()], dtype=object)),
                    ]
                )
            )
        return responses
"""


def test_a_python_model_loads_and_unloads_models(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    repo = tmp_path / "models"
    offset_model(repo / "offset", 1, 1.0)
    (repo / "controller" / "1").mkdir(parents=True)
    (repo / "controller" / "config.pbtxt").write_text(CONTROLLER_CONFIG)
    (repo / "controller" / "1" / "model.py").write_text(CONTROLLER_MODEL)
    with explicit_stack(repo, fresh_db(redis_url, 8), log_dir, "--load-model", "controller") as url:
        client = httpclient.InferenceServerClient(url, network_timeout=120)
        wait_model_ready(url, "controller", 60)
        assert not client.is_model_ready("offset")
        result = client.infer("controller", x_input(2.0))
        np.testing.assert_array_equal(result.as_numpy("Y"), np.full((1, 4), 3.0))
        assert result.as_numpy("READY_AFTER").tolist() == [False]
        err = result.as_numpy("ERR")[0].decode()
        assert "nope" in err and "not in the model repository" in err, err
        assert not client.is_model_ready("offset")  # unloaded for the whole server
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["offset"]["state"] == "UNAVAILABLE"


ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "offset" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" }
} ] }
"""


def test_an_ensemble_loads_its_steps_and_unloads_them_when_asked(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    repo = tmp_path / "models"
    offset_model(repo / "offset", 1, 1.0)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    with explicit_stack(repo, fresh_db(redis_url, 6), log_dir) as url:
        client = httpclient.InferenceServerClient(url)
        assert not client.is_model_ready("offset")
        client.load_model("ens")  # as Triton: the ensemble's composing models load first
        assert client.is_model_ready("offset") and client.is_model_ready("ens")
        np.testing.assert_array_equal(
            client.infer("ens", x_input(2.0)).as_numpy("Y"), np.full((1, 4), 3.0)
        )
        client.unload_model("ens")  # its step stays
        assert not client.is_model_ready("ens") and client.is_model_ready("offset")
        with pytest.raises(InferenceServerException, match="no available versions"):
            client.infer("ens", x_input(2.0))
        client.load_model("ens")  # loaded again, it serves again
        assert client.is_model_ready("ens")
        np.testing.assert_array_equal(
            client.infer("ens", x_input(4.0)).as_numpy("Y"), np.full((1, 4), 5.0)
        )
        client.unload_model("ens", unload_dependents=True)  # and now its step goes too
        assert not client.is_model_ready("ens") and not client.is_model_ready("offset")


def test_a_load_is_answered_by_a_worker_that_starts_after_it(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    # The load command goes out while no worker listens; the worker that comes later
    # picks the model up from Redis and answers that very load.
    repo = tmp_path / "models"
    offset_model(repo / "offset", 1, 1.0)
    db = fresh_db(redis_url, 7)
    flags = ("--model-control-mode", "explicit")
    gateway, url = start_gateway(repo, db, log_dir, *flags)
    worker = None
    outcome: list[object] = []
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    try:
        wait_until(lambda: client.is_server_ready(), 60, "the gateway")

        def load() -> None:  # a client of its own: tritonclient's stay in their thread
            try:
                httpclient.InferenceServerClient(url, network_timeout=120).load_model("offset")
                outcome.append("loaded")
            except Exception as exc:
                outcome.append(exc)

        loading = threading.Thread(target=load)
        loading.start()
        time.sleep(1.0)
        assert not outcome  # still waiting: nobody can load it yet
        worker = start_worker(repo, db, log_dir, *flags)
        loading.join(110)
        assert outcome == ["loaded"], outcome
        np.testing.assert_array_equal(
            client.infer("offset", x_input(1.0)).as_numpy("Y"), np.full((1, 4), 2.0)
        )
    finally:
        gateway.stop()
        if worker is not None:
            worker.stop()
