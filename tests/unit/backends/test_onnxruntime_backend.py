"""The onnxruntime backend: auto-complete, load, execute through TensorBackend."""

from __future__ import annotations

import numpy as np
import pytest

from conch.backends import BackendRequest, InstanceSpec, backend_class
from conch.backends.completion import complete
from conch.backends.onnxruntime import OnnxRuntimeBackend, gpu_available
from conch.core.backend_table import BACKENDS
from conch.core.errors import ConchError, InvalidArgument, ModelLoadError
from conch.core.model_config import new_config, parse_config
from conch.core.repository import ModelRepository

from unit._onnx_models import (
    fixed,
    half_bool,
    mlp,
    mlp_reference,
    row_scalar,
    scalar,
    square,
    strings,
    write_model,
)


def loaded(tmp_path, builder=mlp, config=None, name="m", kind="CPU", **kw):
    write_model(tmp_path, name, builder, config=config)
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0, **kw).scan()[name]
    assert entry.error is None, entry.error
    backend = OnnxRuntimeBackend(entry.spec(entry.latest()), InstanceSpec(f"{name}_0", kind))
    backend.load()
    return backend


def test_registry_points_here():
    assert backend_class("onnxruntime") is OnnxRuntimeBackend
    entry = BACKENDS["onnxruntime"]
    assert entry.platforms == ("onnxruntime_onnx",)
    assert entry.default_filename == "model.onnx"


# -- auto-complete -----------------------------------------------------------------------


def test_auto_complete_fills_io_and_batch(tmp_path):
    cfg = new_config()
    cfg.name = "m"
    OnnxRuntimeBackend.auto_complete(cfg, mlp(tmp_path / "m.onnx"), default_max_batch_size=4)
    assert cfg.max_batch_size == 4
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("x", 11, [4])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("y", [3])]


def test_auto_complete_default_zero_leaves_full_shape(tmp_path):
    cfg = new_config()
    cfg.name = "m"
    OnnxRuntimeBackend.auto_complete(cfg, mlp(tmp_path / "m.onnx"), default_max_batch_size=0)
    assert cfg.max_batch_size == 0
    assert list(cfg.input[0].dims) == [-1, 4]


def test_auto_complete_types(tmp_path):
    cfg = new_config()
    cfg.name = "m"
    OnnxRuntimeBackend.auto_complete(cfg, half_bool(tmp_path / "m.onnx"), default_max_batch_size=4)
    pb2_types = {i.name: i.data_type for i in [*cfg.input, *cfg.output]}
    from conch.core.model_config import model_config_pb2

    names = {k: model_config_pb2().DataType.Name(v) for k, v in pb2_types.items()}
    assert names == {
        "h": "TYPE_FP16",
        "flag": "TYPE_BOOL",
        "h_out": "TYPE_FP16",
        "flag_out": "TYPE_BOOL",
    }


def test_auto_complete_contradictions(tmp_path):
    path = mlp(tmp_path / "m.onnx")
    cases = {
        'input [ { name: "x" data_type: TYPE_FP64 } ]': "field data_type is TYPE_FP64",
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4, 4 ] } ]': "field dims is [4, 4]",
        'input [ { name: "q" data_type: TYPE_FP32 dims: [ 4 ] } ]': "config input 'q'",
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]': "output 'y' field dims",
    }
    for text, words in cases.items():
        cfg = parse_config('name: "m"\nmax_batch_size: 2\n' + text, model="m", source="t")
        with pytest.raises(ModelLoadError) as info:
            OnnxRuntimeBackend.auto_complete(cfg, path, default_max_batch_size=4)
        assert "model 'm'" in info.value.message
        assert words in info.value.message, (words, info.value.message)


def test_auto_complete_variable_model_dim_accepts_fixed_config_dim(tmp_path):
    cfg = parse_config(
        'name: "m"\nmax_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 5, 4 ] } ]',
        model="m",
        source="t",
    )
    OnnxRuntimeBackend.auto_complete(cfg, mlp(tmp_path / "m.onnx"), default_max_batch_size=4)
    assert cfg.max_batch_size == 0
    assert list(cfg.output[0].dims) == [-1, 3]


def test_auto_complete_non_batchable_with_max_batch_size(tmp_path):
    cfg = parse_config('name: "f"\nmax_batch_size: 2', model="f", source="t")
    with pytest.raises(
        ModelLoadError, match=r"model 'f'.*max_batch_size is 2.*'a' has first dimension 2"
    ):
        OnnxRuntimeBackend.auto_complete(cfg, fixed(tmp_path / "f.onnx"), default_max_batch_size=4)


def test_auto_complete_bad_file(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"garbage")
    cfg = new_config()
    cfg.name = "m"
    with pytest.raises(ModelLoadError, match="model 'm': onnxruntime cannot open"):
        OnnxRuntimeBackend.auto_complete(cfg, bad, default_max_batch_size=4)
    with pytest.raises(ModelLoadError, match="not found"):
        OnnxRuntimeBackend.auto_complete(cfg, tmp_path / "nope.onnx", default_max_batch_size=4)


# -- execute -------------------------------------------------------------------------------


def test_execute_batches_requests_of_different_sizes(tmp_path):
    backend = loaded(tmp_path, mlp, config="max_batch_size: 8")
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (1, 2, 3)]
    calls = []
    real_run = backend.run

    def spy(inputs, outputs):
        calls.append({k: v.shape for k, v in inputs.items()})
        return real_run(inputs, outputs)

    backend.run = spy
    results = backend.execute([BackendRequest({"x": x}, ["y"]) for x in xs])
    assert calls == [{"x": (6, 4)}]  # one stacked run
    for x, result in zip(xs, results, strict=True):
        assert not isinstance(result, ConchError), result
        assert result["y"].shape == (x.shape[0], 3)
        np.testing.assert_allclose(result["y"], mlp_reference(x), rtol=1e-5, atol=1e-5)


def test_scalar_io_runs_through_its_reshape(tmp_path):
    # Auto-complete gives a scalar dims [1] reshaped to []: clients send [1], the model takes [].
    backend = loaded(tmp_path, scalar)
    (result,) = backend.execute([BackendRequest({"s": np.array([2.5], np.float32)}, ["out"])])
    assert not isinstance(result, ConchError), result
    np.testing.assert_array_equal(result["out"], np.array([2.5], np.float32))


def test_batched_row_scalars_run_through_their_reshape(tmp_path):
    backend = loaded(tmp_path, row_scalar, config="max_batch_size: 8")
    assert list(backend.spec.config.input[0].dims) == [1]
    xs = [np.arange(n, dtype=np.float32).reshape(n, 1) + n for n in (1, 3)]
    results = backend.execute([BackendRequest({"s": x}, ["out"]) for x in xs])
    for x, r in zip(xs, results, strict=True):
        assert not isinstance(r, ConchError), r
        np.testing.assert_array_equal(r["out"], x * 2)  # [n, 1] back, as the config says


def test_config_reshape_is_applied_both_ways(tmp_path):
    config = """
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
"""
    backend = loaded(tmp_path, square, config=config)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (r,) = backend.execute([BackendRequest({"x": x}, ["y"])])
    assert not isinstance(r, ConchError), r
    want = x.reshape(3, 2, 2).transpose(0, 2, 1).reshape(3, 4)
    np.testing.assert_array_equal(r["y"], want)
    (bad,) = backend.execute([BackendRequest({"x": np.ones((1, 3), np.float32)}, ["y"])])
    assert isinstance(bad, InvalidArgument) and "reshape [2, 2]" in bad.message


def test_execute_non_batching_model_runs_each_request(tmp_path):
    backend = loaded(tmp_path, fixed)
    a = [np.full((2, 3), v, dtype=np.float32) for v in (1.0, -3.5)]
    results = backend.execute([BackendRequest({"a": x}, ["b"]) for x in a])
    for x, r in zip(a, results, strict=True):
        np.testing.assert_array_equal(r["b"], x * 2)


def test_execute_strings(tmp_path):
    backend = loaded(tmp_path, strings)
    text = np.array([[b"hello", "grüße".encode()], [b"", b"x y"]], dtype=object)
    [result] = backend.execute([BackendRequest({"text": text}, ["echo"])])
    out = result["echo"]
    assert out.dtype == object and out.shape == (2, 2)
    assert out.tolist() == text.tolist()
    assert all(isinstance(v, bytes) for v in out.ravel())


def test_execute_non_utf8_string_fails_that_request_only(tmp_path):
    backend = loaded(tmp_path, strings, config="max_batch_size: 4\ndynamic_batching { }")
    good = np.array([[b"a", b"b"]], dtype=object)
    bad = np.array([[b"\xff\xfe", b"b"]], dtype=object)
    res = backend.execute(
        [BackendRequest({"text": good}, ["echo"]), BackendRequest({"text": bad}, ["echo"])]
    )
    # both in one stacked group, so both fail with the same clear 400
    assert all(isinstance(r, InvalidArgument) for r in res)
    assert "UTF-8" in res[0].message
    [alone] = backend.execute([BackendRequest({"text": good}, ["echo"])])
    assert alone["echo"].tolist() == [[b"a", b"b"]]


def test_execute_fp16_and_bool_and_output_subset(tmp_path):
    backend = loaded(tmp_path, half_bool)
    h = np.array([[1.5, -2.25], [0.0, 65504]], dtype=np.float16)
    flag = np.array([[True, False], [False, False]])
    both, only_flag = backend.execute(
        [
            BackendRequest({"h": h, "flag": flag}, ["h_out", "flag_out"]),
            BackendRequest({"h": h[:1], "flag": flag[:1]}, ["flag_out"]),
        ]
    )
    assert both["h_out"].dtype == np.float16
    np.testing.assert_array_equal(both["h_out"], h)
    np.testing.assert_array_equal(both["flag_out"], ~flag)
    assert set(only_flag) == {"flag_out"}
    np.testing.assert_array_equal(only_flag["flag_out"], ~flag[:1])


def test_execute_wrong_dtype_is_a_result_not_an_exception(tmp_path):
    backend = loaded(tmp_path, mlp)
    [res] = backend.execute([BackendRequest({"x": np.zeros((1, 4), dtype=np.float64)}, ["y"])])
    assert isinstance(res, ConchError)
    assert "model 'm'" in res.message


def test_run_with_no_outputs_named_returns_all(tmp_path):
    backend = loaded(tmp_path, half_bool)
    out = backend.run({"h": np.zeros((1, 2), np.float16), "flag": np.zeros((1, 2), bool)}, [])
    assert set(out) == {"h_out", "flag_out"}


# -- load ----------------------------------------------------------------------------------


def test_intra_op_threads_from_parameters(tmp_path):
    backend = loaded(
        tmp_path,
        mlp,
        config='parameters { key: "intra_op_thread_count" value { string_value: "2" } }',
    )
    assert backend.session.get_session_options().intra_op_num_threads == 2
    backend.unload()
    assert backend.session is None


def test_default_intra_op_threads(tmp_path):
    backend = loaded(tmp_path, mlp)
    assert backend.session.get_session_options().intra_op_num_threads == 1


def test_bad_thread_parameter(tmp_path):
    write_model(
        tmp_path,
        "m",
        config='parameters { key: "intra_op_thread_count" value { string_value: "lots" } }',
    )
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["m"]
    backend = OnnxRuntimeBackend(entry.spec(1), InstanceSpec("m_0", "CPU"))
    with pytest.raises(ModelLoadError, match="intra_op_thread_count"):
        backend.load()


def test_load_checks_config_against_model_without_auto_complete(tmp_path):
    write_model(
        tmp_path,
        "m",
        config='platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_INT64 dims: [ 3 ] } ]',
    )
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0, auto_complete=False).scan()[
        "m"
    ]
    assert entry.error is None
    backend = OnnxRuntimeBackend(entry.spec(1), InstanceSpec("m_0", "CPU"))
    with pytest.raises(ModelLoadError, match="output 'y' field data_type is TYPE_INT64"):
        backend.load()


def test_load_missing_input_in_strict_config(tmp_path):
    write_model(
        tmp_path,
        "m",
        half_bool,
        config='platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "h" data_type: TYPE_FP16 dims: [ 2 ] } ]',
    )
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0, auto_complete=False).scan()[
        "m"
    ]
    backend = OnnxRuntimeBackend(entry.spec(1), InstanceSpec("m_0", "CPU"))
    with pytest.raises(ModelLoadError, match="input 'flag'"):
        backend.load()


def test_gpu_available_reports_a_reason():
    ok, reason = gpu_available()
    assert isinstance(ok, bool)
    assert ok or reason


def test_kind_gpu_without_gpu_stack_fails_clearly(tmp_path):
    ok, reason = gpu_available()
    if ok:
        pytest.skip(f"a GPU is usable here; this checks the failure without one ({reason})")
    write_model(tmp_path, "g", config="instance_group [ { kind: KIND_GPU } ]")
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["g"]
    assert entry.error is None, entry.error
    [instance] = entry.instances()
    assert instance.kind == "GPU"
    backend = OnnxRuntimeBackend(entry.spec(1), instance)
    with pytest.raises(ModelLoadError) as info:
        backend.load()
    assert info.value.message == f"model 'g' asks for KIND_GPU but {reason}"
    assert "install conch[gpu]" in info.value.message or "GPU" in reason


@pytest.mark.gpu
def test_kind_gpu_runs_on_a_gpu(tmp_path):
    ok, reason = gpu_available()
    if not ok:
        pytest.skip(reason)
    backend = loaded(
        tmp_path, mlp, config="instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]", kind="GPU"
    )
    assert "CUDAExecutionProvider" in backend.session.get_providers()
    x = np.ones((2, 4), np.float32)
    [res] = backend.execute([BackendRequest({"x": x}, ["y"])])
    # onnxruntime's CUDA provider runs FP32 matrix products in TF32 on Ampere and later (its
    # default, kept as Triton keeps it): about 1e-3 relative, seen 6e-4 on an H100.
    np.testing.assert_allclose(res["y"], mlp_reference(x), rtol=2e-3, atol=2e-3)


def test_auto_complete_reads_a_file_once_until_it_changes(tmp_path, monkeypatch):
    # Repositories are rescanned on every poll: the signature is kept per file identity.
    import conch.backends.onnxruntime as ort_backend

    path = mlp(tmp_path / "model.onnx")
    first = new_config()
    first.name = "m"
    OnnxRuntimeBackend.auto_complete(first, path, default_max_batch_size=4)
    opened = []
    real = ort_backend._ort
    monkeypatch.setattr(ort_backend, "_ort", lambda: opened.append(1) or real())
    again = new_config()
    again.name = "m"
    OnnxRuntimeBackend.auto_complete(again, path, default_max_batch_size=4)
    assert opened == [] and again == first
    fixed(path)  # replaced: read again
    changed = new_config()
    changed.name = "m"
    OnnxRuntimeBackend.auto_complete(changed, path, default_max_batch_size=4)
    assert opened == [1] and changed != first
