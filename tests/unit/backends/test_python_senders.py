"""A Python model's requests as its execute gets them: a model that is not decoupled gets
its response sender when it first asks, and one asked for after execute returned is
closed, as Triton's is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conch.backends.base import BackendRequest
from conch.backends.python import pb_utils as pb
from conch.backends.python.backend import PythonBackend
from conch.core.errors import ConchError
from conch.core.model_config import parse_config
from conch.core.model_spec import InstanceSpec, ModelSpec

CONFIG = (
    'backend: "python" max_batch_size: 8\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
)

# Answers each request as its mode says, and keeps the requests for the test to use later.
MODEL = """
import triton_python_backend_utils as pb_utils

KEPT = []


class TritonPythonModel:
    def execute(self, requests):
        KEPT[:] = requests
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            x += 1  # a request's input is the model's to change, as under Triton
            response = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)])
            mode = r.parameters()
            if "send" in mode:
                sender = r.get_response_sender()
                assert sender is r.get_response_sender() and not r.is_cancelled()
                sender.send(response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                out.append(None)
            elif "nothing" in mode:
                out.append(None)
            else:
                out.append(response)
        return out
"""


@pytest.fixture
def backend(tmp_path: Path) -> PythonBackend:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text(MODEL)
    config = parse_config(CONFIG, model="m", source="test")
    b = PythonBackend(ModelSpec("m", 1, tmp_path, config), InstanceSpec("m_0", "CPU"))
    b.load()
    yield b
    b.unload()


def _request(mode: str) -> BackendRequest:
    x = np.arange(2, dtype=np.float32)[None]
    return BackendRequest({"X": x}, ["Y"], parameters={mode: True} if mode else {})


def _kept(backend: PythonBackend) -> list[pb.InferenceRequest]:
    return backend._module.KEPT  # type: ignore[union-attr]


def test_a_model_that_returns_its_responses_makes_no_sender(backend: PythonBackend) -> None:
    results = backend.execute([_request(""), _request("")])
    for result in results:
        assert not isinstance(result, ConchError)
        np.testing.assert_array_equal(result["Y"], [[1, 2]])
    assert all(r._sender is None for r in _kept(backend))


def test_a_sender_asked_for_after_execute_returned_is_closed(backend: PythonBackend) -> None:
    backend.execute([_request(""), _request("nothing")])
    answered, unanswered = _kept(backend)
    response = pb.InferenceResponse([])
    final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    # As the sender made at once: its one response counted, then closed.
    with pytest.raises(pb.TritonModelException, match="more than one response"):
        answered.get_response_sender().send(response, final)
    with pytest.raises(pb.TritonModelException, match="has been closed"):
        answered.get_response_sender().send(None, final)
    with pytest.raises(pb.TritonModelException, match="has been closed"):
        unanswered.get_response_sender().send(response, final)


def test_responses_sent_with_a_sender_answer_and_a_missing_one_fails(
    backend: PythonBackend,
) -> None:
    sent, missing = backend.execute([_request("send"), _request("nothing")])
    assert not isinstance(sent, ConchError)
    np.testing.assert_array_equal(sent["Y"], [[1, 2]])
    assert isinstance(missing, ConchError) and "no response for request 1" in missing.message
