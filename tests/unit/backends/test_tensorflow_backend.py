"""The tensorflow backend's own logic: Triton's naming and parameter rules, the SavedModel
signature reader, the file-to-platform rules, and what happens without tensorflow or a GPU.

Most of these build ``saved_model.pb`` by hand (a few protobuf fields), so they run
without importing tensorflow; the serving path is tested in
tests/integration/backends/test_tensorflow_backend.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conch.backends import tensorflow as tfb
from conch.core.backend_table import BACKENDS, backend_for_filename, model_filename
from conch.core.errors import ModelLoadError
from conch.core.extras import install_command
from conch.core.model_config import config_to_json, parse_config
from conch.core.model_spec import InstanceSpec, ModelSpec
from conch.core.repository import ModelRepository

# -- a saved_model.pb written by hand -------------------------------------------------------

DT_FLOAT, DT_STRING, DT_INT64, DT_COMPLEX64 = 1, 7, 9, 8


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _msg(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _tensor_info(name: str, dtype: int, shape: list[int]) -> bytes:
    dims = b"".join(_msg(2, _int(1, d)) for d in shape)
    return _msg(1, f"{name}:0") + _int(2, dtype) + _msg(3, dims)


def _signature(inputs: dict, outputs: dict) -> bytes:
    def entries(number: int, tensors: dict) -> bytes:
        return b"".join(
            _msg(number, _msg(1, k) + _msg(2, _tensor_info(k, *v))) for k, v in tensors.items()
        )

    return entries(1, inputs) + entries(2, outputs) + _msg(3, "tensorflow/serving/predict")


def saved_model_pb(signatures: dict[str, bytes], tags: tuple[str, ...] = ("serve",)) -> bytes:
    info = b"".join(_msg(4, t) for t in tags)
    graph = _msg(2, b"\x0a\x00")  # a graph_def field to skip
    sigs = b"".join(_msg(5, _msg(1, k) + _msg(2, v)) for k, v in signatures.items())
    return _int(1, 1) + _msg(2, _msg(1, info) + graph + sigs)


DENSE = _signature({"features": (DT_FLOAT, [-1, 4])}, {"scores": (DT_FLOAT, [-1, 3])})
TEXT = _signature(
    {"TEXT": (DT_STRING, [-1, 1])},
    {"UPPER": (DT_STRING, [-1, 1]), "LENGTH": (DT_INT64, [-1, 1])},
)


def write_saved_model(version_dir: Path, signatures: dict[str, bytes], **kw) -> Path:
    folder = version_dir / "model.savedmodel"
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(saved_model_pb(signatures, **kw))
    return folder


def _config(text: str = "", name: str = "m"):
    cfg = parse_config(text, model=name, source="test")
    cfg.name = name
    return cfg


# -- the reader -----------------------------------------------------------------------------


def test_signatures_are_read_by_key_with_types_and_open_dimensions():
    sigs = tfb.read_signatures(saved_model_pb({"serving_default": TEXT, "other": DENSE}), "serve")
    assert sorted(sigs) == ["other", "serving_default"]
    text = sigs["serving_default"]
    assert [(t.name, t.dtype, t.shape) for t in text.inputs] == [("TEXT", "TYPE_STRING", (-1, 1))]
    assert [(t.name, t.dtype, t.shape) for t in text.outputs] == [
        ("UPPER", "TYPE_STRING", (-1, 1)),
        ("LENGTH", "TYPE_INT64", (-1, 1)),
    ]


def test_a_missing_tag_says_which_tags_exist():
    with pytest.raises(KeyError, match="serve1"):
        tfb.read_signatures(saved_model_pb({"serving_default": DENSE}), "serve1")


# -- Triton's rules -------------------------------------------------------------------------


def test_signature_choice_follows_triton():
    assert tfb.pick_signature("m", ["a", "serving_default"], "") == "serving_default"
    assert tfb.pick_signature("m", ["a", "serving_default"], "a") == "a"
    # No parameter and no serving_default: another signature, never an internal one.
    assert tfb.pick_signature("m", ["__saved_model_init_op", "predict"], "") == "predict"
    with pytest.raises(ModelLoadError, match=r"no signature 'b'.*TF_SIGNATURE_DEF"):
        tfb.pick_signature("m", ["a", "serving_default"], "b")
    with pytest.raises(ModelLoadError, match="no signature 'serving_default'"):
        tfb.pick_signature("m", ["__saved_model_init_op"], "")


def test_graphdef_names_are_node_names():
    assert tfb.graph_tensor("input") == "input:0"
    assert tfb.graph_tensor("split:1") == "split:1"


def _params(**values: str) -> str:
    return "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in values.items()
    )


def test_thread_parameters_use_tritons_names():
    assert tfb.thread_counts(_config()) == (0, 0)  # TensorFlow chooses, as in Triton
    cfg = _config(_params(TF_NUM_INTRA_THREADS="2", TF_NUM_INTER_THREADS=" 3 "))
    assert tfb.thread_counts(cfg) == (2, 3)
    with pytest.raises(ModelLoadError, match=r"TF_NUM_INTRA_THREADS.*non-negative"):
        tfb.thread_counts(_config(_params(TF_NUM_INTRA_THREADS="-1")))
    with pytest.raises(ModelLoadError, match=r"TF_NUM_INTER_THREADS.*integer"):
        tfb.thread_counts(_config(_params(TF_NUM_INTER_THREADS="many")))


# -- the repository: files, platforms, auto-complete ----------------------------------------


def test_each_platform_has_its_own_model_file():
    facts = BACKENDS["tensorflow"]
    assert facts.platforms == ("tensorflow_savedmodel", "tensorflow_graphdef")
    assert facts.filename_for("tensorflow_graphdef") == "model.graphdef"
    assert facts.filename_for("tensorflow_savedmodel") == "model.savedmodel"
    assert backend_for_filename("model.graphdef") == "tensorflow"
    assert backend_for_filename("model.savedmodel") == "tensorflow"
    graphdef = _config('platform: "tensorflow_graphdef" backend: "tensorflow"')
    assert model_filename(graphdef) == "model.graphdef"


def test_the_platform_follows_the_model_file(tmp_path: Path):
    """Triton's ``AutoCompleteBackendFields``: no platform, and the file says which."""
    gd = tmp_path / "gd"
    (gd / "1").mkdir(parents=True)
    (gd / "1" / "model.graphdef").write_bytes(b"")
    (gd / "config.pbtxt").write_text(
        'backend: "tensorflow"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    )
    write_saved_model(tmp_path / "sm" / "1", {"serving_default": DENSE})
    repo = ModelRepository(tmp_path, complete=_completer(), gpu_count=0)
    entry = repo.read_model("gd")
    assert entry.error is None
    assert entry.config.platform == "tensorflow_graphdef"
    assert entry.config.default_model_filename == "model.graphdef"
    sm = repo.read_model("sm")
    assert sm.error is None and sm.backend == "tensorflow"
    assert sm.config.platform == "tensorflow_savedmodel"
    assert sm.config.default_model_filename == "model.savedmodel"


def _completer():
    from conch.backends.completion import complete

    return complete


def test_auto_complete_fills_from_the_signature_and_keeps_listed_outputs(tmp_path: Path):
    write_saved_model(tmp_path / "text" / "1", {"serving_default": TEXT})
    repo = ModelRepository(tmp_path, complete=_completer(), gpu_count=0)
    cfg = repo.read_model("text").config
    assert cfg.max_batch_size == 4 and cfg.HasField("dynamic_batching")
    doc = config_to_json(cfg)
    assert [(i["name"], i["data_type"], i["dims"]) for i in doc["input"]] == [
        ("TEXT", "TYPE_STRING", [1])
    ]
    assert sorted(o["name"] for o in doc["output"]) == ["LENGTH", "UPPER"]
    # A config that lists some outputs gets only those (Triton's rule for this backend).
    (tmp_path / "text" / "config.pbtxt").write_text('output [ { name: "UPPER" } ]\n')
    cfg = repo.read_model("text").config
    assert [o.name for o in cfg.output] == ["UPPER"]


def test_auto_complete_reads_the_signature_the_parameters_name(tmp_path: Path):
    write_saved_model(
        tmp_path / "m" / "1", {"serving_default": DENSE, "text": TEXT}, tags=("serve1",)
    )
    (tmp_path / "m" / "config.pbtxt").write_text(
        _params(TF_SIGNATURE_DEF="text", TF_GRAPH_TAG="serve1")
    )
    repo = ModelRepository(tmp_path, complete=_completer(), gpu_count=0)
    entry = repo.read_model("m")
    assert entry.error is None, entry.error
    assert [i.name for i in entry.config.input] == ["TEXT"]


def test_config_errors_name_the_model_and_the_tensor(tmp_path: Path):
    write_saved_model(tmp_path / "m" / "1", {"serving_default": DENSE})
    (tmp_path / "m" / "config.pbtxt").write_text(
        'input [ { name: "pixels" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    write_saved_model(
        tmp_path / "c" / "1",
        {"serving_default": _signature({"z": (DT_COMPLEX64, [-1])}, {})},
    )
    (tmp_path / "nopb" / "1" / "model.savedmodel").mkdir(parents=True)
    repo = ModelRepository(tmp_path, complete=_completer(), gpu_count=0)
    assert "input 'pixels' is not an input" in repo.read_model("m").error
    assert "'z' has TensorFlow type 8, which has no Triton data type" in repo.read_model("c").error
    assert "not a SavedModel folder" in repo.read_model("nopb").error


def test_auto_complete_never_imports_tensorflow(tmp_path: Path):
    """A gateway completes TensorFlow configs; importing tensorflow there would be slow."""
    write_saved_model(tmp_path / "m" / "1", {"serving_default": DENSE})
    code = (
        "import sys\n"
        "from conch.core.repository import ModelRepository\n"
        "from conch.backends.completion import complete\n"
        f"e = ModelRepository({str(tmp_path)!r}, complete=complete).read_model('m')\n"
        "assert e.error is None, e.error\n"
        "print('tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- loading without tensorflow, or without a GPU -------------------------------------------


def _backend(tmp_path: Path, kind: str = "CPU", params: str = "") -> tfb.TensorFlowBackend:
    write_saved_model(tmp_path / "m" / "1", {"serving_default": DENSE})
    cfg = _config('platform: "tensorflow_savedmodel" backend: "tensorflow"\n' + params)
    return tfb.TensorFlowBackend(ModelSpec("m", 1, tmp_path / "m", cfg), InstanceSpec("m_0", kind))


def test_a_missing_tensorflow_names_the_extra(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(ModelLoadError, match="needs TensorFlow") as info:
        _backend(tmp_path).load()
    assert install_command("tensorflow") in str(info.value)


def test_kind_gpu_is_refused_without_a_gpu(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tfb, "cuda_device_count", lambda: 0)
    with pytest.raises(ModelLoadError, match="asks for KIND_GPU but no NVIDIA GPU"):
        _backend(tmp_path, kind="GPU").load()
    assert tfb.gpu_available()[0] is False
    # A GPU, but the CPU build of tensorflow: said without importing tensorflow.
    monkeypatch.setattr(tfb, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(tfb, "_installed", lambda dist: dist == "tensorflow-cpu")
    assert tfb.gpu_available() == (
        False,
        "only tensorflow-cpu is installed here, which has no GPU support",
    )


def test_init_ops_are_refused_for_a_saved_model_rather_than_skipped(tmp_path: Path):
    backend = _backend(tmp_path, params=_params(TF_INIT_OPS_FILE="init_ops.json"))
    with pytest.raises(ModelLoadError, match=r"TF_INIT_OPS_FILE.*graphdef only"):
        backend.load()
