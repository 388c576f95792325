"""Config fields conch does not honour: each one refused or warned about, never silently ignored."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conch.backends.completion import complete
from conch.core import unsupported
from conch.core.repository import ModelRepository

from unit._onnx_models import mlp, write_model

MLP_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""

# field -> the config text that asks for it (added to MLP_CONFIG)
REFUSED = {
    "batch_input": 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" '
    'data_type: TYPE_FP32 source_input: "x" } ]',
    "batch_output": 'batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
    'source_input: "x" } ]',
    "parameters.EXECUTION_ENV_PATH": 'parameters { key: "EXECUTION_ENV_PATH" value: '
    '{ string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }',
    "optimization.execution_accelerators.cpu_execution_accelerator": "optimization { "
    'execution_accelerators { cpu_execution_accelerator: [ { name: "dnnl" } ] } }',
    "model_repository_agents": 'model_repository_agents { agents [ { name: "checksum" } ] }',
}
WARNED = {
    "instance_group.passive": "instance_group [ { count: 1 kind: KIND_CPU passive: true } ]",
    "instance_group.host_policy": 'instance_group [ { count: 1 kind: KIND_CPU host_policy: "numa0" } ]',
    "optimization.cuda": "optimization { cuda { graphs: true } }",
    "optimization.input_pinned_memory": "optimization { input_pinned_memory { enable: false } }",
    "optimization.output_pinned_memory": "optimization { output_pinned_memory { enable: false } }",
    "optimization.gather_kernel_buffer_threshold": "optimization { gather_kernel_buffer_threshold: 4 }",
}


def _scan(root: Path):
    return ModelRepository(root, complete=complete, gpu_count=0).scan()


def test_every_listed_feature_has_a_test() -> None:
    assert {f.field for f in unsupported.FEATURES} == set(REFUSED) | set(WARNED)
    for f in unsupported.FEATURES:
        assert (f.action is unsupported.Action.REFUSE) == (f.field in REFUSED), f.field


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_refused_field_makes_the_model_unavailable_and_says_which(tmp_path, field) -> None:
    write_model(tmp_path, "asks", mlp, config=MLP_CONFIG + REFUSED[field])
    write_model(tmp_path, "plain", mlp, config=MLP_CONFIG)
    entries = _scan(tmp_path)
    assert entries["plain"].error is None  # the others serve
    error = entries["asks"].error
    assert error is not None and not entries["asks"].available
    assert f"field {field} is not supported" in error, error


@pytest.mark.parametrize("field", sorted(WARNED))
def test_harmless_field_serves_with_a_warning_that_names_it(tmp_path, field, caplog) -> None:
    name = "warned_" + field.replace(".", "_")
    write_model(tmp_path, name, mlp, config=MLP_CONFIG + WARNED[field])
    with caplog.at_level(logging.WARNING, logger=unsupported.__name__):
        entry = _scan(tmp_path)[name]
    assert entry.error is None, entry.error
    warnings = [r.getMessage() for r in caplog.records if r.name == unsupported.__name__]
    assert any(f"field {field} is ignored" in w and f"'{name}'" in w for w in warnings), warnings


def test_the_warning_is_given_once_per_model_and_field(tmp_path, caplog) -> None:
    write_model(tmp_path, "passive_once", mlp, config=MLP_CONFIG + WARNED["instance_group.passive"])
    repo = ModelRepository(tmp_path, complete=complete, gpu_count=0)
    with caplog.at_level(logging.WARNING, logger=unsupported.__name__):
        repo.scan()
        repo.scan()  # a polled repository is read again
    hits = [
        r for r in caplog.records if "field instance_group.passive is ignored" in r.getMessage()
    ]
    assert len(hits) == 1


def test_several_refused_fields_are_all_named(tmp_path) -> None:
    text = MLP_CONFIG + REFUSED["batch_output"] + "\n" + REFUSED["batch_input"]
    write_model(tmp_path, "both", mlp, config=text)
    error = _scan(tmp_path)["both"].error or ""
    assert "field batch_output" in error and "field batch_input" in error


def test_the_response_cache_is_no_longer_an_ignored_field(tmp_path, caplog) -> None:
    """conch has Triton's response cache now (frontend.response_cache): a model that
    enables it serves with no warning."""
    write_model(tmp_path, "cached", mlp, config=MLP_CONFIG + "response_cache { enable: true }")
    with caplog.at_level(logging.WARNING, logger=unsupported.__name__):
        assert _scan(tmp_path)["cached"].error is None
    assert not [r for r in caplog.records if r.name == unsupported.__name__]


def test_a_decoupled_model_may_not_enable_the_response_cache(tmp_path) -> None:
    """Triton's rule, with Triton's words: one response per entry."""
    text = (
        MLP_CONFIG + "model_transaction_policy { decoupled: true }\nresponse_cache { enable: true }"
    )
    write_model(tmp_path, "streamed", mlp, config=text)
    error = _scan(tmp_path)["streamed"].error or ""
    assert "Response Cache does not currently support model 'streamed'" in error, error
    assert "'decoupled' transaction policy" in error


def test_a_rate_limiter_is_applied_not_ignored(tmp_path, caplog) -> None:
    """--rate-limit execution_count applies it (conch.worker.rate_limiter): no warning."""
    config = MLP_CONFIG + (
        'instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R1" '
        "count: 2 } ] priority: 2 } } ]"
    )
    write_model(tmp_path, "limited", mlp, config=config)
    with caplog.at_level(logging.WARNING, logger=unsupported.__name__):
        entry = _scan(tmp_path)["limited"]
    assert entry.error is None, entry.error
    assert not [r for r in caplog.records if r.name == unsupported.__name__]
