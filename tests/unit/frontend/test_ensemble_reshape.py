"""The ensemble runner hands each step its inputs in the shape the step declares, and
the ensemble's outputs back in their ``dims``, as Triton's ensemble scheduler does with
an ensemble's ``reshape`` and between batching and non-batching steps (issue 29 point 4)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conch.core import ensemble_run
from conch.core.ensemble_graph import Step, Tensor
from conch.core.model_config import parse_config

ENSEMBLE = """
max_batch_size: {batch}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 8 ] reshape: {{ shape: [ 4, 1, 2 ] }} }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 8 ] reshape: {{ shape: [ 4, 1, 2 ] }} }} ]
ensemble_scheduling {{ step [ {{ model_name: "step" model_version: -1
  input_map {{ key: "X" value: "IN" }} output_map {{ key: "Y" value: "OUT" }} }} ] }}
"""
STEP = """
max_batch_size: {batch}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4, 1, 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4, 1, 2 ] }} ]
"""


class Echo:
    """A step that answers its input as its output."""

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.tensors = tensors

    def wait(self) -> dict[str, Tensor]:
        return {"Y": self.tensors["X"]}

    def cancel(self) -> None:
        pass


@pytest.mark.parametrize(
    ("ensemble_batch", "step_batch", "sent", "step_gets", "answer"),
    [
        (8, 8, (3, 8), (3, 4, 1, 2), (3, 8)),  # both batch: the reshape behind the batch
        (8, 0, (1, 8), (4, 1, 2), (1, 8)),  # a batch of one dropped, and added back
        (0, 8, (8,), (1, 4, 1, 2), (8,)),  # a batch of one added, and dropped again
        (0, 0, (8,), (4, 1, 2), (8,)),  # neither batches
    ],
)
def test_steps_get_their_shape_and_the_caller_the_ensembles(
    ensemble_batch: int, step_batch: int, sent, step_gets, answer
) -> None:
    cfg = parse_config(ENSEMBLE.format(batch=ensemble_batch), model="ens", source="test")
    step_cfg = parse_config(STEP.format(batch=step_batch), model="step", source="test")
    seen: list[tuple[int, ...]] = []

    def start(step: Step, tensors: dict[str, Tensor], outputs: list[str]) -> Echo:
        seen.append(tensors["X"][1])
        return Echo(tensors)

    raw = bytes(4 * 8)
    entry = SimpleNamespace(name="ens", config=cfg)
    result = ensemble_run.run(
        entry, {"IN": ("FP32", sent, raw)}, ["OUT"], start, lambda s: step_cfg
    )
    assert seen == [step_gets]
    assert result == {"OUT": ("FP32", answer, raw)}
