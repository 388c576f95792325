"""Ensembles' rules on configs: which steps a request needs, the batch dimension between
batching and non-batching models, and what a read repository completes (labels, the
transaction policy, load-time checks of mixed batching)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.backends.completion import complete
from conch.core import ensemble_graph
from conch.core.ensemble_graph import Step, fit_batch, needed
from conch.core.model_config import parse_config
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
    assert (
        "tensor 'OUT' is FP32 [-1, 5] as the ensemble's output but FP32 [4] as output 'Y' "
        "of step 0 ('flat')" in entries["wrong_dims"].error
    )


# -- reshape: the ensemble's inputs and outputs inside its graph (Triton's L0_infer_reshape) --


def with_reshape(name: str, dims: str, reshape: str) -> str:
    return (
        f'{{ name: "{name}" data_type: TYPE_FP32 dims: [ {dims} ] '
        f"reshape: {{ shape: [ {reshape} ] }} }}"
    )


def test_an_ensembles_reshape_is_what_its_steps_are_checked_against(tmp_path: Path) -> None:
    """As gen_qa_reshape_models.py builds them for test_ff2-ff4: the ensemble's tensors
    have their ``reshape`` inside the graph, a step's have its model's ``dims``, and
    batching and non-batching models mix (full shapes, with the batch dimension)."""
    python_model(tmp_path, "nop_412", io(8, fp32("X", "4, 1, 2"), fp32("Y", "4, 1, 2")))
    python_model(tmp_path, "nop_16", io(8, fp32("X", "16"), fp32("Y", "16")))
    python_model(tmp_path, "flat_16", io(0, fp32("X", "-1, 16"), fp32("Y", "-1, 16")))
    # The step's own reshape is its own business: the ensemble hands it its dims.
    python_model(tmp_path, "tunnel_in", io(8, with_reshape("X", "3, 2, 2", "12"), fp32("Y", "12")))
    # ff2's simple_reshape: INPUT1 [8] reshaped to [4, 1, 2], the step's dims.
    ensemble(
        tmp_path,
        "ff2",
        io(8, with_reshape("IN", "8", "4, 1, 2"), with_reshape("OUT", "8", "4, 1, 2")),
        [step("nop_412", {"X": "IN"}, {"Y": "OUT"})],
    )
    # ff3's *_nobatch: a non-batching ensemble over a batching step, by reshape.
    ensemble(
        tmp_path,
        "ff3_nobatch",
        io(0, with_reshape("IN", "4, 4", "16"), with_reshape("OUT", "4, 4", "16")),
        [step("nop_16", {"X": "IN"}, {"Y": "OUT"})],
    )
    # A batching ensemble through a batching step, then a non-batching one.
    ensemble(
        tmp_path,
        "mixed",
        io(8, with_reshape("IN", "4, 4", "16"), with_reshape("OUT", "4, 4", "16")),
        [step("nop_16", {"X": "IN"}, {"Y": "t"}), step("flat_16", {"X": "t"}, {"Y": "OUT"})],
    )
    ensemble(
        tmp_path,
        "tunnel",
        io(8, with_reshape("IN", "2, 2, 3", "3, 2, 2"), fp32("OUT", "12")),
        [step("tunnel_in", {"X": "IN"}, {"Y": "OUT"})],
    )
    # Refused as Triton refuses them.
    ensemble(  # no reshape: [8] is not [4, 1, 2]
        tmp_path,
        "no_reshape",
        io(8, fp32("IN", "8"), fp32("OUT", "4, 1, 2")),
        [step("nop_412", {"X": "IN"}, {"Y": "OUT"})],
    )
    ensemble(  # an output is checked by its reshape, not its dims
        tmp_path,
        "output_by_dims",
        io(8, with_reshape("IN", "8", "4, 1, 2"), with_reshape("OUT", "4, 1, 2", "8")),
        [step("nop_412", {"X": "IN"}, {"Y": "OUT"})],
    )
    ensemble(  # the step's reshape is not its dims
        tmp_path,
        "step_reshape",
        io(8, fp32("IN", "12"), fp32("OUT", "12")),
        [step("tunnel_in", {"X": "IN"}, {"Y": "OUT"})],
    )
    entries = scan(tmp_path)
    for name in ("ff2", "ff3_nobatch", "mixed", "tunnel"):
        assert entries[name].error is None, entries[name].error
    assert entries["no_reshape"].error == (
        "ensemble 'no_reshape': tensor 'IN' is FP32 [-1, 8] as the ensemble's input but "
        "FP32 [-1, 4, 1, 2] as input 'X' of step 0 ('nop_412')"
    )
    assert entries["output_by_dims"].error == (
        "ensemble 'output_by_dims': tensor 'OUT' is FP32 [-1, 8] as the ensemble's output "
        "(its reshape) but FP32 [-1, 4, 1, 2] as output 'Y' of step 0 ('nop_412')"
    )
    assert entries["step_reshape"].error == (
        "ensemble 'step_reshape': tensor 'IN' is FP32 [-1, 12] as the ensemble's input but "
        "FP32 [-1, 3, 2, 2] as input 'X' of step 0 ('tunnel_in')"
    )


def test_a_tensor_is_checked_against_the_first_place_that_names_it(tmp_path: Path) -> None:
    """Triton's order: step 0 takes ``t`` as [4] before step 1 makes it as [-1], so step
    2's [5] disagrees, though it would agree with the [-1] it is made as."""
    python_model(tmp_path, "four", io(8, fp32("X", "4"), fp32("Y", "4")))
    python_model(tmp_path, "five", io(8, fp32("X", "5"), fp32("Y", "5")))
    python_model(tmp_path, "any", io(8, fp32("X", "-1"), fp32("Y", "-1")))
    graph = [
        step("four", {"X": "t"}, {"Y": "A"}),
        step("any", {"X": "IN"}, {"Y": "t"}),
        step("five", {"X": "t"}, {"Y": "B"}),
    ]
    ensemble(tmp_path, "ordered", io(8, fp32("IN", "-1"), f"{fp32('A')}, {fp32('B', '5')}"), graph)
    assert scan(tmp_path)["ordered"].error == (
        "ensemble 'ordered': tensor 't' is FP32 [-1, 4] as input 'X' of step 0 ('four') but "
        "FP32 [-1, 5] as input 'X' of step 2 ('five')"
    )


RESHAPED = """
max_batch_size: {batch}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {dims} ] reshape: {{ shape: [ {reshape} ] }} }},
        {{ name: "PLAIN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {dims} ] reshape: {{ shape: [ {reshape} ] }} }},
         {{ name: "PLAIN_OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""


@pytest.mark.parametrize(
    ("batch", "dims", "reshape", "outer", "inner"),
    [
        (8, "8", "4, 1, 2", (3, 8), (3, 4, 1, 2)),  # ff2: behind the batch dimension
        (0, "4, 4", "16", (4, 4), (16,)),  # ff3's non-batching ensemble
        (0, "2, 2, 3", "3, 2, 2", (2, 2, 3), (3, 2, 2)),
        (8, "1", "", (5, 1), (5,)),  # a scalar per row
        (0, "-1, 4", "4, -1", (3, 4), (4, 3)),  # each -1 takes the next -1's size
        (8, "2, -1, -1", "-1, 2, -1", (1, 2, 5, 7), (1, 5, 2, 7)),
    ],
)
def test_reshape_in_and_out_of_the_graph(batch, dims, reshape, outer, inner) -> None:
    cfg = parse_config(
        RESHAPED.format(batch=batch, dims=dims, reshape=reshape), model="e", source="t"
    )
    assert ensemble_graph.inner_shape(cfg, "IN", outer) == inner
    assert ensemble_graph.output_dims(cfg, "OUT") == [int(d) for d in reshape.split(",") if d]
    assert ensemble_graph.outer_shape(cfg, "OUT", inner) == outer
    # Tensors without a reshape, and shapes that do not fit, are left to the steps' checks.
    assert ensemble_graph.inner_shape(cfg, "PLAIN", (2, 9)) == (2, 9)
    assert ensemble_graph.outer_shape(cfg, "PLAIN_OUT", (2, 9)) == (2, 9)
    assert ensemble_graph.inner_shape(cfg, "IN", (*outer, 1, 1)) == (*outer, 1, 1)


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
