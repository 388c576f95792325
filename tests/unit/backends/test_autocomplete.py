"""The auto-complete core and config readers the backends share (conch.backends.autocomplete)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from conch.backends import autocomplete, onnxruntime, pytorch, tensorrt
from conch.backends.autocomplete import Hooks, check_and_fill, int_parameter
from conch.core.errors import ModelLoadError
from conch.core.model_config import new_config, parse_config


@dataclass(frozen=True)
class T:
    name: str
    dtype: str
    shape: tuple[int, ...]


def config(text: str = "", name: str = "m"):
    cfg = parse_config(text, model=name, source="test") if text else new_config()
    cfg.name = name
    return cfg


def params(value: str):
    cfg = config()
    cfg.parameters["n"].string_value = value
    return cfg


# -- int_parameter: one reader, Triton's whitespace rule ---------------------------------


@pytest.mark.parametrize("value", ["2", " 2", "2 ", "\t2\n"])
def test_int_parameter_accepts_whitespace_around_the_number_as_triton_does(value):
    assert int_parameter(params(value), "n", 7) == 2


def test_int_parameter_default_when_absent():
    assert int_parameter(config(), "n", 7) == 7


@pytest.mark.parametrize("value", ["lots", "4 threads", ""])
def test_int_parameter_refuses_what_is_not_a_number_quoting_it_as_written(value):
    with pytest.raises(ModelLoadError, match=f"parameters 'n' must be an integer, got '{value}'"):
        int_parameter(params(value), "n", 7)


def test_the_backends_share_the_readers():
    for module in (onnxruntime, pytorch):
        assert module.int_parameter is autocomplete.int_parameter
    assert tensorrt.type_name is pytorch.type_name is autocomplete.type_name


# -- check_and_fill ----------------------------------------------------------------------


def test_fill_completes_a_batching_model():
    cfg = config()
    inputs = [T("x", "TYPE_FP32", (-1, 4)), T("s", "TYPE_INT64", (-1,))]
    check_and_fill(
        cfg, inputs, [T("y", "TYPE_FP32", (-1, 3))], fill=True, default_max_batch_size=8,
        source="the model",
    )  # fmt: skip
    assert cfg.max_batch_size == 8
    got = [(e.name, e.data_type, list(e.dims), e.HasField("reshape")) for e in cfg.input]
    assert got == [("x", 11, [4], False), ("s", 9, [1], True)]  # a scalar row: [1] -> []
    assert [(e.name, list(e.dims)) for e in cfg.output] == [("y", [3])]


@pytest.mark.parametrize(
    ("text", "fill", "added"),
    [
        ("", True, True),  # filled max_batch_size 8, no scheduler: the dynamic batcher
        ("max_batch_size: 2", True, True),
        ("max_batch_size: 1", True, False),  # nothing to batch
        (
            'max_batch_size: 8 input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            False,
            False,
        ),  # auto-complete off
        ("max_batch_size: 8 sequence_batching { }", True, False),  # a scheduler is named
    ],
)
def test_fill_adds_dynamic_batching_as_the_onnx_and_tensorrt_backends_do(text, fill, added):
    cfg = config(text)
    check_and_fill(
        cfg, [T("x", "TYPE_FP32", (-1, 4))], [T("y", "TYPE_FP32", (-1, 3))], fill=fill,
        default_max_batch_size=8, source="the model",
    )  # fmt: skip
    assert cfg.HasField("dynamic_batching") == added


def test_full_rank_dims_keep_max_batch_size_zero():
    cfg = config('input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]')
    check_and_fill(
        cfg, [T("x", "TYPE_FP32", (-1, 4))], [T("y", "TYPE_FP32", (-1, 3))], fill=True,
        default_max_batch_size=8, source="the model",
    )  # fmt: skip
    assert cfg.max_batch_size == 0
    assert [list(e.dims) for e in cfg.output] == [[-1, 3]]


def test_messages_name_the_source():
    cfg = config("max_batch_size: 2")
    with pytest.raises(ModelLoadError) as info:
        check_and_fill(
            cfg, [T("x", "TYPE_FP32", (3, 4))], [], fill=False, default_max_batch_size=0,
            source="the thing",
        )  # fmt: skip
    assert info.value.message == (
        "model 'm': max_batch_size is 2 but the thing cannot batch: tensor 'x' has first "
        "dimension 3, not a dynamic batch dimension; set max_batch_size: 0"
    )


def test_hooks_decide_the_filled_batch_and_add_checks():
    class Bounded(Hooks):
        def __init__(self) -> None:
            self.checked: list[int] = []

        def filled_max_batch_size(self, default_max_batch_size):
            return 3

        def check_batching(self, config):
            self.checked.append(config.max_batch_size)

        def dims_fit(self, tensor, have, batched):
            return have != [5]

        def shape_note(self, tensor):
            return " (note)"

    hooks = Bounded()
    cfg = config()
    tensors = ([T("x", "TYPE_FP32", (-1, -1))], [T("y", "TYPE_FP32", (-1,))])
    check_and_fill(cfg, *tensors, fill=True, default_max_batch_size=8, source="it", hooks=hooks)
    assert cfg.max_batch_size == 3 and hooks.checked == [3]
    bad = config('max_batch_size: 3 input [ { name: "x" data_type: TYPE_FP32 dims: [ 5 ] } ]')
    with pytest.raises(ModelLoadError, match=r"field dims is \[5\] but it's shape .* \(note\)"):
        check_and_fill(
            bad, *tensors, fill=False, default_max_batch_size=0, source="it", hooks=hooks
        )
