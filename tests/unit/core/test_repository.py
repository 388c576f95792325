"""Reading a Triton model repository: layout, completion, version policy, errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conch.backends.completion import complete
from conch.core.errors import InvalidArgument, NotFound, Unavailable
from conch.core.repository import ModelRepository

from unit._onnx_models import fixed, mlp, scalar, strings, write_model


def scan(root: Path, **kw):
    kw.setdefault("gpu_count", 0)
    return ModelRepository(root, complete=complete, **kw).scan()


def only(root: Path, name: str, **kw):
    entry = scan(root, **kw)[name]
    return entry


# -- completion ------------------------------------------------------------------------


def test_no_config_file_is_auto_completed(tmp_path):
    write_model(tmp_path, "mlp")
    e = only(tmp_path, "mlp")
    assert e.error is None, e.error
    assert e.backend == "onnxruntime"
    assert e.versions == [1]
    j = e.to_json()
    assert j["name"] == "mlp"
    assert j["platform"] == "onnxruntime_onnx"
    assert j["backend"] == "onnxruntime"
    assert j["default_model_filename"] == "model.onnx"
    assert j["version_policy"] == {"latest": {"num_versions": 1}}
    assert j["max_batch_size"] == 4
    assert [(i["name"], i["data_type"], i["dims"]) for i in j["input"]] == [("x", "TYPE_FP32", [4])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in j["output"]] == [
        ("y", "TYPE_FP32", [3])
    ]
    assert "dynamic_batching" in j
    assert "sequence_batching" not in j
    [group] = j["instance_group"]
    # Triton's count for an onnxruntime KIND_CPU group that gives none; a worker runs one
    # (unsupported.NORMALIZED)
    assert (group["name"], group["kind"], group["count"]) == ("mlp", "KIND_CPU", 2)
    assert [i.name for i in e.instances()] == ["mlp_0"]


def test_default_max_batch_size_is_configurable(tmp_path):
    write_model(tmp_path, "mlp")
    assert only(tmp_path, "mlp", default_max_batch_size=16).config.max_batch_size == 16
    e = only(tmp_path, "mlp", default_max_batch_size=1)
    assert e.config.max_batch_size == 1
    assert not e.config.HasField("dynamic_batching")  # only when max_batch_size > 1


def test_default_max_batch_size_by_backend(tmp_path):
    """Triton's --backend-config merge: a backend's own value, else the global one (""),
    else Triton's default 4."""
    write_model(tmp_path, "mlp")
    by_backend = {"": 16, "onnxruntime": 2}
    assert only(tmp_path, "mlp", default_max_batch_size=by_backend).config.max_batch_size == 2
    by_other = {"": 16, "pytorch": 2}
    assert only(tmp_path, "mlp", default_max_batch_size=by_other).config.max_batch_size == 16
    assert only(tmp_path, "mlp", default_max_batch_size={}).config.max_batch_size == 4


def test_config_without_inputs_is_filled(tmp_path):
    write_model(tmp_path, "mlp", config='backend: "onnxruntime"\nmax_batch_size: 8\n')
    e = only(tmp_path, "mlp")
    assert e.error is None, e.error
    assert e.config.platform == "onnxruntime_onnx"
    assert e.config.max_batch_size == 8
    assert list(e.config.input[0].dims) == [4]
    assert list(e.config.output[0].dims) == [3]


def test_platform_fills_backend(tmp_path):
    write_model(tmp_path, "mlp", config='platform: "onnxruntime_onnx"')
    assert only(tmp_path, "mlp").config.backend == "onnxruntime"


def test_partial_io_keeps_given_entries_and_adds_the_rest(tmp_path):
    write_model(
        tmp_path,
        "mlp",
        config='max_batch_size: 2\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]',
    )
    e = only(tmp_path, "mlp")
    assert e.error is None, e.error
    assert [i.name for i in e.config.input] == ["x"]
    assert [o.name for o in e.config.output] == ["y"]


def test_auto_complete_off(tmp_path):
    write_model(tmp_path, "mlp", config='platform: "onnxruntime_onnx"')
    e = only(tmp_path, "mlp", auto_complete=False)
    assert e.error is None, e.error
    assert e.config.max_batch_size == 0
    assert len(e.config.input) == 0
    assert not e.config.HasField("dynamic_batching")
    # instance groups and the other core fields are filled in regardless
    assert e.config.instance_group[0].name == "mlp"
    assert e.config.default_model_filename == "model.onnx"


def test_name_mismatch_is_an_error(tmp_path):
    write_model(tmp_path, "mlp", config='name: "other"')
    e = only(tmp_path, "mlp")
    assert e.error is not None
    assert "model 'mlp'" in e.error and "config.pbtxt" in e.error and "name" in e.error
    assert "other" in e.error


def test_platform_backend_mismatch(tmp_path):
    write_model(tmp_path, "m", config='platform: "pytorch_libtorch" backend: "onnxruntime"')
    e = only(tmp_path, "m")
    assert "platform" in e.error and "pytorch_libtorch" in e.error


def test_unknown_platform(tmp_path):
    write_model(tmp_path, "m", config='platform: "caffe2_netdef"')
    e = only(tmp_path, "m")
    assert "model 'm'" in e.error and "caffe2_netdef" in e.error


def test_no_model_file_and_no_platform(tmp_path):
    (tmp_path / "empty" / "1").mkdir(parents=True)
    (tmp_path / "empty" / "1" / "weights.bin").write_bytes(b"x")
    e = only(tmp_path, "empty")
    assert "model 'empty'" in e.error and "model.onnx" in e.error


def test_custom_filename_detected_by_suffix(tmp_path):
    mlp(tmp_path / "m" / "1" / "net.onnx")
    (tmp_path / "m" / "config.pbtxt").write_text('default_model_filename: "net.onnx"')
    e = only(tmp_path, "m")
    assert e.error is None, e.error
    assert e.backend == "onnxruntime"
    assert e.spec(1).model_file == tmp_path / "m" / "1" / "net.onnx"


def test_missing_model_file(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"')
    e = only(tmp_path, "m")
    assert "model 'm' version 1" in e.error and "model.onnx" in e.error and "not found" in e.error


def test_a_model_with_no_folder_is_an_error_not_a_crash(tmp_path, caplog):
    (tmp_path / "m").mkdir()
    with caplog.at_level(logging.ERROR, logger="conch.core.repository"):
        e = ModelRepository(tmp_path, complete=complete, gpu_count=0).read_model("nope")
    assert e.error == "model 'nope' is not in the model repository" and e.config is None
    assert caplog.records == []  # no "unexpected error" and its traceback


def test_no_versions(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"')
    e = only(tmp_path, "m")
    assert "at least one version" in e.error
    with pytest.raises(Unavailable):
        e.latest()


def test_scalar_io_is_dims_1_reshaped(tmp_path):
    write_model(tmp_path, "s", scalar)
    e = only(tmp_path, "s")
    assert e.error is None, e.error
    assert e.config.max_batch_size == 0
    j = e.to_json()["input"][0]
    assert j["dims"] == [1] and j["reshape"] == {"shape": []}


# -- max_batch_size rules ----------------------------------------------------------------


def test_fixed_first_dim_does_not_batch(tmp_path):
    write_model(tmp_path, "fixed", fixed)
    e = only(tmp_path, "fixed")
    assert e.error is None, e.error
    assert e.config.max_batch_size == 0
    assert list(e.config.input[0].dims) == [2, 3]
    assert not e.config.HasField("dynamic_batching")


def test_max_batch_size_on_non_batchable_model_is_an_error(tmp_path):
    write_model(tmp_path, "fixed", fixed, config="max_batch_size: 4")
    e = only(tmp_path, "fixed")
    assert "model 'fixed'" in e.error
    assert "max_batch_size" in e.error and "cannot batch" in e.error


def test_explicit_full_shape_keeps_max_batch_size_zero(tmp_path):
    write_model(
        tmp_path,
        "mlp",
        config='max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]',
    )
    e = only(tmp_path, "mlp")
    assert e.error is None, e.error
    assert e.config.max_batch_size == 0
    assert list(e.config.output[0].dims) == [-1, 3]
    assert e.metadata()["inputs"][0]["shape"] == [-1, 4]


IO4 = (
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)


@pytest.mark.parametrize(
    ("backend", "model_file", "text"),
    [
        ("python", "model.py", "class TritonPythonModel:\n    pass\n"),
        ("pytorch", "model.pt", "not read when completing"),
    ],
)
def test_python_and_pytorch_models_keep_the_default_scheduler(tmp_path, backend, model_file, text):
    # Triton's Python and PyTorch backends add no dynamic_batching: such a model with
    # max_batch_size 4 gets one request per execution unless its config asks for more.
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / model_file).write_text(text)
    (tmp_path / "m" / "config.pbtxt").write_text(f'backend: "{backend}"\nmax_batch_size: 4\n{IO4}')
    e = only(tmp_path, "m")
    assert e.error is None, e.error
    assert e.config.WhichOneof("scheduling_choice") is None
    assert "dynamic_batching" not in e.to_json()


@pytest.mark.parametrize("auto_complete", [True, False])
def test_a_dynamic_batcher_prefers_full_batches_by_default(tmp_path, auto_complete):
    write_model(tmp_path, "given", config="max_batch_size: 8\ndynamic_batching { }")
    write_model(
        tmp_path, "chosen", config="max_batch_size: 8\ndynamic_batching { preferred_batch_size: 2 }"
    )
    write_model(
        tmp_path,
        "flat",
        config='input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\ndynamic_batching { }',
    )
    entries = scan(tmp_path, auto_complete=auto_complete)
    assert all(e.error is None for e in entries.values()), entries
    batcher = {name: e.to_json()["dynamic_batching"] for name, e in entries.items()}
    assert batcher["given"]["preferred_batch_size"] == [8]  # Triton's NormalizeModelConfig
    assert batcher["chosen"]["preferred_batch_size"] == [2]
    assert batcher["flat"]["preferred_batch_size"] == []  # no batch dimension: nothing


def test_auto_complete_adds_a_dynamic_batcher_preferring_full_batches(tmp_path):
    write_model(tmp_path, "mlp")  # batchable ONNX, no config: max_batch_size 4
    j = only(tmp_path, "mlp").to_json()
    assert j["dynamic_batching"]["preferred_batch_size"] == [4]


# -- contradictions and validation --------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (
            'max_batch_size: 4\ninput [ { name: "x" data_type: TYPE_INT32 dims: [ 4 ] } ]',
            ["input 'x'", "data_type", "TYPE_INT32", "TYPE_FP32"],
        ),
        (
            'max_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 5 ] } ]',
            ["input 'x'", "dims", "[5]", "[4]"],
        ),
        (
            'max_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 4 ] } ]',
            ["input 'x'", "dims"],
        ),
        (
            'max_batch_size: 4\noutput [ { name: "z" data_type: TYPE_FP32 dims: [ 3 ] } ]',
            ["output 'z'", "not an output"],
        ),
    ],
)
def test_config_contradicting_the_model(tmp_path, config, words):
    write_model(tmp_path, "mlp", config=config)
    e = only(tmp_path, "mlp")
    assert e.error is not None
    assert "model 'mlp'" in e.error
    assert str(tmp_path / "mlp" / "config.pbtxt") in e.error
    assert str(tmp_path / "mlp" / "1" / "model.onnx") in e.error
    for w in words:
        assert w in e.error, (w, e.error)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 0, 4 ] } ]', ["input 'x'", "dims"]),
        ('input [ { name: "x" data_type: TYPE_FP32 dims: [ -2 ] } ]', ["input 'x'", "dims"]),
        ('input [ { name: "x" data_type: TYPE_FP32 } ]', ["input 'x'", "dims is empty"]),
        ('input [ { name: "x" dims: [ 4 ] } ]', ["input 'x'", "data_type"]),
        ("input [ { data_type: TYPE_FP32 dims: [ 4 ] } ]", ["input[0]", "name"]),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }, '
            '{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            ["input 'x'", "twice"],
        ),
        ("max_batch_size: -1", ["max_batch_size"]),
    ],
)
def test_validation(tmp_path, config, words):
    # auto-complete off, so the checks meet the config as written
    write_model(tmp_path, "m", config='platform: "onnxruntime_onnx"\n' + config)
    e = only(tmp_path, "m", auto_complete=False)
    assert e.error is not None
    assert "model 'm'" in e.error and "config.pbtxt" in e.error
    for w in words:
        assert w in e.error, (w, e.error)


def test_broken_models_do_not_stop_the_others(tmp_path):
    write_model(tmp_path, "good")
    write_model(tmp_path, "broken", config='name: "broken"\nmax_batch_size: [oops\n')
    write_model(
        tmp_path, "liar", config='input [ { name: "nope" data_type: TYPE_FP32 dims: [1] } ]'
    )
    (tmp_path / "corrupt" / "1").mkdir(parents=True)
    (tmp_path / "corrupt" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    entries = scan(tmp_path)
    assert sorted(entries) == ["broken", "corrupt", "good", "liar"]
    assert entries["good"].available
    assert "line 2" in entries["broken"].error
    assert str(tmp_path / "broken" / "config.pbtxt") in entries["broken"].error
    assert entries["broken"].config is None
    assert "'nope'" in entries["liar"].error
    assert "model 'corrupt'" in entries["corrupt"].error
    for bad in ("broken", "liar", "corrupt"):
        assert not entries[bad].available
        with pytest.raises(Unavailable):
            entries[bad].spec(1)


# -- layout and version policy -------------------------------------------------------------


def test_repository_root_ignores_files_hidden_and_unsafe_names(tmp_path, caplog):
    write_model(tmp_path, "ok.model-1_a")
    # Triton serves these, and so does conch.
    for name in ("a,b", "good name", "semi;colon", "modèle"):
        write_model(tmp_path, name)
    write_model(tmp_path, ".hidden")
    write_model(tmp_path, "back\\slash")
    write_model(tmp_path, "tab\there")
    (tmp_path / "README.md").write_text("hi")
    with caplog.at_level(logging.WARNING, logger="conch.core.repository"):
        entries = scan(tmp_path)
    assert sorted(entries) == ["a,b", "good name", "modèle", "ok.model-1_a", "semi;colon"]
    assert all(entries[n].available for n in entries)
    assert "'back\\\\slash'" in caplog.text and "'tab\\there'" in caplog.text
    assert ".hidden" not in caplog.text  # hidden folders are skipped quietly


def test_non_numeric_and_zero_prefixed_version_dirs_are_ignored(tmp_path):
    write_model(tmp_path, "m", versions=(1, 2), config="version_policy { all { } }")
    for junk in ("0", "007", "abc", "1a", "v3"):
        mlp(tmp_path / "m" / junk / "model.onnx")
    (tmp_path / "m" / "9").write_text("a file, not a folder")
    assert only(tmp_path, "m").versions == [1, 2]


def test_version_dirs_follow_the_repository_key_rule_repo_sync_writes_by(tmp_path):
    # Versions are int64 in Triton; a folder name longer than 18 digits is not one, for the
    # repository as for repo_sync (core.repository_keys.VERSION_NAME, the one rule).
    write_model(tmp_path, "m", versions=(1,), config="version_policy { all { } }")
    mlp(tmp_path / "m" / ("9" * 18) / "model.onnx")
    mlp(tmp_path / "m" / ("9" * 19) / "model.onnx")
    mlp(tmp_path / "m" / "\u0661" / "model.onnx")  # ARABIC-INDIC DIGIT ONE: not ASCII
    assert only(tmp_path, "m").versions == [1, int("9" * 18)]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [3]),
        ("version_policy { latest { num_versions: 2 } }", [2, 3]),
        ("version_policy { latest { num_versions: 9 } }", [1, 2, 3]),
        ("version_policy { all { } }", [1, 2, 3]),
        ("version_policy { specific { versions: [ 3, 1 ] } }", [1, 3]),
    ],
)
def test_version_policy(tmp_path, policy, expected):
    write_model(tmp_path, "m", versions=(1, 2, 3), config=policy)
    e = only(tmp_path, "m")
    assert e.error is None, e.error
    assert e.versions == expected
    assert e.latest() == max(expected)


def test_specific_version_missing_on_disk(tmp_path):
    write_model(
        tmp_path, "m", versions=(1, 2), config="version_policy { specific { versions: [ 1, 5 ] } }"
    )
    e = only(tmp_path, "m")
    assert "model 'm'" in e.error and "version_policy" in e.error and "[5]" in e.error


def test_latest_zero_versions_is_an_error(tmp_path):
    write_model(tmp_path, "m", config="version_policy { latest { num_versions: 0 } }")
    assert "num_versions" in only(tmp_path, "m").error


def test_scan_is_re_readable(tmp_path):
    repo = ModelRepository(tmp_path, complete=complete, gpu_count=0)
    write_model(tmp_path, "m", versions=(1,))
    assert repo.scan()["m"].versions == [1]
    mlp(tmp_path / "m" / "2" / "model.onnx")
    write_model(tmp_path, "n")
    entries = repo.scan()
    assert entries["m"].versions == [2]
    assert sorted(entries) == ["m", "n"]


def test_missing_root(tmp_path):
    from conch.core.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="not a directory"):
        ModelRepository(tmp_path / "nope", complete=complete).scan()


# -- the completer ---------------------------------------------------------------------


class RecordingCompleter:
    """A Completer that fills nothing in and says how it was asked."""

    def __init__(self, gpus: int = 0) -> None:
        self.gpus = gpus
        self.completed: list[tuple[str, str, Path, int]] = []
        self.asked_gpus: list[str] = []

    def auto_complete(self, backend, config, model_file, *, default_max_batch_size):
        self.completed.append((backend, config.name, model_file, default_max_batch_size))

    def gpu_count(self, backend):
        self.asked_gpus.append(backend)
        return self.gpus


FULL_CONFIG = """
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def test_the_repository_completes_through_the_completer_it_is_given(tmp_path):
    write_model(tmp_path, "m", config=FULL_CONFIG, versions=(1, 2))
    completer = RecordingCompleter(gpus=2)
    e = ModelRepository(tmp_path, complete=completer, default_max_batch_size=8).scan()["m"]
    assert e.error is None, e.error
    assert completer.completed == [("onnxruntime", "m", tmp_path / "m" / "2" / "model.onnx", 8)]
    assert completer.asked_gpus == ["onnxruntime"]
    [group] = e.to_json()["instance_group"]
    assert (group["kind"], group["gpus"]) == ("KIND_GPU", [0, 1])


def test_without_a_completer_a_model_to_auto_complete_says_why_it_cannot_be_read(tmp_path):
    write_model(tmp_path, "m", config=FULL_CONFIG)
    e = ModelRepository(tmp_path).scan()["m"]
    assert not e.available
    assert "model 'm'" in e.error and "without a completer" in e.error


def test_without_a_completer_configs_read_as_written_and_no_gpu_is_counted(tmp_path):
    write_model(tmp_path, "m", config=FULL_CONFIG)
    e = ModelRepository(tmp_path, auto_complete=False).scan()["m"]
    assert e.error is None, e.error
    [group] = e.to_json()["instance_group"]
    assert group["kind"] == "KIND_CPU"
    assert not group["gpus"]


def test_the_repository_imports_no_backend():
    import subprocess
    import sys

    code = (
        "import sys, conch.core.repository, conch.wire.control_bus; "
        "print(sorted(m for m in sys.modules if m.startswith('conch.backends')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- instance groups ---------------------------------------------------------------------


def test_instance_groups_named_and_defaulted(tmp_path):
    write_model(
        tmp_path,
        "m",
        config="""
        instance_group [
          { kind: KIND_AUTO },
          { name: "named" kind: KIND_CPU count: 3 },
          { kind: KIND_GPU gpus: [ 1 ] }
        ]""",
    )
    e = only(tmp_path, "m")
    assert e.error is None, e.error
    groups = e.to_json()["instance_group"]
    assert [(g["name"], g["kind"], g["count"]) for g in groups] == [
        ("m_0", "KIND_CPU", 2),  # Triton's default for onnxruntime on CPU; one runs
        ("named", "KIND_CPU", 3),
        ("m_2", "KIND_GPU", 1),  # kept; the backend decides at load
    ]
    inst = e.instances()
    assert [(i.name, i.kind, i.device_id) for i in inst] == [
        ("m_0_0", "CPU", 0),
        ("named_0", "CPU", 0),
        ("named_1", "CPU", 0),
        ("named_2", "CPU", 0),
        ("m_2_0", "GPU", 1),
    ]


def test_default_group_uses_gpus_when_there_are_some(tmp_path):
    write_model(tmp_path, "m")
    e = only(tmp_path, "m", gpu_count=2)
    [group] = e.to_json()["instance_group"]
    assert (group["name"], group["kind"], group["gpus"]) == ("m", "KIND_GPU", [0, 1])
    assert [(i.name, i.device_id) for i in e.instances()] == [("m_0", 0), ("m_1", 1)]


def test_gpus_on_a_cpu_group_is_an_error(tmp_path):
    write_model(tmp_path, "m", config="instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]")
    assert "gpus" in only(tmp_path, "m").error


# -- metadata and versions -------------------------------------------------------------------


def test_metadata(tmp_path):
    write_model(tmp_path, "mlp", versions=(1, 2), config="version_policy { all { } }")
    write_model(tmp_path, "fixed", fixed)
    write_model(tmp_path, "text", strings)
    entries = scan(tmp_path)
    md = entries["mlp"].metadata()
    assert md == {
        "name": "mlp",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
    }
    assert entries["mlp"].metadata(2)["versions"] == ["2"]
    with pytest.raises(NotFound):
        entries["mlp"].metadata(7)
    assert entries["fixed"].metadata()["inputs"][0]["shape"] == [2, 3]
    assert entries["text"].metadata()["inputs"][0]["datatype"] == "BYTES"
    assert entries["text"].to_json()["input"][0]["data_type"] == "TYPE_STRING"


def test_resolve_version(tmp_path):
    write_model(
        tmp_path, "m", versions=(1, 2, 3), config="version_policy { latest { num_versions: 2 } }"
    )
    e = only(tmp_path, "m")
    assert e.resolve_version("") == 3
    assert e.resolve_version("-1") == 3
    assert e.resolve_version("2") == 2
    for bad in ("abc", "-2", "1.5", " "):
        if bad.strip() == "":
            assert e.resolve_version(bad) == 3
            continue
        with pytest.raises(InvalidArgument) as info:
            e.resolve_version(bad)
        assert info.value.status == 400
    for unknown in ("1", "9"):  # 1 is on disk but not served under latest 2
        with pytest.raises(NotFound) as info:
            e.resolve_version(unknown)
        assert info.value.status == 404
        assert "Request for unknown model version" in info.value.message


def test_spec(tmp_path):
    write_model(tmp_path, "m", versions=(4,))
    e = only(tmp_path, "m")
    spec = e.spec(4)
    assert spec.name == "m" and spec.version == 4
    assert spec.model_file == tmp_path / "m" / "4" / "model.onnx"
    assert spec.config is e.config
    with pytest.raises(NotFound):
        e.spec(1)


def test_output_labels(tmp_path):
    write_model(
        tmp_path,
        "m",
        config='max_batch_size: 4\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] '
        'label_filename: "labels.txt" } ]',
    )
    (tmp_path / "m" / "labels.txt").write_text("cat\ndog\nbird\n")
    e = only(tmp_path, "m")
    assert e.error is None, e.error
    assert e.labels() == {"y": ["cat", "dog", "bird"]}
    (tmp_path / "m" / "labels.txt").unlink()
    e = only(tmp_path, "m")
    assert "label_filename" in e.error and "labels.txt" in e.error


# -- several repositories ----------------------------------------------------------------


def test_several_repositories_serve_as_one_and_a_name_in_two_is_an_error(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    write_model(first, "mlp")
    write_model(second, "other")
    write_model(first, "both")
    write_model(second, "both")
    repo = ModelRepository([first, second], complete=complete, gpu_count=0)
    entries = repo.scan()
    assert sorted(entries) == ["both", "mlp", "other"]
    assert entries["mlp"].error is None and entries["other"].error is None
    assert entries["other"].path == second / "other"
    assert "more than one model repository" in (entries["both"].error or "")
    assert str(first) in entries["both"].error and str(second) in entries["both"].error
    assert repo.folder("other") == second / "other"
    assert repo.folder("absent") == first / "absent"
