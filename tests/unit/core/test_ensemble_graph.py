"""Ensembles' rules on configs: which steps a request needs, the batch dimension between
batching and non-batching models, and what a read repository completes (labels, the
transaction policy, load-time checks of mixed batching)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.backends.completion import complete
from conch.core import ensemble_graph
from conch.core.ensemble_graph import Step, fit_batch, needed
from conch.core.repository import ModelRepository

MODEL_PY = """
class TritonPythonModel:
    def execute(self, requests):
        return []
"""


def python_model(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(MODEL_PY)
    (root / name / "config.pbtxt").write_text(f'backend: "python"\n{config}\n')


def io(max_batch_size: int, inputs: str, outputs: str) -> str:
    return f"max_batch_size: {max_batch_size}\ninput [ {inputs} ]\noutput [ {outputs} ]"


def fp32(name: str, dims: str = "4", labels: str = "") -> str:
    extra = f'label_filename: "{labels}"' if labels else ""
    return f'{{ name: "{name}" data_type: TYPE_FP32 dims: [ {dims} ] {extra} }}'


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" {ins} {outs} }}'


def ensemble(root: Path, name: str, config: str, steps: list[str]) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(
        f'platform: "ensemble"\n{config}\nensemble_scheduling {{ step [ {", ".join(steps)} ] }}\n'
    )


def scan(root: Path) -> dict:
    return ModelRepository(root, complete=complete, gpu_count=0).scan()


# -- needed: the steps a request runs -----------------------------------------------------


def s(index: int, inputs: list[str], outputs: list[str]) -> Step:
    return Step(index, f"m{index}", -1, {t: t for t in inputs}, {t: t for t in outputs})


# A -> s0 -> t -> s1 -> OUT1 ; A -> s2 -> OUT2 ; t -> s3 -> OUT3
GRAPH = [s(0, ["A"], ["t"]), s(1, ["t"], ["OUT1"]), s(2, ["A"], ["OUT2"]), s(3, ["t"], ["OUT3"])]


@pytest.mark.parametrize(
    ("wanted", "run"),
    [
        (["OUT1", "OUT2", "OUT3"], [0, 1, 2, 3]),
        (["OUT2"], [2]),
        (["OUT1"], [0, 1]),
        (["OUT3", "OUT2"], [0, 2, 3]),
    ],
)
def test_only_the_steps_the_wanted_outputs_need_run(wanted: list[str], run: list[int]) -> None:
    assert [st.index for st in needed(GRAPH, wanted)] == run


def test_a_step_with_one_output_wanted_runs_for_all_of_them() -> None:
    graph = [s(0, ["A"], ["X", "Y"]), s(1, ["Y"], ["OUT"])]
    assert [st.index for st in needed(graph, ["X"])] == [0]
    assert [st.index for st in needed(graph, ["OUT"])] == [0, 1]


# -- fit_batch: Triton's batch dimension between steps -----------------------------------


@pytest.mark.parametrize(
    ("dims", "batching", "batch", "shape", "fitted"),
    [
        ([4], True, 0, (4,), (1, 4)),  # from a non-batching model: a batch of one is added
        ([4], True, 0, (2, 4), (2, 4)),  # already shaped as a batch: left as it is
        ([4], False, 1, (1, 4), (4,)),  # a batch of one into a non-batching model: dropped
        ([4], False, 3, (3, 4), (3, 4)),  # a larger batch cannot be dropped: the step judges
        ([-1, 4], False, 1, (1, 4), (1, 4)),  # the dims take the batched shape: kept
        ([4], True, 2, (2, 4), (2, 4)),  # both batch: nothing to do
        ([4], False, 0, (4,), (4,)),  # neither batches
    ],
)
def test_fit_batch(dims, batching, batch, shape, fitted) -> None:
    assert fit_batch(dims, batching, batch, shape) == fitted


# -- reading a repository: load-time checks and completion --------------------------------


def test_batching_and_non_batching_steps_mix(tmp_path: Path) -> None:
    python_model(tmp_path, "flat", io(0, fp32("X"), fp32("Y")))
    python_model(tmp_path, "batched", io(8, fp32("X"), fp32("Y")))
    python_model(tmp_path, "small", io(2, fp32("X"), fp32("Y")))
    ensemble(
        tmp_path,
        "mixed",
        io(8, fp32("IN"), fp32("OUT")),
        [step("flat", {"X": "IN"}, {"Y": "t"}), step("batched", {"X": "t"}, {"Y": "OUT"})],
    )
    ensemble(
        tmp_path,
        "unbatched",
        io(0, fp32("IN"), fp32("OUT")),
        [step("batched", {"X": "IN"}, {"Y": "t"}), step("flat", {"X": "t"}, {"Y": "OUT"})],
    )
    ensemble(
        tmp_path,
        "too_big",
        io(8, fp32("IN"), fp32("OUT")),
        [step("small", {"X": "IN"}, {"Y": "OUT"})],
    )
    ensemble(
        tmp_path,
        "wrong_dims",
        io(8, fp32("IN"), fp32("OUT", "5")),
        [step("flat", {"X": "IN"}, {"Y": "OUT"})],
    )
    entries = scan(tmp_path)
    assert entries["mixed"].error is None
    assert entries["unbatched"].error is None
    assert "max_batch_size 8 but step 0 ('small') batches at most 2" in entries["too_big"].error
    assert "declared FP32 [-1, 5]" in entries["wrong_dims"].error


def test_outputs_take_their_step_models_labels(tmp_path: Path) -> None:
    python_model(
        tmp_path,
        "scorer",
        io(8, fp32("X"), f"{fp32('P', labels='labels.txt')}, {fp32('Q')}"),
    )
    (tmp_path / "scorer" / "labels.txt").write_text("a\nb\nc\nd\n")
    ensemble(
        tmp_path,
        "inner",
        io(8, fp32("IN"), f"{fp32('P')}, {fp32('Q')}"),
        [step("scorer", {"X": "IN"}, {"P": "P", "Q": "Q"})],
    )
    # Outer reaches scorer's labels through inner; OWN keeps the ensemble's own file.
    ensemble(
        tmp_path,
        "outer",
        io(8, fp32("IN"), f"{fp32('P2')}, {fp32('OWN', labels='own.txt')}"),
        [step("inner", {"IN": "IN"}, {"P": "P2", "Q": "OWN"})],
    )
    (tmp_path / "outer" / "own.txt").write_text("w\nx\ny\nz\n")
    entries = scan(tmp_path)
    assert entries["inner"].error is None and entries["outer"].error is None
    assert entries["inner"].labels() == {"P": ["a", "b", "c", "d"]}
    assert entries["outer"].labels() == {"P2": ["a", "b", "c", "d"], "OWN": ["w", "x", "y", "z"]}


def test_an_ensemble_reports_its_transaction_policy(tmp_path: Path) -> None:
    python_model(tmp_path, "m", io(8, fp32("X"), fp32("Y")))
    ensemble(tmp_path, "e", io(8, fp32("X"), fp32("Y")), [step("m", {"X": "X"}, {"Y": "Y"})])
    cfg = scan(tmp_path)["e"].to_json()
    assert cfg["model_transaction_policy"] == {"decoupled": False}
    assert "instance_group" not in cfg or not cfg["instance_group"]


def test_a_broken_inner_ensemble_breaks_the_outer_one_whatever_the_order(tmp_path: Path) -> None:
    python_model(tmp_path, "m", io(8, fp32("X"), fp32("Y")))
    # "a_outer" sorts before "b_inner": the inner one is still checked first.
    ensemble(tmp_path, "b_inner", io(8, fp32("X"), fp32("Y")), [step("m", {"X": "X"}, {})])
    ensemble(
        tmp_path, "a_outer", io(8, fp32("X"), fp32("Y")), [step("b_inner", {"X": "X"}, {"Y": "Y"})]
    )
    entries = scan(tmp_path)
    assert "output 'Y' is produced by no step" in entries["b_inner"].error
    assert "model 'b_inner' is unavailable" in entries["a_outer"].error


def test_link_is_what_an_on_demand_reader_uses_too(tmp_path: Path) -> None:
    python_model(tmp_path, "m", io(0, fp32("X"), fp32("Y")))
    ensemble(tmp_path, "e", io(8, fp32("X"), fp32("Y")), [step("m", {"X": "X"}, {"Y": "Y"})])
    repo = ModelRepository(tmp_path, complete=complete, gpu_count=0)
    entry = repo.read_model("e")
    ensemble_graph.link(entry, {"m": repo.read_model("m")})
    assert entry.error is None
    assert entry.config.HasField("model_transaction_policy")
