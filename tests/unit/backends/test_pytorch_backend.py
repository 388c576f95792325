"""The pytorch backend: Triton's TorchScript naming rules, config checks, load and execute."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conch.backends import BackendRequest, InstanceSpec, backend_class  # noqa: E402
from conch.backends.completion import complete  # noqa: E402
from conch.backends.pytorch import (  # noqa: E402
    Argument,
    PyTorchBackend,
    describe_forward,
    gpu_available,
    named_index,
    plan_io,
)
from conch.core.backend_table import BACKENDS  # noqa: E402
from conch.core.errors import ConchError, Internal, ModelLoadError  # noqa: E402
from conch.core.repository import ModelRepository  # noqa: E402

# ------------------------------------------------------------------ TorchScript models


class Affine(torch.nn.Module):
    """INPUT__0 (N, 4) -> OUTPUT__0 (N, 3) with fixed weights."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w = torch.nn.Parameter(torch.randn(4, 3, generator=g), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w + 1.0


class Sub(torch.nn.Module):
    """forward(x, y) = x - 2 y: the argument order matters."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x - 2.0 * y


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1.0, x.sum(dim=1, keepdim=True)


class ListOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2.0]


class DictIn(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["a"] - inputs["b"]


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Scalar(torch.nn.Module):
    """(N,) -> (N,): the model sees scalars per row (dims [1] reshaped to [])."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3.0


class NoBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=0)


class TakesInt(torch.nn.Module):
    def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return x * k


class ReturnsDict(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"y": x}


@contextlib.contextmanager
def _quiet():
    """torch.jit is deprecated upstream (and still what Triton's pytorch backend loads)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def save(module: torch.nn.Module, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _quiet():
        torch.jit.save(torch.jit.script(module), str(path))
    return path


def tensor(name: str, dtype: str, dims: list[int], extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: {dims} {extra} }}'


def write(
    repo: Path,
    name: str,
    module: torch.nn.Module | None,
    inputs: list[str],
    outputs: list[str],
    *,
    max_batch_size: int = 8,
    extra: str = "",
) -> Path:
    path = repo / name
    if module is not None:
        save(module, path / "1" / "model.pt")
    else:
        (path / "1").mkdir(parents=True, exist_ok=True)
    (path / "config.pbtxt").write_text(
        f'platform: "pytorch_libtorch"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]\n{extra}\n"
    )
    return path


def loaded(repo: Path, name: str, kind: str = "CPU", **kw) -> PyTorchBackend:
    entry = ModelRepository(repo, complete=complete, gpu_count=0, **kw).scan()[name]
    assert entry.error is None, entry.error
    backend = PyTorchBackend(entry.spec(entry.latest()), InstanceSpec(f"{name}_0", kind))
    backend.load()
    return backend


def affine_repo(tmp_path: Path, extra: str = "", name: str = "affine") -> Path:
    write(
        tmp_path,
        name,
        Affine(),
        [tensor("INPUT__0", "TYPE_FP32", [4])],
        [tensor("OUTPUT__0", "TYPE_FP32", [3])],
        extra=extra,
    )
    return tmp_path


def affine_reference(x: np.ndarray) -> np.ndarray:
    return (torch.from_numpy(x) @ Affine().w + 1.0).detach().numpy()


# ------------------------------------------------------------------ registry


def test_registry_points_here():
    assert backend_class("pytorch") is PyTorchBackend
    entry = BACKENDS["pytorch"]
    assert entry.platforms == ("pytorch_libtorch", "libtorch")
    assert entry.default_filename == "model.pt"


@pytest.mark.parametrize("platform", ["pytorch_libtorch", "libtorch"])
def test_both_platform_names_select_pytorch(tmp_path, platform):
    affine_repo(tmp_path)
    cfg = tmp_path / "affine" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("pytorch_libtorch", platform))
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["affine"]
    assert entry.error is None, entry.error
    assert entry.backend == "pytorch"
    assert entry.config.platform == platform
    assert entry.config.backend == "pytorch"


def test_backend_filled_from_model_pt_without_platform(tmp_path):
    affine_repo(tmp_path)
    cfg = tmp_path / "affine" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('platform: "pytorch_libtorch"\n', ""))
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["affine"]
    assert entry.error is None, entry.error
    assert (entry.backend, entry.config.platform) == ("pytorch", "pytorch_libtorch")
    # Triton writes no default_model_filename once it knows the platform (its
    # pytorch/no_name_platform case); the backend still loads model.pt.
    assert entry.config.default_model_filename == ""
    assert entry.spec(1).model_file == tmp_path / "affine" / "1" / "model.pt"


# ------------------------------------------------------------------ naming rules


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("INPUT__0", 0),
        ("OUTPUT__12", 12),
        ("x__3", 3),
        ("INPUT0", None),
        ("INPUT__", None),
        ("INPUT__a", None),
        ("a__b__1", None),  # split at the first "__", as Triton does
        ("INPUT__-1", None),
        ("INPUT__\u0661", None),  # a non-ASCII digit is no index
    ],
)
def test_named_index(name, index):
    assert named_index(name) == index


T = "Tensor"


def args(*names: str, kind: str = "TensorType") -> list[Argument]:
    return [Argument(n, kind, T) for n in names]


def test_plan_inputs_by_index():
    plan = plan_io("m", ["B__1", "A__0"], ["OUTPUT__0"], args("x", "y"), 1)
    assert plan.input_mode == "index"
    assert plan.inputs == {"B__1": 1, "A__0": 0}
    assert (plan.output_mode, plan.outputs) == ("index", {"OUTPUT__0": 0})


def test_plan_inputs_by_forward_argument_names():
    plan = plan_io("m", ["y", "x"], ["OUTPUT__0"], args("x", "y"), 1)
    assert plan.input_mode == "name"
    assert plan.inputs == {"y": 1, "x": 0}


def test_plan_argument_names_win_over_index_names():
    # forward(INPUT__1, INPUT__0): the names match arguments, so they go by name.
    plan = plan_io("m", ["INPUT__0", "INPUT__1"], ["OUTPUT__0"], args("INPUT__1", "INPUT__0"), 1)
    assert plan.input_mode == "name"
    assert plan.inputs == {"INPUT__0": 1, "INPUT__1": 0}


def test_plan_falls_back_to_config_order(caplog):
    with caplog.at_level(logging.WARNING, logger="conch.backends.pytorch"):
        plan = plan_io("m", ["first", "second"], ["out", "aux"], args("x", "y"), 2)
    assert plan.input_mode == "order" and plan.inputs == {"first": 0, "second": 1}
    assert plan.output_mode == "order" and plan.outputs == {"out": 0, "aux": 1}
    assert "config order" in caplog.text and "'m'" in caplog.text


def test_plan_dict_input():
    plan = plan_io("m", ["a", "b"], ["OUTPUT__0"], [Argument("inputs", "DictType", "Dict")], 1)
    assert plan.input_mode == "dict"
    assert set(plan.inputs) == {"a", "b"}


def test_plan_count_mismatch_names_model_and_inputs():
    with pytest.raises(ModelLoadError) as info:
        plan_io("m", ["INPUT__0"], ["OUTPUT__0"], args("x", "y"), 1)
    msg = info.value.message
    assert "model 'm'" in msg and "1 input(s) ['INPUT__0']" in msg and "takes 2" in msg
    assert "forward(Tensor x, Tensor y)" in msg


def test_plan_index_out_of_range():
    with pytest.raises(ModelLoadError, match=r"model 'm': input 'INPUT__2' names argument 2"):
        plan_io("m", ["INPUT__0", "INPUT__2"], ["OUTPUT__0"], args("x", "y"), 1)


def test_plan_duplicate_index():
    with pytest.raises(ModelLoadError, match=r"inputs 'A__0' and 'B__0' both name argument 0"):
        plan_io("m", ["A__0", "B__0"], ["OUTPUT__0"], args("x", "y"), 1)


def test_plan_non_tensor_argument():
    with pytest.raises(ModelLoadError, match=r"model 'm'.*takes 'k' as int"):
        plan_io("m", ["a", "k"], ["OUTPUT__0"], [*args("a"), Argument("k", "IntType", "int")], 1)


def test_plan_output_index_beyond_result():
    with pytest.raises(ModelLoadError) as info:
        plan_io("m", ["INPUT__0"], ["OUTPUT__0", "OUTPUT__2"], args("x"), 2)
    assert info.value.message == (
        "model 'm': output 'OUTPUT__2' is element 2 of forward()'s result, "
        "but the model returns 2 tensors"
    )
    with pytest.raises(ModelLoadError, match="returns a single tensor"):
        plan_io("m", ["INPUT__0"], ["OUTPUT__1"], args("x"), 1)


def test_plan_unknown_result_length_is_checked_at_run():
    plan = plan_io("m", ["INPUT__0"], ["OUTPUT__5"], args("x"), None)
    assert plan.outputs == {"OUTPUT__5": 5}


@pytest.mark.parametrize(
    ("module", "arguments", "returns"),
    [
        (Affine(), [("x", "TensorType")], 1),
        (Sub(), [("x", "TensorType"), ("y", "TensorType")], 1),
        (Pair(), [("x", "TensorType")], 2),
        (ListOut(), [("x", "TensorType")], None),
        (DictIn(), [("inputs", "DictType")], 1),
    ],
)
def test_describe_forward_reads_the_schema(tmp_path, module, arguments, returns):
    path = save(module, tmp_path / "m.pt")
    with _quiet():
        loaded_module = torch.jit.load(str(path))
    got_args, got_returns = describe_forward(loaded_module, "m")
    assert [(a.name, a.kind) for a in got_args] == arguments
    assert got_returns == returns


def test_describe_forward_refuses_dict_results(tmp_path):
    path = save(ReturnsDict(), tmp_path / "m.pt")
    with _quiet():
        module = torch.jit.load(str(path))
    with pytest.raises(ModelLoadError, match=r"model 'm': forward\(\) returns Dict"):
        describe_forward(module, "m")


# ------------------------------------------------------------------ config checks


def test_incomplete_config_is_refused_by_the_repository(tmp_path):
    write(tmp_path, "m", Affine(), [], [tensor("OUTPUT__0", "TYPE_FP32", [3])])
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["m"]
    assert entry.error is not None
    assert "model 'm': the pytorch backend needs a complete config" in entry.error
    assert "list every input" in entry.error


def test_missing_config_entirely(tmp_path):
    save(Affine(), tmp_path / "m" / "1" / "model.pt")
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["m"]
    assert entry.backend == "pytorch"
    assert "needs a complete config" in (entry.error or "")


@pytest.mark.parametrize("where", ["input", "output"])
def test_type_string_of_two_dimensions_is_refused_as_triton_does(tmp_path, where):
    # Triton's rule: a string tensor has one dimension in all, batch included, so a model
    # that batches needs reshape: { shape: [ ] } (tests/unit/backends/test_pytorch_strings.py
    # serves those).
    ins = [
        tensor(
            "TEXT__0" if where == "input" else "INPUT__0",
            "TYPE_STRING" if where == "input" else "TYPE_FP32",
            [1],
        )
    ]
    outs = [
        tensor(
            "LABEL__0" if where == "output" else "OUTPUT__0",
            "TYPE_STRING" if where == "output" else "TYPE_FP32",
            [1],
        )
    ]
    write(tmp_path, "m", Identity(), ins, outs)
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["m"]
    name = "TEXT__0" if where == "input" else "LABEL__0"
    assert entry.error is not None
    assert (
        f"Triton only supports 1 dimensional List of String as {where} for '{name}' for model 'm'"
    ) in entry.error
    assert "reshape: { shape: [ ] }" in entry.error


def test_type_string_of_two_dimensions_is_refused_at_load_without_auto_complete(tmp_path):
    write(
        tmp_path,
        "m",
        Identity(),
        [tensor("TEXT__0", "TYPE_STRING", [2, 3])],
        [tensor("OUTPUT__0", "TYPE_FP32", [1])],
        max_batch_size=0,
    )
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0, auto_complete=False).scan()[
        "m"
    ]
    assert entry.error is None  # the repository alone does not know the backend's limits
    backend = PyTorchBackend(entry.spec(1), InstanceSpec("m_0", "CPU"))
    with pytest.raises(
        ModelLoadError, match=r"1 dimensional List of String as input for 'TEXT__0'"
    ):
        backend.load()


def test_config_names_that_do_not_fit_the_model_fail_at_load(tmp_path):
    write(
        tmp_path,
        "m",
        Sub(),
        [tensor("INPUT__0", "TYPE_FP32", [4])],
        [tensor("OUTPUT__0", "TYPE_FP32", [4])],
    )
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["m"]
    assert entry.error is None
    backend = PyTorchBackend(entry.spec(1), InstanceSpec("m_0", "CPU"))
    with pytest.raises(ModelLoadError, match=r"model 'm': the config lists 1 input"):
        backend.load()


def test_not_torchscript(tmp_path):
    write(
        tmp_path,
        "m",
        None,
        [tensor("INPUT__0", "TYPE_FP32", [4])],
        [tensor("OUTPUT__0", "TYPE_FP32", [3])],
    )
    torch.save({"w": torch.ones(2)}, str(tmp_path / "m" / "1" / "model.pt"))
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["m"]
    backend = PyTorchBackend(entry.spec(1), InstanceSpec("m_0", "CPU"))
    with pytest.raises(ModelLoadError) as info:
        backend.load()
    assert "model 'm' version 1: torch cannot load" in info.value.message
    assert "TorchScript" in info.value.message


def test_bad_thread_parameter(tmp_path):
    affine_repo(
        tmp_path,
        extra='parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "many" } }',
    )
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["affine"]
    backend = PyTorchBackend(entry.spec(1), InstanceSpec("affine_0", "CPU"))
    with pytest.raises(
        ModelLoadError, match="INTRA_OP_THREAD_COUNT' must be an integer, got 'many'"
    ):
        backend.load()


def test_bad_bool_parameter(tmp_path):
    affine_repo(
        tmp_path, extra='parameters { key: "INFERENCE_MODE" value: { string_value: "maybe" } }'
    )
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["affine"]
    backend = PyTorchBackend(entry.spec(1), InstanceSpec("affine_0", "CPU"))
    with pytest.raises(ModelLoadError, match="INFERENCE_MODE' must be true or false"):
        backend.load()


# ------------------------------------------------------------------ execute


def test_execute_matches_torch_and_batches_requests_of_different_sizes(tmp_path):
    backend = loaded(affine_repo(tmp_path), "affine")
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (1, 3, 2)]
    seen = []
    run = backend.run

    def spy(inputs, outputs):
        seen.append({k: v.shape for k, v in inputs.items()})
        return run(inputs, outputs)

    backend.run = spy
    results = backend.execute([BackendRequest({"INPUT__0": x}, ["OUTPUT__0"]) for x in xs])
    assert seen == [{"INPUT__0": (6, 4)}]  # one stacked run
    for x, res in zip(xs, results, strict=True):
        assert res["OUTPUT__0"].shape == (len(x), 3)
        np.testing.assert_allclose(res["OUTPUT__0"], affine_reference(x), rtol=1e-6, atol=1e-6)


def test_inputs_by_forward_argument_names(tmp_path):
    write(
        tmp_path,
        "sub",
        Sub(),
        # listed in the other order than forward(x, y): names decide, not positions
        [tensor("y", "TYPE_FP32", [2]), tensor("x", "TYPE_FP32", [2])],
        [tensor("OUTPUT__0", "TYPE_FP32", [2])],
    )
    backend = loaded(tmp_path, "sub")
    assert backend.plan.input_mode == "name"
    x = np.array([[10.0, 20.0]], np.float32)
    y = np.array([[1.0, 2.0]], np.float32)
    [res] = backend.execute([BackendRequest({"y": y, "x": x}, ["OUTPUT__0"])])
    np.testing.assert_array_equal(res["OUTPUT__0"], x - 2 * y)


def test_inputs_by_index_against_argument_order(tmp_path):
    write(
        tmp_path,
        "sub",
        Sub(),
        [tensor("B__1", "TYPE_FP32", [2]), tensor("A__0", "TYPE_FP32", [2])],
        [tensor("OUTPUT__0", "TYPE_FP32", [2])],
    )
    backend = loaded(tmp_path, "sub")
    a = np.array([[10.0, 20.0]], np.float32)
    b = np.array([[1.0, 2.0]], np.float32)
    [res] = backend.execute([BackendRequest({"A__0": a, "B__1": b}, ["OUTPUT__0"])])
    np.testing.assert_array_equal(res["OUTPUT__0"], a - 2 * b)


def test_tuple_outputs_by_index_and_subset(tmp_path):
    write(
        tmp_path,
        "pair",
        Pair(),
        [tensor("INPUT__0", "TYPE_FP32", [3])],
        # listed out of order: OUTPUT__1 is still element 1
        [tensor("OUTPUT__1", "TYPE_FP32", [1]), tensor("OUTPUT__0", "TYPE_FP32", [3])],
    )
    backend = loaded(tmp_path, "pair")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    [both, only] = backend.execute(
        [
            BackendRequest({"INPUT__0": x}, ["OUTPUT__0", "OUTPUT__1"]),
            BackendRequest({"INPUT__0": x + 1}, ["OUTPUT__1"]),
        ]
    )
    np.testing.assert_array_equal(both["OUTPUT__0"], x + 1)
    np.testing.assert_array_equal(both["OUTPUT__1"], x.sum(1, keepdims=True))
    assert set(only) == {"OUTPUT__1"}
    np.testing.assert_array_equal(only["OUTPUT__1"], (x + 1).sum(1, keepdims=True))


def test_dict_input(tmp_path):
    write(
        tmp_path,
        "d",
        DictIn(),
        [tensor("a", "TYPE_FP32", [2]), tensor("b", "TYPE_FP32", [2])],
        [tensor("OUTPUT__0", "TYPE_FP32", [2])],
    )
    backend = loaded(tmp_path, "d")
    assert backend.plan.input_mode == "dict"
    a, b = np.ones((1, 2), np.float32) * 5, np.ones((1, 2), np.float32)
    [res] = backend.execute([BackendRequest({"a": a, "b": b}, ["OUTPUT__0"])])
    np.testing.assert_array_equal(res["OUTPUT__0"], a - b)


def test_list_output_index_beyond_result_fails_the_request(tmp_path):
    write(
        tmp_path,
        "l",
        ListOut(),
        [tensor("INPUT__0", "TYPE_FP32", [2])],
        [tensor("OUTPUT__0", "TYPE_FP32", [2]), tensor("OUTPUT__1", "TYPE_FP32", [2])],
    )
    backend = loaded(tmp_path, "l")
    x = np.ones((1, 2), np.float32)
    [ok] = backend.execute([BackendRequest({"INPUT__0": x}, ["OUTPUT__0"])])
    np.testing.assert_array_equal(ok["OUTPUT__0"], x * 2)
    [err] = backend.execute([BackendRequest({"INPUT__0": x}, ["OUTPUT__1"])])
    assert isinstance(err, Internal)
    assert "output 'OUTPUT__1' is element 1" in err.message and "1 element(s)" in err.message


def test_output_dtype_mismatch_is_an_error_naming_the_output(tmp_path):
    write(
        tmp_path,
        "m",
        Identity(),
        [tensor("INPUT__0", "TYPE_FP32", [2])],
        [tensor("OUTPUT__0", "TYPE_INT64", [2])],
    )
    backend = loaded(tmp_path, "m")
    [res] = backend.execute(
        [BackendRequest({"INPUT__0": np.ones((1, 2), np.float32)}, ["OUTPUT__0"])]
    )
    assert isinstance(res, ConchError)
    assert res.message == (
        "model 'm': output 'OUTPUT__0' is TYPE_INT64 in the config but the model produced "
        "torch.float32"
    )


def test_output_without_batch_dimension_is_an_error(tmp_path):
    write(
        tmp_path,
        "m",
        NoBatch(),
        [tensor("INPUT__0", "TYPE_FP32", [2])],
        [tensor("OUTPUT__0", "TYPE_FP32", [2])],
    )
    backend = loaded(tmp_path, "m")
    [res] = backend.execute(
        [BackendRequest({"INPUT__0": np.ones((3, 2), np.float32)}, ["OUTPUT__0"])]
    )
    assert isinstance(res, Internal) and "batch has 3 row(s)" in res.message


def test_non_batching_model(tmp_path):
    write(
        tmp_path,
        "m",
        NoBatch(),
        [tensor("INPUT__0", "TYPE_FP32", [3, 2])],
        [tensor("OUTPUT__0", "TYPE_FP32", [2])],
        max_batch_size=0,
    )
    backend = loaded(tmp_path, "m")
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    [a, b] = backend.execute(
        [
            BackendRequest({"INPUT__0": x}, ["OUTPUT__0"]),
            BackendRequest({"INPUT__0": x * 2}, ["OUTPUT__0"]),
        ]
    )
    np.testing.assert_array_equal(a["OUTPUT__0"], x.sum(0))
    np.testing.assert_array_equal(b["OUTPUT__0"], (x * 2).sum(0))


def test_scalar_reshape(tmp_path):
    write(
        tmp_path,
        "s",
        Scalar(),
        [tensor("INPUT__0", "TYPE_FP32", [1], "reshape: { shape: [ ] }")],
        [tensor("OUTPUT__0", "TYPE_FP32", [1], "reshape: { shape: [ ] }")],
    )
    backend = loaded(tmp_path, "s")
    seen = []
    module = backend.module

    def spy(*args):
        seen.append(tuple(args[0].shape))
        return module(*args)

    backend.module = spy
    x = np.array([[1.0], [2.0]], np.float32)
    [res] = backend.execute([BackendRequest({"INPUT__0": x}, ["OUTPUT__0"])])
    assert seen == [(2,)]
    np.testing.assert_array_equal(res["OUTPUT__0"], x * 3)


@pytest.mark.parametrize(
    ("dtype", "array"),
    [
        ("TYPE_INT64", np.array([[1, -2]], np.int64)),
        ("TYPE_INT32", np.array([[7, 8]], np.int32)),
        ("TYPE_UINT8", np.array([[0, 255]], np.uint8)),
        ("TYPE_BOOL", np.array([[True, False]])),
        ("TYPE_FP16", np.array([[0.5, -1.25]], np.float16)),
        ("TYPE_FP64", np.array([[0.1, 1e300]], np.float64)),
        # BF16 travels as its uint16 bit patterns: 1.5 and -2.0
        ("TYPE_BF16", np.array([[0x3FC0, 0xC000]], np.uint16)),
    ],
)
def test_identity_round_trips_types(tmp_path, dtype, array):
    write(
        tmp_path,
        "id",
        Identity(),
        [tensor("INPUT__0", dtype, [2])],
        [tensor("OUTPUT__0", dtype, [2])],
    )
    backend = loaded(tmp_path, "id")
    [res] = backend.execute([BackendRequest({"INPUT__0": array}, ["OUTPUT__0"])])
    assert not isinstance(res, ConchError), res
    assert res["OUTPUT__0"].dtype == array.dtype
    np.testing.assert_array_equal(res["OUTPUT__0"], array)


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_inputs_and_outputs_are_not_copied_on_cpu(tmp_path):
    write(
        tmp_path,
        "id",
        Identity(),
        [tensor("INPUT__0", "TYPE_FP32", [4])],
        [tensor("OUTPUT__0", "TYPE_FP32", [4])],
    )
    backend = loaded(tmp_path, "id")
    raw = np.arange(8, dtype=np.float32).tobytes()
    x = np.frombuffer(raw, dtype=np.float32).reshape(2, 4)  # read-only, like a request body
    out = backend.run({"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    assert np.shares_memory(out, x)


def test_runs_under_inference_mode_by_default(tmp_path):
    backend = loaded(affine_repo(tmp_path), "affine")
    modes = []
    module = backend.module

    def spy(*args):
        modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return module(*args)

    backend.module = spy
    backend.run({"INPUT__0": np.ones((1, 4), np.float32)}, ["OUTPUT__0"])
    assert modes == [(True, False)]


def test_inference_mode_off_still_disables_grad(tmp_path):
    extra = 'parameters { key: "INFERENCE_MODE" value: { string_value: "false" } }'
    backend = loaded(affine_repo(tmp_path, extra=extra), "affine")
    modes = []
    module = backend.module

    def spy(*args):
        modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return module(*args)

    backend.module = spy
    backend.run({"INPUT__0": np.ones((1, 4), np.float32)}, ["OUTPUT__0"])
    assert modes == [(False, False)]


def test_intra_op_threads_default_and_parameter(tmp_path):
    before = torch.get_num_threads()
    try:
        backend = loaded(affine_repo(tmp_path / "a"), "affine")
        backend.run({"INPUT__0": np.ones((1, 4), np.float32)}, ["OUTPUT__0"])
        assert backend._threads == 1 and torch.get_num_threads() == 1
        extra = 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "2" } }'
        backend = loaded(affine_repo(tmp_path / "b", extra=extra), "affine")
        backend.run({"INPUT__0": np.ones((1, 4), np.float32)}, ["OUTPUT__0"])
        assert backend._threads == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_interop_threads_are_set_once_per_process(monkeypatch):
    from conch.backends import pytorch

    calls = []
    monkeypatch.setattr(pytorch, "_interop_threads", None)
    monkeypatch.setattr(torch, "set_num_interop_threads", lambda n: calls.append(n))
    pytorch.set_interop_threads_once(1)
    pytorch.set_interop_threads_once(1)
    pytorch.set_interop_threads_once(3)  # later models cannot change it: logged, ignored
    assert calls == [1]


def test_interop_threads_after_work_started_is_not_an_error(monkeypatch):
    from conch.backends import pytorch

    def refuse(n):
        raise RuntimeError("cannot set number of interop threads after parallel work has started")

    monkeypatch.setattr(pytorch, "_interop_threads", None)
    monkeypatch.setattr(torch, "set_num_interop_threads", refuse)
    pytorch.set_interop_threads_once(1)  # no exception
    assert pytorch._interop_threads == torch.get_num_interop_threads()


def test_unload_releases_the_module(tmp_path):
    backend = loaded(affine_repo(tmp_path), "affine")
    backend.unload()
    assert backend.module is None


# ------------------------------------------------------------------ GPU


def test_gpu_available_reports_a_reason():
    ok, reason = gpu_available()
    assert isinstance(ok, bool)
    assert ok or reason


def test_kind_gpu_without_gpu_fails_clearly(tmp_path):
    ok, reason = gpu_available()
    if ok:
        pytest.skip(f"a GPU is usable here; this checks the failure without one ({reason})")
    affine_repo(tmp_path, extra="instance_group [ { kind: KIND_GPU } ]")
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["affine"]
    assert entry.error is None, entry.error
    [instance] = entry.instances()
    assert instance.kind == "GPU"
    backend = PyTorchBackend(entry.spec(1), instance)
    with pytest.raises(ModelLoadError) as info:
        backend.load()
    assert info.value.message == f"model 'affine' asks for KIND_GPU but {reason}"


@pytest.mark.gpu
def test_kind_gpu_runs_on_a_gpu(tmp_path):
    ok, reason = gpu_available()
    if not ok:
        pytest.skip(reason)
    affine_repo(tmp_path, extra="instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]")
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=1).scan()["affine"]
    assert entry.error is None, entry.error
    backend = PyTorchBackend(entry.spec(1), InstanceSpec("affine_0", "GPU", 0))
    backend.load()
    assert backend.device.type == "cuda"
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    [res] = backend.execute([BackendRequest({"INPUT__0": x}, ["OUTPUT__0"])])
    np.testing.assert_allclose(res["OUTPUT__0"], affine_reference(x), rtol=1e-4, atol=1e-4)
    backend.unload()


@pytest.mark.gpu
def test_kind_gpu_device_beyond_visible(tmp_path):
    ok, reason = gpu_available()
    if not ok:
        pytest.skip(reason)
    affine_repo(tmp_path, extra="instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]")
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=1).scan()["affine"]
    backend = PyTorchBackend(entry.spec(1), InstanceSpec("affine_0", "GPU", 99))
    with pytest.raises(ModelLoadError, match="asks for GPU 99"):
        backend.load()
