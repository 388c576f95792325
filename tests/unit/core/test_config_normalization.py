"""Configs as Triton normalizes them (issue 29, point 5): the completed config reads as
Triton's for its L0_model_config autofill cases (tests/triton_autofill.py), and what
conch does differently is listed in ``unsupported.NORMALIZED``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import triton_autofill
from google.protobuf import text_format

from conch.backends.completion import complete
from conch.core import unsupported
from conch.core.repository import ModelRepository, triton_instance_count

from unit._onnx_models import mlp, write_model

ADD = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return triton_autofill.build(tmp_path_factory.mktemp("autofill") / "models")


@pytest.mark.parametrize("gpus", [0, 1], ids=["no_gpu", "one_gpu"])
@pytest.mark.parametrize("name", sorted(triton_autofill.CASES))
def test_the_completed_config_is_tritons(cases: Path, name: str, gpus: int) -> None:
    """On one GPU, Triton's expected file itself; on none, its CPU form."""
    entry = ModelRepository(cases, complete=complete, gpu_count=gpus).read_model(name)
    assert entry.error is None, entry.error
    got = triton_autofill.as_config(entry.to_json())
    want = triton_autofill.expected(name, gpus)
    assert got == want, (
        f"got:\n{text_format.MessageToString(got)}\nwant:\n{text_format.MessageToString(want)}"
    )


@pytest.mark.parametrize(
    ("kind", "backend", "count"),
    [
        ("KIND_CPU", "onnxruntime", 2),
        ("KIND_CPU", "python", 1),
        ("KIND_CPU", "pytorch", 1),
        ("KIND_CPU", "tensorrt", 1),
        ("KIND_GPU", "onnxruntime", 1),
        ("KIND_MODEL", "onnxruntime", 1),
    ],
)
def test_tritons_default_instance_count(kind: str, backend: str, count: int) -> None:
    assert triton_instance_count(kind, backend) == count


def test_a_defaulted_count_is_reported_as_tritons_and_one_instance_runs(tmp_path) -> None:
    write_model(tmp_path, "auto", mlp, config=ADD)
    write_model(tmp_path, "cpu", mlp, config=ADD + "instance_group [ { kind: KIND_CPU } ]")
    write_model(tmp_path, "two", mlp, config=ADD + "instance_group [ { count: 2 } ]")
    entries = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()
    for name in ("auto", "cpu"):
        [group] = entries[name].to_json()["instance_group"]
        assert (group["kind"], group["count"]) == ("KIND_CPU", 2), name
        assert len(entries[name].instances()) == 1, name  # conch's choice, documented
    # A count the config gives is run as given.
    assert [i.name for i in entries["two"].instances()] == ["two_0_0", "two_0_1"]
    assert any(d.field == "instance_group.count" for d in unsupported.NORMALIZED)


def test_on_a_gpu_the_default_group_is_one_instance_per_gpu(tmp_path) -> None:
    write_model(tmp_path, "m", mlp, config=ADD)
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=2).read_model("m")
    [group] = entry.to_json()["instance_group"]
    assert (group["kind"], group["count"], group["gpus"]) == ("KIND_GPU", 1, [0, 1])
    assert [(i.kind, i.device_id) for i in entry.instances()] == [("GPU", 0), ("GPU", 1)]


def test_pinned_memory_is_reported_on_without_a_warning(tmp_path, caplog) -> None:
    write_model(tmp_path, "plain", mlp, config=ADD)
    with caplog.at_level(logging.WARNING, logger=unsupported.__name__):
        entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).read_model("plain")
    assert entry.error is None, entry.error
    assert entry.to_json()["optimization"]["input_pinned_memory"] == {"enable": True}
    assert entry.to_json()["optimization"]["output_pinned_memory"] == {"enable": True}
    assert not [r for r in caplog.records if r.name == unsupported.__name__]
    fields = {d.field for d in unsupported.NORMALIZED}
    assert {"optimization.input_pinned_memory", "optimization.output_pinned_memory"} <= fields


def test_pinned_memory_the_config_sets_is_kept_and_warned_about(tmp_path, caplog) -> None:
    text = ADD + "optimization { input_pinned_memory { enable: false } }"
    write_model(tmp_path, "asks", mlp, config=text)
    with caplog.at_level(logging.WARNING, logger=unsupported.__name__):
        entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).read_model("asks")
    optimization = entry.to_json()["optimization"]
    assert optimization["input_pinned_memory"] == {"enable": False}  # as written
    assert optimization["output_pinned_memory"] == {"enable": True}  # Triton's default
    warned = [r.getMessage() for r in caplog.records if r.name == unsupported.__name__]
    assert any("optimization.input_pinned_memory is ignored" in w for w in warned), warned
    assert not any("output_pinned_memory" in w for w in warned), warned


def test_an_ensemble_gets_no_pinned_memory(tmp_path) -> None:
    write_model(tmp_path, "step", mlp, config=ADD)
    (tmp_path / "ens" / "1").mkdir(parents=True)
    (tmp_path / "ens" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "step" model_version: -1 '
        'input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] }\n'
    )
    entries = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()
    assert entries["ens"].error is None, entries["ens"].error
    assert "optimization" not in entries["ens"].to_json()


@pytest.mark.parametrize(
    ("head", "filename"),
    [
        ('backend: "pytorch"', "model.pt"),  # Triton fills the platform and the file
        ('platform: "pytorch_libtorch"', ""),  # Triton fills the backend only
        ('backend: "pytorch" platform: "pytorch_libtorch"', ""),
        ("", ""),  # found from model.pt: Triton fills backend and platform only
    ],
)
def test_pytorch_default_model_filename_as_triton_writes_it(
    tmp_path, head: str, filename: str
) -> None:
    triton_autofill.build(tmp_path, ["no_name_platform"])
    config = tmp_path / "no_name_platform" / "config.pbtxt"
    config.write_text(head + "\n" + config.read_text())
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).read_model("no_name_platform")
    assert entry.error is None, entry.error
    assert entry.to_json()["default_model_filename"] == filename
    assert entry.config.platform == "pytorch_libtorch"
    assert entry.spec(1).model_file.name == "model.pt"  # what the backend loads
