"""The pytorch backend's TYPE_STRING tensors, as Triton's passes them to TorchScript.

Triton's pytorch backend (``src/pt/model_instance_state.cc``) hands a BYTES input to
``forward()`` as one ``List[str]`` holding every element of the batch, and turns a
``List[str]`` result (bare, or an element of a tuple) into a 1-D BYTES output; at load it
refuses a string tensor of more than one dimension, batch included.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_string_models import Label, Mixed, Upper  # noqa: E402

from conch.backends import BackendRequest  # noqa: E402
from conch.backends.completion import complete  # noqa: E402
from conch.backends.pytorch import (  # noqa: E402
    Argument,
    describe_forward,
    plan_io,
    returns_string_list,
)
from conch.core.errors import ConchError, Internal, ModelLoadError  # noqa: E402
from conch.core.repository import ModelRepository  # noqa: E402
from tests.unit.backends.test_pytorch_backend import (  # noqa: E402
    _quiet,
    loaded,
    save,
    tensor,
    write,
)

# ------------------------------------------------------------------ TorchScript models


class AddStrings(torch.nn.Module):
    """Triton's qa addsub on strings (gen_qa_models.py, libtorch_nobatch_object_object_object)."""

    def forward(self, INPUT0: list[str], INPUT1: list[str]) -> tuple[list[str], list[str]]:
        a = torch.tensor([int(i) for i in INPUT0])
        b = torch.tensor([int(i) for i in INPUT1])
        return [str(int(i)) for i in a + b], [str(int(i)) for i in a - b]


class Halve(torch.nn.Module):
    """Returns half as many strings as it is given (a model that breaks the batch rule)."""

    def forward(self, x: list[str]) -> list[str]:
        return x[: len(x) // 2]


class StringAsTensor(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class DictStrings(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["a"]


class BadUtf8(torch.nn.Module):
    def forward(self, x: list[str]) -> list[str]:
        return x


def objects(*items: bytes) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


RESHAPE = "reshape: { shape: [ ] }"


def upper_repo(tmp_path: Path, *, batched: bool) -> Path:
    if batched:
        write(
            tmp_path,
            "upper",
            Upper(),
            [tensor("TEXT__0", "TYPE_STRING", [1], RESHAPE)],
            [tensor("OUT__0", "TYPE_STRING", [1], RESHAPE)],
            max_batch_size=8,
        )
    else:
        write(
            tmp_path,
            "upper",
            Upper(),
            [tensor("TEXT__0", "TYPE_STRING", [-1])],
            [tensor("OUT__0", "TYPE_STRING", [-1])],
            max_batch_size=0,
        )
    return tmp_path


def only(results: list) -> dict[str, np.ndarray]:
    (result,) = results
    assert not isinstance(result, ConchError), result
    return result


# ------------------------------------------------------------------ schema and plan


def test_describe_forward_takes_list_str_arguments_and_results(tmp_path):
    for module, arguments, returns, bare in [
        (Upper(), [("TEXT__0", "ListType", "List[str]")], 1, True),
        (
            Mixed(),
            [("words", "ListType", "List[str]"), ("scale", "TensorType", "Tensor")],
            2,
            False,
        ),
        (Label(), [("x", "TensorType", "Tensor")], 2, False),
    ]:
        path = save(module, tmp_path / f"{type(module).__name__}.pt")
        with _quiet():
            scripted = torch.jit.load(str(path))
        got_args, got_returns = describe_forward(scripted, "m")
        assert [(a.name, a.kind, a.type) for a in got_args] == arguments
        assert got_returns == returns
        assert returns_string_list(scripted) is bare


def test_plan_accepts_list_arguments_as_triton_does():
    arguments = [Argument("words", "ListType", "List[str]"), Argument("scale", "TensorType", "T")]
    plan = plan_io("m", ["words", "scale"], ["OUTPUT__0", "OUTPUT__1"], arguments, 2)
    assert (plan.input_mode, plan.inputs) == ("name", {"words": 0, "scale": 1})
    # Triton refuses other kinds (its ValidateInputs): an int argument still is.
    with pytest.raises(ModelLoadError, match=r"takes 'k' as int.*List\[str\]"):
        plan_io(
            "m", ["words", "k"], ["OUTPUT__0"], [arguments[0], Argument("k", "IntType", "int")], 1
        )


# ------------------------------------------------------------------ config checks


@pytest.mark.parametrize(
    ("dims", "extra", "max_batch_size"),
    [([-1], "", 0), ([16], "", 0), ([1], RESHAPE, 8), ([1], "reshape: { shape: [ -1 ] }", 0)],
)
def test_one_dimensional_string_tensors_load(tmp_path, dims, extra, max_batch_size):
    write(
        tmp_path,
        "m",
        Upper(),
        [tensor("TEXT__0", "TYPE_STRING", dims, extra)],
        [tensor("OUT__0", "TYPE_STRING", dims, extra)],
        max_batch_size=max_batch_size,
    )
    backend = loaded(tmp_path, "m")
    assert backend.module is not None


@pytest.mark.parametrize(
    ("dims", "extra", "max_batch_size"),
    [([1], "", 8), ([-1], "", 8), ([2, 3], "", 0), ([6], "reshape: { shape: [ 2, 3 ] }", 0)],
)
def test_string_tensors_of_more_dimensions_are_refused(tmp_path, dims, extra, max_batch_size):
    write(
        tmp_path,
        "m",
        Upper(),
        [tensor("TEXT__0", "TYPE_FP32", [1], RESHAPE if max_batch_size else "")],
        [tensor("OUT__0", "TYPE_STRING", dims, extra)],
        max_batch_size=max_batch_size,
    )
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["m"]
    assert entry.error is not None
    assert (
        "Triton only supports 1 dimensional List of String as output for 'OUT__0' for model 'm'"
        in entry.error
    )


def test_string_sequence_control_is_refused_as_triton_does(tmp_path):
    write(
        tmp_path,
        "m",
        Upper(),
        [tensor("TEXT__0", "TYPE_STRING", [-1])],
        [tensor("OUT__0", "TYPE_STRING", [-1])],
        max_batch_size=0,
        extra=(
            "sequence_batching { control_input [ { name: 'CORRID__1' control [ { kind: "
            "CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ] }"
        ),
    )
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["m"]
    assert entry.error is not None
    assert "'CORRID__1' type 'TYPE_STRING' is not supported by PyTorch" in entry.error


def test_type_mismatch_between_config_and_argument_loads_with_a_warning(tmp_path, caplog):
    # Triton loads it too (its ValidateInputs checks kinds, not element types).
    write(
        tmp_path,
        "m",
        StringAsTensor(),
        [tensor("x", "TYPE_STRING", [-1])],
        [tensor("OUTPUT__0", "TYPE_FP32", [-1])],
        max_batch_size=0,
    )
    with caplog.at_level(logging.WARNING, logger="conch.backends.pytorch"):
        backend = loaded(tmp_path, "m")
    assert "input 'x' is TYPE_STRING but goes to forward() argument 'x' of type Tensor" in (
        caplog.text
    )
    (result,) = backend.execute([BackendRequest({"x": objects(b"a")}, ["OUTPUT__0"])])
    assert isinstance(result, Internal)
    assert "List[str]" in result.message or "Tensor" in result.message


# ------------------------------------------------------------------ execute


def test_non_batching_strings_round_trip_as_one_list(tmp_path):
    backend = loaded(upper_repo(tmp_path, batched=False), "upper")
    text = objects(b"abc", "caf\u00e9".encode(), b"")
    out = only(backend.execute([BackendRequest({"TEXT__0": text}, ["OUT__0"])]))["OUT__0"]
    # 1-D, one string per element; len() counts bytes, as in Triton's std::string.
    assert out.dtype == object and out.shape == (3,)
    # (TorchScript upper-cases ASCII only: it works on the bytes.)
    assert out.tolist() == [b"ABC:3", "CAF\u00e9:5".encode(), b":0"]
    assert all(isinstance(s, bytes) for s in out)


def test_batched_strings_split_back_per_request(tmp_path):
    # Two requests in one execution: one List[str] of 3 elements for forward(), and each
    # request its own rows back, in the config's shape [rows, 1].
    backend = loaded(upper_repo(tmp_path, batched=True), "upper")
    first = objects(b"a", b"bb").reshape(2, 1)
    second = objects(b"ccc").reshape(1, 1)
    seen: list[list[str]] = []
    real = backend.module

    def spy(*args):
        seen.append(list(args[0]))
        return real(*args)

    backend.module = spy
    results = backend.execute(
        [
            BackendRequest({"TEXT__0": first}, ["OUT__0"]),
            BackendRequest({"TEXT__0": second}, ["OUT__0"]),
        ]
    )
    assert seen == [[b"a", b"bb", b"ccc"]]
    a, b = (r["OUT__0"] for r in results)
    assert a.shape == (2, 1) and a.ravel().tolist() == [b"A:1", b"BB:2"]
    assert b.shape == (1, 1) and b.ravel().tolist() == [b"CCC:3"]


def test_mixed_string_and_numeric_inputs_and_outputs(tmp_path):
    write(
        tmp_path,
        "mixed",
        Mixed(),
        [tensor("words", "TYPE_STRING", [-1]), tensor("scale", "TYPE_FP32", [1])],
        [tensor("OUTPUT__0", "TYPE_STRING", [-1]), tensor("OUTPUT__1", "TYPE_FP32", [-1])],
        max_batch_size=0,
    )
    backend = loaded(tmp_path, "mixed")
    request = {"words": objects(b"hi", b"there"), "scale": np.array([2.0], dtype=np.float32)}
    out = only(backend.execute([BackendRequest(request, ["OUTPUT__0", "OUTPUT__1"])]))
    assert out["OUTPUT__0"].tolist() == [b"hi!", b"there!"]
    np.testing.assert_array_equal(out["OUTPUT__1"], np.array([4.0, 10.0], dtype=np.float32))
    # A subset: the numeric output alone.
    out = only(backend.execute([BackendRequest(request, ["OUTPUT__1"])]))
    assert list(out) == ["OUTPUT__1"]


def test_numeric_input_string_output_in_a_batch(tmp_path):
    write(
        tmp_path,
        "label",
        Label(),
        [tensor("INPUT__0", "TYPE_FP32", [3])],
        [
            tensor("OUTPUT__0", "TYPE_INT64", [1], RESHAPE),
            tensor("OUTPUT__1", "TYPE_STRING", [1], RESHAPE),
        ],
        max_batch_size=4,
    )
    backend = loaded(tmp_path, "label")
    x = np.array([[0, 5, 1], [9, 0, 0]], dtype=np.float32)
    out = only(backend.execute([BackendRequest({"INPUT__0": x}, ["OUTPUT__0", "OUTPUT__1"])]))
    assert out["OUTPUT__1"].shape == (2, 1)
    assert out["OUTPUT__1"].ravel().tolist() == [b"label1", b"label0"]
    assert out["OUTPUT__0"].ravel().tolist() == [1, 0]


def test_triton_qa_string_addsub(tmp_path):
    # gen_qa_models.py's libtorch_nobatch_object_object_object: dims [16], no batching.
    write(
        tmp_path,
        "addsub",
        AddStrings(),
        [tensor("INPUT0", "TYPE_STRING", [16]), tensor("INPUT1", "TYPE_STRING", [16])],
        [tensor("OUTPUT__0", "TYPE_STRING", [16]), tensor("OUTPUT__1", "TYPE_STRING", [16])],
        max_batch_size=0,
    )
    backend = loaded(tmp_path, "addsub")
    a = objects(*(str(i).encode() for i in range(16)))
    b = objects(*(b"1" for _ in range(16)))
    out = only(
        backend.execute([BackendRequest({"INPUT0": a, "INPUT1": b}, ["OUTPUT__0", "OUTPUT__1"])])
    )
    assert out["OUTPUT__0"].shape == (16,)
    assert out["OUTPUT__0"].tolist() == [str(i + 1).encode() for i in range(16)]
    assert out["OUTPUT__1"].tolist() == [str(i - 1).encode() for i in range(16)]


def test_non_utf8_input_bytes_reach_the_model_as_they_came(tmp_path):
    # Triton gives its std::string the request's bytes; torch takes bytes for str the same.
    class Length(torch.nn.Module):
        def forward(self, x: list[str]) -> torch.Tensor:
            return torch.tensor([len(s) for s in x])

    write(
        tmp_path,
        "length",
        Length(),
        [tensor("x", "TYPE_STRING", [-1])],
        [tensor("OUTPUT__0", "TYPE_INT64", [-1])],
        max_batch_size=0,
    )
    backend = loaded(tmp_path, "length")
    out = only(backend.execute([BackendRequest({"x": objects(b"\xff\xfe", b"ok")}, ["OUTPUT__0"])]))
    assert out["OUTPUT__0"].tolist() == [2, 2]


def test_non_utf8_string_result_fails_the_request_clearly(tmp_path):
    write(
        tmp_path,
        "echo",
        BadUtf8(),
        [tensor("x", "TYPE_STRING", [-1])],
        [tensor("OUTPUT__0", "TYPE_STRING", [-1])],
        max_batch_size=0,
    )
    backend = loaded(tmp_path, "echo")
    (result,) = backend.execute([BackendRequest({"x": objects(b"\xff")}, ["OUTPUT__0"])])
    assert isinstance(result, Internal)
    assert "model 'echo': forward() returned a string that is not UTF-8" in result.message


def test_string_result_that_does_not_fit_the_batch_is_an_error(tmp_path):
    write(
        tmp_path,
        "halve",
        Halve(),
        [tensor("x", "TYPE_STRING", [1], RESHAPE)],
        [tensor("OUTPUT__0", "TYPE_STRING", [1], RESHAPE)],
        max_batch_size=8,
    )
    backend = loaded(tmp_path, "halve")
    (result,) = backend.execute(
        [BackendRequest({"x": objects(b"a", b"b").reshape(2, 1)}, ["OUTPUT__0"])]
    )
    assert isinstance(result, Internal)
    assert "output 'OUTPUT__0' has shape [1], but the batch has 2 row(s)" in result.message


def test_config_and_result_types_must_agree(tmp_path):
    # A List[str] result declared numeric, and a tensor result declared TYPE_STRING.
    write(
        tmp_path,
        "upper",
        Upper(),
        [tensor("TEXT__0", "TYPE_STRING", [-1])],
        [tensor("OUT__0", "TYPE_FP32", [-1])],
        max_batch_size=0,
    )
    backend = loaded(tmp_path, "upper")
    (result,) = backend.execute([BackendRequest({"TEXT__0": objects(b"a")}, ["OUT__0"])])
    assert isinstance(result, Internal)
    assert "output 'OUT__0'" in result.message and "a list of str" in result.message
    assert "TYPE_FP32" in result.message

    write(
        tmp_path,
        "ident",
        StringAsTensor(),
        [tensor("x", "TYPE_FP32", [-1])],
        [tensor("OUTPUT__0", "TYPE_STRING", [-1])],
        max_batch_size=0,
    )
    backend = loaded(tmp_path, "ident")
    (result,) = backend.execute(
        [BackendRequest({"x": np.ones(2, dtype=np.float32)}, ["OUTPUT__0"])]
    )
    assert isinstance(result, Internal)
    assert "output 'OUTPUT__0' is TYPE_STRING in the config" in result.message


def test_strings_into_a_dict_argument_fail_the_request_clearly(tmp_path):
    write(
        tmp_path,
        "dict",
        DictStrings(),
        [tensor("a", "TYPE_STRING", [-1])],
        [tensor("OUTPUT__0", "TYPE_FP32", [-1])],
        max_batch_size=0,
    )
    backend = loaded(tmp_path, "dict")
    (result,) = backend.execute([BackendRequest({"a": objects(b"x")}, ["OUTPUT__0"])])
    assert isinstance(result, Internal)
    assert "input(s) ['a'] are TYPE_STRING, but forward() takes a single Dict" in result.message


def test_warmup_of_a_string_model(tmp_path):
    # What conch's warmup feeds (empty BYTES elements) runs through a string model.
    backend = loaded(upper_repo(tmp_path, batched=True), "upper")
    zeros = objects(b"", b"").reshape(2, 1)
    out = only(backend.execute([BackendRequest({"TEXT__0": zeros}, ["OUT__0"])]))["OUT__0"]
    assert out.ravel().tolist() == [b":0", b":0"]
