"""Triton's model configuration: ``config.pbtxt`` in, Triton's JSON out.

The schema is Triton's own ``inference.ModelConfig``, compiled into the tritonclient
wheel as ``tritonclient/grpc/model_config_pb2.py``. Importing it as a module would run
``tritonclient/grpc/__init__.py``, which needs ``grpc`` (not installed), so it is loaded
by path instead.

``ModelConfig`` is the message's type for annotations (``ModelInput`` and ``ModelOutput``
its tensor entries'), for type checkers only (import them under ``TYPE_CHECKING``).
Annotations are never evaluated at run time (every module has ``from __future__ import
annotations``), so naming a type loads nothing.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from conch.core.datatypes import config_to_wire
from conch.core.errors import ModelLoadError

if TYPE_CHECKING:
    # The classes a type checker finds; at run time they are model_config_pb2()'s.
    from tritonclient.grpc.model_config_pb2 import ModelConfig
    from tritonclient.grpc.model_config_pb2 import ModelInput as ModelInput
    from tritonclient.grpc.model_config_pb2 import ModelOutput as ModelOutput

_PB2_MODULE = "conch._triton_model_config_pb2"

_INT64_TYPES = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)


@functools.cache
def model_config_pb2() -> ModuleType:
    """Triton's compiled ``model_config_pb2`` module, loaded by path from tritonclient."""
    spec = importlib.util.find_spec("tritonclient")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / "grpc" / "model_config_pb2.py"
        if path.is_file():
            break
    else:
        raise ImportError(
            "conch reads config.pbtxt with Triton's own schema, model_config_pb2.py from the "
            "tritonclient wheel, which is not installed here (pip install 'tritonclient>=2.50')"
        )
    file_spec = importlib.util.spec_from_file_location(_PB2_MODULE, path)
    assert file_spec is not None and file_spec.loader is not None
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[_PB2_MODULE] = module
    try:
        file_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(_PB2_MODULE, None)
        raise
    return module


def new_config() -> ModelConfig:
    """An empty ``inference.ModelConfig``."""
    return model_config_pb2().ModelConfig()


_PARSE_POSITION = re.compile(r"^(\d+):(\d+) : (.*)$", re.S)


def parse_config(text: str, *, model: str, source: str) -> ModelConfig:
    """Parse ``config.pbtxt`` text; a ``ModelLoadError`` names the model, file and position."""
    cfg = new_config()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        m = _PARSE_POSITION.match(str(exc))
        where, detail = (f"line {m[1]} column {m[2]}", m[3]) if m else ("", str(exc))
        at = f" at {where}" if where else ""
        raise ModelLoadError(f"model '{model}': cannot parse {source}{at}: {detail}") from None
    return cfg


def _ints_back(value: Any, descriptor: Descriptor) -> None:
    """Turn the int64/uint64 strings that protobuf JSON writes back into numbers, in place."""
    if not isinstance(value, dict):
        return
    for field in descriptor.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            val_field = message.fields_by_name["value"]
            for key in item:  # map keys stay strings, as in Triton's JSON
                if val_field.message_type is not None:
                    _ints_back(item[key], val_field.message_type)
                elif val_field.cpp_type in _INT64_TYPES:
                    item[key] = int(item[key])
        elif message is not None:
            for sub in item if isinstance(item, list) else [item]:
                _ints_back(sub, message)
        elif field.cpp_type in _INT64_TYPES:
            value[field.name] = [int(v) for v in item] if isinstance(item, list) else int(item)


def config_to_json(cfg: ModelConfig) -> dict[str, Any]:
    """The config as Triton's HTTP API returns it.

    Protobuf JSON with proto field names and every field without presence printed, then
    int64/uint64 values as JSON numbers (protobuf writes them as strings). Unset message
    and oneof fields stay absent: perf_analyzer tells the scheduler by key presence.
    """
    out = json_format.MessageToDict(
        cfg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _ints_back(out, cfg.DESCRIPTOR)
    return out


def json_to_config(obj: dict[str, Any] | str, *, model: str = "") -> ModelConfig:
    """A ``ModelConfig`` from Triton's JSON (the load API's ``config`` parameter).

    Accepts int64 values as numbers or strings and both field-name styles.
    """
    who = f"model '{model}': " if model else ""
    cfg = new_config()
    try:
        data = json.loads(obj) if isinstance(obj, str | bytes) else obj
        if not isinstance(data, dict):
            raise ValueError("the config must be a JSON object")
        json_format.ParseDict(data, cfg)
    except (ValueError, json_format.ParseError) as exc:
        raise ModelLoadError(f"{who}invalid model config JSON: {exc}") from None
    return cfg


def response_cache_problem(cfg: ModelConfig) -> str | None:
    """Why ``cfg`` may not enable the response cache, or None. Triton's rules: a decoupled
    model (an ensemble with a decoupled step is one) sends many responses per request,
    and a cache entry is one; a sequence model's answer depends on the steps before it."""
    if cfg.response_cache.enable and cfg.HasField("sequence_batching"):
        return (
            f"Response Cache does not currently support model {cfg.name} with sequence "
            "batching scheduler. Please disable the response cache."
        )
    if cfg.response_cache.enable and cfg.model_transaction_policy.decoupled:
        return (
            f"Response Cache does not currently support model '{cfg.name}' with 'decoupled' "
            "transaction policy. Please disable the response cache "
            "(response_cache { enable: false })"
        )
    return None


__all__ = [
    "config_to_json",
    "json_to_config",
    "model_config_pb2",
    "new_config",
    "parse_config",
    "per_config",
    "response_cache_problem",
]


def wire_type(data_type: int) -> str:
    """A config ``data_type`` value as its wire name: ``TYPE_FP32`` -> ``FP32``."""
    return config_to_wire(model_config_pb2().DataType.Name(data_type))


def output_types(config: ModelConfig) -> dict[str, str]:
    """Each output's wire datatype, as the config declares it."""
    return {o.name: wire_type(o.data_type) for o in config.output}


# How many configs a ``per_config`` remembers before it starts again.
PER_CONFIG_KEPT = 1024

T = TypeVar("T")


def per_config(read: Callable[[ModelConfig], T]) -> Callable[[ModelConfig], T]:
    """``read``, remembered for each config object: what a request's path reads of its
    model's config (its inputs as validation checks them, its default queue policy) is
    read once, not once a request (bench/README.md, "Measurements the code cites").
    conch never edits a config once an entry holds it: a repository change brings new
    config objects, which are read again. Safe from any thread: two that read one
    config at once store equal answers."""
    kept: dict[int, tuple[ModelConfig, T]] = {}

    def remembered(config: ModelConfig) -> T:
        known = kept.get(id(config))
        if known is None or known[0] is not config:
            if len(kept) >= PER_CONFIG_KEPT:
                kept.clear()
            known = kept[id(config)] = (config, read(config))
        return known[1]

    return remembered
