"""Config fields conch does not honour, through the real path: a model that asks for one it
cannot do without is unavailable with the reason while the others serve; one it can safely
ignore serves, and the worker's log names the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness import fresh_db, serving
from models import add_inputs, add_model

PYTHON_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
"""
PYTHON_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[tuple[str, object]]:
    repo = tmp_path_factory.mktemp("unsupported_repo")
    add_model(repo / "plain")
    add_model(
        repo / "passive", extra="instance_group [ { count: 1 kind: KIND_CPU passive: true } ]"
    )
    add_model(
        repo / "cpu_accel",
        extra='optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "dnnl" } ] } }',
    )
    py = repo / "py_env"
    (py / "1").mkdir(parents=True)
    (py / "1" / "model.py").write_text(PYTHON_MODEL)
    (py / "config.pbtxt").write_text(PYTHON_CONFIG)
    with serving(repo, fresh_db(redis_url, 13), log_dir, ("plain", "passive")) as (url, worker, _):
        yield url, worker


def _add(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    return client.infer(model, add_inputs(a)).as_numpy("OUT")


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("cpu_accel", "optimization.execution_accelerators.cpu_execution_accelerator"),
        ("py_env", "parameters.EXECUTION_ENV_PATH"),
    ],
)
def test_a_model_that_needs_an_unsupported_field_is_unavailable_with_the_reason(
    server, model: str, field: str
) -> None:
    url, _ = server
    client = httpclient.InferenceServerClient(url)
    row = {r["name"]: r for r in client.get_model_repository_index()}[model]
    assert row["state"] == "UNAVAILABLE"
    assert f"field {field} is not supported" in row["reason"], row
    assert not client.is_model_ready(model)
    if model != "py_env":
        with pytest.raises(InferenceServerException) as info:
            _add(client, model)
        # As in Triton, a model whose load failed is an unknown model to infer (400).
        assert info.value.status() == "400", info.value.message()
        assert f"field {field} is not supported" in info.value.message()


def test_the_others_serve(server) -> None:
    url, _ = server
    np.testing.assert_array_equal(
        _add(httpclient.InferenceServerClient(url), "plain"),
        2 * np.arange(4, dtype=np.float32).reshape(1, 4),
    )


def test_a_harmless_field_serves_and_the_log_names_it(server) -> None:
    url, worker = server
    client = httpclient.InferenceServerClient(url)
    assert client.is_model_ready("passive")
    np.testing.assert_array_equal(
        _add(client, "passive"), 2 * np.arange(4, dtype=np.float32).reshape(1, 4)
    )
    assert "model 'passive'" in worker.log() and "field instance_group.passive is ignored" in (
        worker.log()
    )
