"""A model whose framework is an extra that is not installed fails to load with the
command that installs it (issue 41, point 1).

``make serve`` installs only what ``functions/`` needs, so the first model of another
framework a user serves meets a missing package. Here a real worker runs with OpenVINO and
LightGBM made unimportable (a folder first on its ``PYTHONPATH`` whose packages of those
names raise ``ImportError``, as a venv without the extra would), while the gateway and the
test have them. Each model's entry in Triton's repository index is ``UNAVAILABLE`` with a
reason that names the package and the exact command, and a model that needs no extra beside
them serves as usual.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import requests
from openvino_models import mlp_ir
from tree_models import lightgbm_model

from conch.core.extras import install_command
from conch.devtools.redis_server import free_port

from harness import start_gateway, start_redis, start_worker, wait_model_ready, wait_until
from models import add_model

OPENVINO_CONFIG = """
backend: "openvino"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def _blocker(folder: Path, *packages: str) -> Path:
    """A folder whose packages of these names fail to import, as uninstalled ones do."""
    for name in packages:
        pkg = folder / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\")\n"
        )
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("missing_extras")
    repo = tmp / "repo"
    add_model(repo / "add")
    (repo / "ov" / "1").mkdir(parents=True)
    mlp_ir(repo / "ov" / "1")
    (repo / "ov" / "config.pbtxt").write_text(OPENVINO_CONFIG)
    lightgbm_model(repo, "trees")
    blocked = _blocker(tmp / "blocked", "openvino", "lightgbm")
    redis_svc, redis_url = start_redis(tmp)
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(blocked), os.environ.get("PYTHONPATH")]))
    }
    worker = start_worker(repo, redis_url, tmp, env=env)
    gateway, url = start_gateway(repo, redis_url, tmp, metrics_port=free_port())
    try:
        wait_model_ready(url, "add", 90, worker, gateway)
        yield url, worker, gateway
    finally:
        for svc in (gateway, worker, redis_svc):
            svc.stop()


def _index(url: str) -> dict[str, dict]:
    answer = requests.post(f"http://{url}/v2/repository/index", data="{}", timeout=10)
    answer.raise_for_status()
    return {entry["name"]: entry for entry in json.loads(answer.text)}


@pytest.mark.parametrize(
    ("model", "package", "extra"), [("ov", "openvino", "openvino"), ("trees", "lightgbm", "fil")]
)
def test_a_model_that_needs_a_missing_extra_names_the_command(
    served: tuple, model: str, package: str, extra: str
) -> None:
    url, worker, gateway = served
    wait_until(
        lambda: _index(url)[model].get("state") == "UNAVAILABLE",
        90,
        f"{model} to fail its load",
        worker,
        gateway,
    )
    reason = _index(url)[model]["reason"]
    assert package in reason
    assert install_command(extra) in reason
    assert requests.get(f"http://{url}/v2/models/{model}/ready", timeout=10).status_code != 200


def test_a_model_that_needs_no_extra_serves_beside_them(served: tuple) -> None:
    url, _, _ = served
    two = {"datatype": "FP32", "shape": [1, 4], "data": [1.5, -2.0, 0.0, 4.0]}
    body = {"inputs": [{"name": "A", **two}, {"name": "B", **two}]}
    answer = requests.post(f"http://{url}/v2/models/add/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [3.0, -4.0, 0.0, 8.0]
