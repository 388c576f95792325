"""The openvino backend in process: Triton's OpenVINO parameters read and checked (and
refused with the reason), the model's signature auto-completed as Triton's backend does,
and IR and ONNX files answering what openvino and onnxruntime answer."""

from __future__ import annotations

import numpy as np
import pytest

from conch.backends import InstanceSpec, backend_class
from conch.backends.completion import complete
from conch.backends.openvino import OpenVinoBackend, OpenVinoParameters
from conch.core.backend_table import BACKENDS, model_filename
from conch.core.errors import Internal, ModelLoadError
from conch.core.model_config import new_config
from conch.core.repository import ModelRepository

from unit._onnx_models import mlp

ov = pytest.importorskip("openvino")
import openvino_models as om  # noqa: E402


def config(**params: str):
    cfg = new_config()
    cfg.name = "m"
    cfg.backend = "openvino"
    for k, v in params.items():
        cfg.parameters[k].string_value = v
    return cfg


def scan(root):
    return ModelRepository(root, complete=complete, gpu_count=0).scan()


def loaded(root, name, kind="CPU"):
    entry = scan(root)[name]
    if entry.error is not None:
        raise ModelLoadError(entry.error)
    backend = OpenVinoBackend(entry.spec(entry.latest()), InstanceSpec(f"{name}_0", kind))
    backend.load()
    return backend


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def test_registry_and_default_file() -> None:
    assert backend_class("openvino") is OpenVinoBackend
    assert BACKENDS["openvino"].default_filename == "model.xml"
    cfg = config()
    assert model_filename(cfg) == "model.xml"
    cfg.default_model_filename = "model.onnx"
    assert model_filename(cfg) == "model.onnx"


def test_parameters_as_triton_reads_them() -> None:
    p = OpenVinoParameters.from_config(
        config(
            NUM_STREAMS="auto",
            PERFORMANCE_HINT="throughput",
            INFERENCE_NUM_THREADS="3",
            COMPILATION_NUM_THREADS="2",
            HINT_BF16="yes",
            RESHAPE_IO_LAYERS="Yes",
            ENABLE_BATCH_PADDING="YES",
            SKIP_OV_DYNAMIC_BATCHSIZE="no",
            TARGET_DEVICE="cpu",
        )
    )
    assert p.properties == {
        "NUM_STREAMS": "AUTO",
        "PERFORMANCE_HINT": "THROUGHPUT",
        "INFERENCE_NUM_THREADS": 3,
        "COMPILATION_NUM_THREADS": 2,
        "INFERENCE_PRECISION_HINT": "bf16",
    }
    assert p.reshape_io and p.batch_padding and not p.skip_dynamic_batch and p.fixed_batch
    assert p.device == "CPU"
    assert (
        OpenVinoParameters.from_config(config(NUM_STREAMS="12")).properties["NUM_STREAMS"] == "12"
    )


def test_defaults_are_one_thread_and_fp32() -> None:
    p = OpenVinoParameters.from_config(config())
    assert p.properties == {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"}
    assert p.device == "CPU" and not (p.reshape_io or p.fixed_batch)


@pytest.mark.parametrize(
    ("key", "value", "want"),
    [
        ("INFERENCE_NUM_THREADS", "-1", "a non-negative number"),
        ("INFERENCE_NUM_THREADS", "four", "a non-negative number"),
        ("COMPILATION_NUM_THREADS", "1.5", "a non-negative number"),
        ("NUM_STREAMS", "many", "AUTO, NUMA or a number"),
        ("PERFORMANCE_HINT", "fast", "LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT"),
        ("HINT_BF16", "no", "YES"),
        ("ENABLE_BATCH_PADDING", "true", "YES or NO"),
        ("RESHAPE_IO_LAYERS", "1", "YES or NO"),
        ("SKIP_OV_DYNAMIC_BATCHSIZE", "on", "YES or NO"),
    ],
)
def test_a_bad_value_is_a_load_error_naming_it(key, value, want) -> None:
    with pytest.raises(ModelLoadError) as exc:
        OpenVinoParameters.from_config(config(**{key: value}))
    assert key in str(exc.value) and want in str(exc.value) and value in str(exc.value)


def test_an_unknown_upper_case_key_is_warned_about(caplog) -> None:
    with caplog.at_level("WARNING"):
        OpenVinoParameters.from_config(config(CPU_THREADS_NUM="2", instance_form="thread"))
    text = caplog.text
    assert "CPU_THREADS_NUM" in text and "instance_form" not in text


def test_ir_autocompletes_and_answers_as_openvino_and_onnxruntime(tmp_path) -> None:
    xml = om.mlp_ir(tmp_path / "ir" / "1")
    (tmp_path / "ir" / "config.pbtxt").write_text('backend: "openvino"\nmax_batch_size: 8\n')
    entry = scan(tmp_path)["ir"]
    assert entry.error is None, entry.error
    cfg = entry.config
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("x", [4])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("y", [3])]
    # No layout in the IR: Triton's backend turns on no dynamic batcher.
    assert not cfg.HasField("dynamic_batching")
    backend = loaded(tmp_path, "ir")
    for n in (1, 5, 8):
        x = rows(n, n)
        got = backend.run({"x": x}, ["y"])["y"]
        np.testing.assert_allclose(got, om.openvino_answers(xml, x), rtol=1e-6, atol=1e-6)
        onnx_file = tmp_path / "ir" / "src_1.onnx"
        np.testing.assert_allclose(got, om.onnxruntime_answers(onnx_file, x), rtol=1e-5, atol=1e-5)
    assert backend.compiled.get_property("INFERENCE_NUM_THREADS") == 1


def test_no_max_batch_size_keeps_the_full_shape(tmp_path) -> None:
    om.mlp_ir(tmp_path / "ir" / "1")
    (tmp_path / "ir" / "config.pbtxt").write_text('backend: "openvino"\n')
    entry = scan(tmp_path)["ir"]
    assert entry.config.max_batch_size == 0
    assert list(entry.config.input[0].dims) == [-1, 4]
    backend = loaded(tmp_path, "ir")
    assert backend.run({"x": rows(3)}, ["y"])["y"].shape == (3, 3)


def test_a_layout_with_a_batch_autocompletes_batching(tmp_path) -> None:
    model = ov.convert_model(str(mlp(tmp_path / "src.onnx")))
    ppp = ov.preprocess.PrePostProcessor(model)
    ppp.input("x").model().set_layout(ov.Layout("NC"))
    ppp.output("y").model().set_layout(ov.Layout("NC"))
    (tmp_path / "lay" / "1").mkdir(parents=True)
    ov.save_model(ppp.build(), str(tmp_path / "lay" / "1" / "model.xml"))
    (tmp_path / "lay" / "config.pbtxt").write_text('backend: "openvino"\n')
    cfg = ModelRepository(tmp_path, complete=complete, gpu_count=0, default_max_batch_size=4)
    entry = cfg.scan()["lay"]
    assert entry.error is None, entry.error
    assert entry.config.max_batch_size == 4
    assert entry.config.HasField("dynamic_batching")
    assert list(entry.config.input[0].dims) == [4]


def test_parameters_reach_the_compiled_model(tmp_path) -> None:
    om.mlp_ir(tmp_path / "ir" / "1")
    (tmp_path / "ir" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 4\nparameters [\n'
        '{ key: "INFERENCE_NUM_THREADS" value: { string_value: "2" } },\n'
        '{ key: "NUM_STREAMS" value: { string_value: "1" } },\n'
        '{ key: "PERFORMANCE_HINT" value: { string_value: "THROUGHPUT" } },\n'
        '{ key: "HINT_BF16" value: { string_value: "YES" } }\n]\n'
    )
    compiled = loaded(tmp_path, "ir").compiled
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 2
    assert compiled.get_property("NUM_STREAMS") == 1
    assert str(compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"
    # OpenVINO takes the hint only on a CPU that computes in bf16, else keeps f32.
    bf16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    want = ov.Type.bf16 if bf16 else ov.Type.f32
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == want


def test_a_fixed_batch_pads_or_refuses_as_triton_does(tmp_path) -> None:
    xml = om.mlp_ir(tmp_path / "pad" / "1", batch=4)
    om.mlp_ir(tmp_path / "skip" / "1", batch=4)
    body = 'backend: "openvino"\nmax_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    (tmp_path / "pad" / "config.pbtxt").write_text(
        body + 'parameters { key: "ENABLE_BATCH_PADDING" value: { string_value: "YES" } }\n'
    )
    (tmp_path / "skip" / "config.pbtxt").write_text(
        body + 'parameters { key: "SKIP_OV_DYNAMIC_BATCHSIZE" value: { string_value: "YES" } }\n'
    )
    x = rows(2)
    got = loaded(tmp_path, "pad").run({"x": x}, ["y"])["y"]
    full = om.openvino_answers(xml, np.concatenate([x, np.zeros((2, 4), np.float32)]))
    np.testing.assert_allclose(got, full[:2], rtol=1e-6)
    skip = loaded(tmp_path, "skip")
    with pytest.raises(Internal, match="ENABLE_BATCH_PADDING"):
        skip.run({"x": x}, ["y"])
    assert skip.run({"x": rows(4)}, ["y"])["y"].shape == (4, 3)


def test_a_static_batch_model_is_made_dynamic(tmp_path) -> None:
    """Triton would fix the batch at max_batch_size; conch runs any batch up to it."""
    xml = om.mlp_ir(tmp_path / "one" / "1", batch=1)
    (tmp_path / "one" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    backend = loaded(tmp_path, "one")
    x = rows(6)
    want = np.concatenate([om.openvino_answers(xml, x[i : i + 1]) for i in range(6)])
    np.testing.assert_allclose(backend.run({"x": x}, ["y"])["y"], want, rtol=1e-6, atol=1e-6)


def test_reshape_io_layers_takes_the_config_dims(tmp_path) -> None:
    om.mlp_ir(tmp_path / "fix" / "1", batch=2)
    (tmp_path / "fix" / "config.pbtxt").write_text(
        'backend: "openvino"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]\n'
        'parameters: { key: "RESHAPE_IO_LAYERS" value: { string_value: "yes" } }\n'
    )
    backend = loaded(tmp_path, "fix")
    assert backend.run({"x": rows(5)}, ["y"])["y"].shape == (5, 3)


def test_a_config_type_is_converted_to(tmp_path) -> None:
    xml = om.mlp_ir(tmp_path / "f16" / "1")
    (tmp_path / "f16" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP64 dims: [ 4 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP64 dims: [ 3 ] } ]\n'
    )
    x = rows(3)
    got = loaded(tmp_path, "f16").run({"x": x.astype(np.float64)}, ["y"])["y"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, om.openvino_answers(xml, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('input [ { name: "z" data_type: TYPE_FP32 dims: [ 4 ] } ]', "is not an input"),
        ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 5 ] } ]', "do not match"),
        ('input [ { name: "x" data_type: TYPE_STRING dims: [ 4 ] } ]', "unsupported datatype"),
        (
            'parameters { key: "CPU_EXTENSION_PATH" value: { string_value: "/no/such.so" } }',
            "CPU_EXTENSION_PATH",
        ),
        ('parameters { key: "TARGET_DEVICE" value: { string_value: "NPU" } }', "not available"),
        ("instance_group [ { kind: KIND_GPU } ]", "KIND_CPU"),
    ],
)
def test_what_cannot_run_is_a_load_error(tmp_path, text, want) -> None:
    om.mlp_ir(tmp_path / "bad" / "1")
    (tmp_path / "bad" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 4\n' + text + "\n"
    )
    with pytest.raises(ModelLoadError, match=want):
        loaded(tmp_path, "bad", kind="GPU" if "GPU" in text else "CPU")


@pytest.mark.parametrize("device", ["AUTO", "AUTO:CPU", "MULTI:CPU", "HETERO:CPU"])
def test_a_virtual_device_over_the_cpu_loads(tmp_path, device) -> None:
    om.mlp_ir(tmp_path / "dev" / "1")
    (tmp_path / "dev" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 4\n'
        f'parameters {{ key: "TARGET_DEVICE" value: {{ string_value: "{device}" }} }}\n'
    )
    assert loaded(tmp_path, "dev").run({"x": rows(2)}, ["y"])["y"].shape == (2, 3)


def test_compilation_threads_apply_or_are_refused_by_name(tmp_path) -> None:
    """OpenVINO's CPU plugin dropped COMPILATION_NUM_THREADS in some releases: where it
    has it, the compiled model shows it; where not, the load fails naming it."""
    om.mlp_ir(tmp_path / "ct" / "1")
    (tmp_path / "ct" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 4\n'
        'parameters { key: "COMPILATION_NUM_THREADS" value: { string_value: "2" } }\n'
    )
    supported = ov.Core().get_property("CPU", "SUPPORTED_PROPERTIES")
    if "COMPILATION_NUM_THREADS" in supported:
        assert loaded(tmp_path, "ct").compiled.get_property("COMPILATION_NUM_THREADS") == 2
    else:
        with pytest.raises(ModelLoadError, match="COMPILATION_NUM_THREADS"):
            loaded(tmp_path, "ct")


def test_an_unreadable_file_is_a_load_error(tmp_path) -> None:
    (tmp_path / "junk" / "1").mkdir(parents=True)
    (tmp_path / "junk" / "1" / "model.xml").write_text("<net>not a model")
    (tmp_path / "junk" / "config.pbtxt").write_text('backend: "openvino"\nmax_batch_size: 2\n')
    entry = scan(tmp_path)["junk"]
    assert entry.error is not None and "OpenVINO cannot read" in entry.error


def test_an_onnx_file_runs_on_the_openvino_backend(tmp_path) -> None:
    onnx_file = mlp(tmp_path / "onnx" / "1" / "model.onnx")
    (tmp_path / "onnx" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 8\ndefault_model_filename: "model.onnx"\n'
    )
    x = rows(7)
    got = loaded(tmp_path, "onnx").run({"x": x}, ["y"])["y"]
    np.testing.assert_allclose(got, om.onnxruntime_answers(onnx_file, x), rtol=1e-5, atol=1e-5)


def test_the_onnx_openvino_accelerator_answers_as_onnxruntime(tmp_path) -> None:
    onnx_file = mlp(tmp_path / "acc" / "1" / "model.onnx")
    (tmp_path / "acc" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'parameters { key: "intra_op_thread_count" value: { string_value: "2" } }\n'
        "optimization { execution_accelerators { cpu_execution_accelerator: "
        '[ { name: "openvino" } ] } }\n'
    )
    entry = scan(tmp_path)["acc"]
    assert entry.error is None, entry.error
    backend = backend_class("onnxruntime")(entry.spec(1), InstanceSpec("acc_0", "CPU"))
    backend.load()
    assert backend.session is None  # onnxruntime opened nothing
    assert backend._openvino.compiled.get_property("INFERENCE_NUM_THREADS") == 2
    x = rows(5)
    got = backend.run({"x": x}, ["y"])["y"]
    np.testing.assert_allclose(got, om.onnxruntime_answers(onnx_file, x), rtol=1e-5, atol=1e-5)


def test_the_accelerator_takes_no_parameters(tmp_path) -> None:
    mlp(tmp_path / "accp" / "1" / "model.onnx")
    (tmp_path / "accp" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "optimization { execution_accelerators { cpu_execution_accelerator: "
        '[ { name: "openvino" parameters { key: "device_type" value: "GPU" } } ] } }\n'
    )
    entry = scan(tmp_path)["accp"]
    backend = backend_class("onnxruntime")(entry.spec(1), InstanceSpec("accp_0", "CPU"))
    with pytest.raises(ModelLoadError, match="takes no parameters"):
        backend.load()
