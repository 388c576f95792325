"""config.pbtxt parsing and Triton's JSON form of the model config."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conch.core import model_config as config_mod
from conch.core.errors import ModelLoadError
from conch.core.model_config import config_to_json, json_to_config, model_config_pb2, parse_config

FULL = """
name: "full"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy { specific { versions: [ 1, 3 ] } }
input [
  { name: "x" data_type: TYPE_FP32 dims: [ -1, 16 ] reshape { shape: [ 16, -1 ] } }
]
output [ { name: "y" data_type: TYPE_STRING dims: [ 4 ] } ]
dynamic_batching {
  preferred_batch_size: [ 2, 4 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { default_timeout_microseconds: 5000 max_queue_size: 7 }
  priority_queue_policy { key: 1 value { default_timeout_microseconds: 42 } }
}
model_warmup [
  { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } }
]
parameters { key: "intra_op_thread_count" value { string_value: "2" } }
"""


def test_schema_is_tritons_and_cached():
    pb2 = model_config_pb2()
    assert pb2 is model_config_pb2()
    assert pb2.ModelConfig.DESCRIPTOR.full_name == "inference.ModelConfig"
    assert "dynamic_batching" in pb2.ModelConfig.DESCRIPTOR.fields_by_name


def test_missing_tritonclient_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tritonclient" else real(name, *a),
    )
    with pytest.raises(ImportError, match="tritonclient"):
        config_mod.model_config_pb2.__wrapped__()


def test_parse_ok():
    cfg = parse_config(FULL, model="full", source="repo/full/config.pbtxt")
    assert cfg.name == "full"
    assert list(cfg.input[0].dims) == [-1, 16]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 100


def test_parse_error_names_model_file_line_and_field():
    text = 'name: "m"\nmax_batch_size: 4\ninput [ { name: "x" dims: [ 1 ] colour: 3 } ]\n'
    with pytest.raises(ModelLoadError) as info:
        parse_config(text, model="m", source="/repo/m/config.pbtxt")
    msg = info.value.message
    assert "model 'm'" in msg
    assert "/repo/m/config.pbtxt" in msg
    assert "line 3" in msg
    assert "colour" in msg
    assert info.value.status == 400


def test_parse_error_bad_enum_value():
    text = 'input [ { name: "x" data_type: TYPE_FLOAT dims: [ 1 ] } ]'
    with pytest.raises(ModelLoadError, match=r"line 1 .*TYPE_FLOAT"):
        parse_config(text, model="m", source="config.pbtxt")


def test_json_int64_fields_are_numbers():
    out = config_to_json(parse_config(FULL, model="full", source="x"))
    json.dumps(out)  # plain JSON
    assert out["max_batch_size"] == 8
    assert out["input"][0]["dims"] == [-1, 16]
    assert out["input"][0]["reshape"]["shape"] == [16, -1]
    assert out["output"][0]["dims"] == [4]
    assert out["version_policy"] == {"specific": {"versions": [1, 3]}}
    db = out["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 100
    assert db["priority_levels"] == 2
    assert db["default_priority_level"] == 1
    assert db["preferred_batch_size"] == [2, 4]
    assert db["default_queue_policy"]["default_timeout_microseconds"] == 5000
    # map keys stay strings, int64 values inside map values become numbers
    assert db["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 42
    assert out["model_warmup"][0]["inputs"]["x"]["dims"] == [16]
    assert out["parameters"] == {"intra_op_thread_count": {"string_value": "2"}}


def test_json_enums_as_names_and_fields_snake_case():
    out = config_to_json(parse_config(FULL, model="full", source="x"))
    assert out["input"][0]["data_type"] == "TYPE_FP32"
    assert out["output"][0]["data_type"] == "TYPE_STRING"
    assert "default_model_filename" in out  # printed even when empty
    assert out["platform"] == "onnxruntime_onnx"


def test_json_unset_messages_and_oneofs_are_absent():
    out = config_to_json(parse_config('name: "m" max_batch_size: 0', model="m", source="x"))
    for key in (
        "dynamic_batching",
        "sequence_batching",
        "ensemble_scheduling",
        "version_policy",
        "model_transaction_policy",
        "response_cache",
        "optimization",
    ):
        assert key not in out, key
    assert out["max_batch_size"] == 0
    assert out["input"] == []


def test_json_empty_dynamic_batching_is_present():
    out = config_to_json(parse_config("dynamic_batching { }", model="m", source="x"))
    assert out["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    assert "sequence_batching" not in out


def test_json_sequence_and_ensemble_int64():
    text = """
    sequence_batching {
      max_sequence_idle_microseconds: 1000000
      oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 10 }
      state [ { input_name: "i" output_name: "o" data_type: TYPE_INT32 dims: [ 1, -1 ]
                initial_state [ { name: "s" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } ] } ]
    }
    """
    seq = config_to_json(parse_config(text, model="m", source="x"))["sequence_batching"]
    assert seq["max_sequence_idle_microseconds"] == 1000000
    assert seq["oldest"]["max_queue_delay_microseconds"] == 10
    assert "direct" not in seq
    assert seq["state"][0]["dims"] == [1, -1]
    assert seq["state"][0]["initial_state"][0]["dims"] == [1]
    ens = config_to_json(
        parse_config(
            'platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" model_version: -1 } ] }',
            model="m",
            source="x",
        )
    )
    assert ens["ensemble_scheduling"]["step"][0]["model_version"] == -1


def test_json_round_trip():
    cfg = parse_config(FULL, model="full", source="x")
    out = config_to_json(cfg)
    assert json_to_config(out) == cfg
    assert json_to_config(json.dumps(out)) == cfg
    # int64 as strings (protobuf's own JSON) is accepted too
    assert list(json_to_config({"input": [{"name": "x", "dims": ["-1", "3"]}]}).input[0].dims) == [
        -1,
        3,
    ]


@pytest.mark.parametrize(
    "bad",
    ["{not json", "[1, 2]", {"no_such_field": 1}, {"max_batch_size": "many"}],
)
def test_json_to_config_errors(bad):
    with pytest.raises(ModelLoadError, match="model 'm'"):
        json_to_config(bad, model="m")
