"""The identity backend without a server: a repository that reads an identity model from an
empty version folder, its load-time checks in Triton's words, and what it answers: copies
paired by name, the request's own shape and type (empty, variable, BYTES, reshaped),
requested outputs only, zeros for an optional input left out, one delay per execution
scaled by the instance's index, and its byte counter."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from conch.backends import BackendRequest, InstanceSpec, backend_class
from conch.backends.completion import complete
from conch.backends.identity import METRIC, IdentityBackend
from conch.core import custom_metrics
from conch.core.backend_table import BACKENDS, model_filename
from conch.core.errors import ConchError, ModelLoadError
from conch.core.model_config import parse_config
from conch.core.repository import ModelRepository

PAIRS = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 2 ] },
         { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def model(repo: Path, name: str, body: str, *, version_dir: bool = True) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True) if version_dir else folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "identity"\n{body}')
    return folder


def loaded(repo: Path, name: str, instance: str = "") -> IdentityBackend:
    entry = ModelRepository(repo, complete=complete, gpu_count=0).scan()[name]
    if entry.error is not None:
        raise ModelLoadError(entry.error)
    backend = IdentityBackend(
        entry.spec(entry.latest()), InstanceSpec(instance or f"{name}_0", "CPU")
    )
    backend.load()
    return backend


def answer(backend: IdentityBackend, outputs: list[str], **inputs: np.ndarray):
    [result] = backend.execute([BackendRequest(inputs=inputs, outputs=outputs)])
    return result


def test_registered_with_no_model_file_and_read_from_an_empty_version_folder(tmp_path):
    assert backend_class("identity") is IdentityBackend
    assert BACKENDS["identity"].default_filename == ""
    model(tmp_path, "echo", PAIRS)
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["echo"]
    assert entry.error is None and entry.versions == [1]
    # As Triton completes a config that names its custom backend: no model file name.
    assert entry.config.default_model_filename == "" and model_filename(entry.config) == ""


def test_a_model_needs_a_version_folder_all_the_same(tmp_path):
    model(tmp_path, "echo", PAIRS, version_dir=False)
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["echo"]
    assert entry.error is not None and "version" in entry.error


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "model configuration must have equal input/output pairs",
        ),
        (
            'input [ { name: "IN0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "expected input name to follow INPUT<index> pattern, got 'IN0'",
        ),
        (
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "expected output name to follow OUTPUT<index> pattern, got 'OUT0'",
        ),
        (
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "expected input and output indices to match",
        ),
        (
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]',
            "expected input and output datatype to match, got TYPE_FP32 and TYPE_INT32",
        ),
        (
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            "expected input and output shape to match, got [2,2] and [4]",
        ),
        (
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'parameters [ { key: "execute_delay_ms" value: { string_value: "-5" } } ]',
            "execute_delay_ms and instance_wise_delay_multiplier must not be negative",
        ),
    ],
)
def test_a_config_that_does_not_pair_is_refused_in_tritons_words(tmp_path, body, words):
    model(tmp_path, "bad", body)
    with pytest.raises(ModelLoadError) as caught:
        loaded(tmp_path, "bad")
    assert caught.value.message == f"model 'bad': {words}"


def test_each_output_copies_the_input_of_its_index_not_of_its_place(tmp_path):
    model(tmp_path, "echo", PAIRS)
    backend = loaded(tmp_path, "echo")
    a = np.array([[0.5, 1.5, 2.5]], np.float32)
    b = np.array([[b"x", b""]], dtype=object)
    out = answer(backend, ["OUTPUT0", "OUTPUT1"], INPUT0=a, INPUT1=b)
    np.testing.assert_array_equal(out["OUTPUT0"], a)
    assert out["OUTPUT0"].dtype == np.float32
    assert out["OUTPUT1"].tolist() == [[b"x", b""]]
    # Only what the request asks for.
    assert list(answer(backend, ["OUTPUT1"], INPUT0=a, INPUT1=b)) == ["OUTPUT1"]


def test_a_request_gets_its_own_shape_back_empty_and_variable_alike(tmp_path):
    model(tmp_path, "echo", PAIRS)
    backend = loaded(tmp_path, "echo")
    b = np.array([[b"a", b"b"]] * 3, dtype=object)
    requests = [
        BackendRequest(
            inputs={"INPUT0": np.zeros((3, 0), np.float32), "INPUT1": b}, outputs=["OUTPUT0"]
        ),
        BackendRequest(
            inputs={"INPUT0": np.ones((1, 7), np.float32), "INPUT1": b[:1]}, outputs=["OUTPUT0"]
        ),
    ]
    first, second = backend.execute(requests)
    assert first["OUTPUT0"].shape == (3, 0)
    assert second["OUTPUT0"].shape == (1, 7)


def test_reshapes_apply_on_the_way_in_and_out(tmp_path):
    """A nop tunnel's pair: the input [2,2] taken as [4], the output [4] as itself."""
    model(
        tmp_path,
        "tunnel",
        "max_batch_size: 4\n"
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]',
    )
    x = np.arange(8, dtype=np.int32).reshape(2, 2, 2)
    out = answer(loaded(tmp_path, "tunnel"), ["OUTPUT0"], INPUT0=x)
    np.testing.assert_array_equal(out["OUTPUT0"], x.reshape(2, 4))


def test_an_optional_input_left_out_answers_zeros_behind_the_requests_batch(tmp_path):
    model(
        tmp_path,
        "opt",
        "max_batch_size: 4\n"
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 3 ] },\n'
        '        { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1, 2 ] optional: true } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 3 ] },\n'
        '         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]',
    )
    out = answer(loaded(tmp_path, "opt"), ["OUTPUT0", "OUTPUT1"], INPUT0=np.ones((2, 3), np.int32))
    assert out["OUTPUT1"].shape == (2, 1, 2) and out["OUTPUT1"].dtype == np.float32
    assert not out["OUTPUT1"].any()


def test_a_required_input_missing_is_the_requests_error_in_tritons_words(tmp_path):
    model(tmp_path, "echo", PAIRS)
    out = answer(loaded(tmp_path, "echo"), ["OUTPUT1"], INPUT0=np.ones((1, 2), np.float32))
    assert isinstance(out, ConchError) and out.message == "failed to get input 'INPUT1'"


DELAYED = (
    "max_batch_size: 8\n"
    'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    'parameters [ { key: "execute_delay_ms" value: { string_value: "200" } },\n'
    '             { key: "instance_wise_delay_multiplier" value: { string_value: "2" } } ]'
)


def _took(backend: IdentityBackend, requests: int) -> float:
    batch = [
        BackendRequest(inputs={"INPUT0": np.ones((1, 1), np.float32)}, outputs=["OUTPUT0"])
        for _ in range(requests)
    ]
    began = time.monotonic()
    backend.execute(batch)
    return time.monotonic() - began


def test_the_delay_is_once_per_execution_and_scales_with_the_instance_index(tmp_path):
    model(tmp_path, "slow", DELAYED)
    first = loaded(tmp_path, "slow", "slow_0")
    took = _took(first, 6)
    assert 0.2 <= took < 0.4  # six requests, one delay; index 0 sleeps once
    assert _took(loaded(tmp_path, "slow", "slow_2"), 1) >= 0.8  # 2 x index 2 delays


def test_creation_delay_holds_the_load(tmp_path):
    model(
        tmp_path,
        "late",
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'parameters [ { key: "creation_delay_sec" value: { string_value: "1" } } ]',
    )
    began = time.monotonic()
    loaded(tmp_path, "late")
    assert time.monotonic() - began >= 1


def test_its_counter_adds_the_bytes_copied_until_the_last_instance_unloads(tmp_path):
    model(tmp_path, "counted", PAIRS)  # a name no other test's instances hold
    backend, twin = loaded(tmp_path, "counted"), loaded(tmp_path, "counted", "counted_1")
    labels = custom_metrics.labels_key({"model": "counted", "version": "1"})
    before = custom_metrics.REGISTRY.value(METRIC, labels)
    b = np.array([[b"ab", b"c"]], dtype=object)  # 4 + 2 + 4 + 1 bytes as Triton counts
    answer(backend, ["OUTPUT0", "OUTPUT1"], INPUT0=np.ones((1, 4), np.float32), INPUT1=b)
    assert custom_metrics.REGISTRY.value(METRIC, labels) - before == 16 + 11
    backend.unload()
    assert custom_metrics.REGISTRY.value(METRIC, labels) - before == 27  # twin holds it
    twin.unload()
    with pytest.raises(ConchError):
        custom_metrics.REGISTRY.value(METRIC, labels)


def test_parsed_config_pairs_match_tritons_qa_nop_models():
    """The shape of gen_ensemble_model_utils' nop models: two pairs with reshapes."""
    from conch.backends.identity import pairs

    cfg = parse_config(
        'name: "nop"\nbackend: "identity"\nmax_batch_size: 1024\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] reshape: { shape: [ 2, 1 ] } },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 2 ] reshape: { shape: [ 2, 1 ] } } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] reshape: { shape: [ 2, 1 ] } },'
        ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 2 ] reshape: { shape: [ 2, 1 ] } } ]',
        model="nop",
        source="test",
    )
    assert [(p.output, p.input) for p in pairs(cfg)] == [
        ("OUTPUT0", "INPUT0"),
        ("OUTPUT1", "INPUT1"),
    ]
