"""gRPC framing of Triton's infer calls: ``ModelInferRequest`` in, ``ModelInferResponse`` out.

What is gRPC's own lives here; every check that is not is the shared one:

- an input's data comes as one entry of ``raw_input_contents`` (what tritonclient
  sends: Triton binary bytes, so conch's raw form as is) or as the typed ``contents``
  field its datatype has (``fp32_contents``, ``bytes_contents``, ...); sizes, element
  counts, ranges and datatypes are checked by ``conch.core.tensors``, as for HTTP;
- parameters are typed (``InferParameter``); the reserved ones (priority, timeout,
  sequence keys) must have the type Triton's gRPC frontend requires, with its message;
  custom ones reach the model as Python values;
- outputs always go back in ``raw_output_contents``, as Triton sends them; which ones,
  in what order, and the classification extension are the shared rules
  (``v2_json.select_outputs``);
- Triton's shared-memory extension: an input or output whose parameters name a
  ``shared_memory_region`` is read from (written to) the region through
  ``conch.frontend.shared_memory``; such an input takes no ``raw_input_contents`` entry,
  and such an output's entry there is empty, as Triton keeps the two lists in step.

Checking the request against the model's config (``validation``) is the data plane's.
"""

from __future__ import annotations

from typing import Any

from conch.core import tensors
from conch.core.errors import InvalidArgument
from conch.core.inference import (
    ALLOWED_TRITON_PARAMETERS,
    InferRequest,
    InputTensor,
    RequestedOutput,
    already_in_request,
)
from conch.frontend import shared_memory, v2_json
from conch.frontend.dataplane import InferOutcome
from conch.frontend.grpc.protos import triton_messages

pb = triton_messages()

# The typed ``contents`` field that holds each datatype (FP16 and BF16 have none).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# The datatype a contents field is named for, as Triton names it in its error.
_FIELD_TYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}

# Reserved request parameters: the InferParameter kinds Triton's gRPC frontend takes.
_RESERVED_KINDS = {
    "sequence_id": ("int64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "priority": ("int64_param", "uint64_param"),
    "timeout": ("int64_param",),
}
_CUSTOM_KINDS = ("int64_param", "bool_param", "string_param", "double_param")


def parameter_value(param: Any) -> Any:
    """An ``InferParameter`` (or ``ModelRepositoryParameter``) as its Python value."""
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)


def _parameters(params: Any) -> dict[str, Any]:
    """Request parameters as Python values, with Triton's gRPC type rules."""
    out: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        if key in _RESERVED_KINDS:
            allowed = _RESERVED_KINDS[key]
            if kind not in allowed:
                raise InvalidArgument(
                    f"invalid value type for '{key}' parameter, expected {' or '.join(allowed)}."
                )
            value = getattr(param, kind)
            if key in ("priority", "timeout") and value < 0:
                raise InvalidArgument(f"invalid value for '{key}', expected value >= 0.")
        elif key.startswith("triton_"):
            if key not in ALLOWED_TRITON_PARAMETERS:
                raise InvalidArgument(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. "
                    "Only the following keys starting with 'triton_' are allowed: "
                    + " ".join(sorted(ALLOWED_TRITON_PARAMETERS))
                )
            if kind != "bool_param":
                raise InvalidArgument(
                    f"invalid value type for '{key}' parameter, expected bool_param."
                )
            value = param.bool_param
        else:
            if kind not in _CUSTOM_KINDS:
                raise InvalidArgument(
                    f"invalid value type for '{key}' parameter, expected int64_param, "
                    "bool_param, or string_param."
                )
            value = getattr(param, kind)
        out[key] = value
    return out


def _typed_contents(io: Any, datatype: str, shape: tuple[int, ...], model: str) -> bytes:
    """An input given in a typed ``contents`` field, as raw bytes (shared checks)."""
    given = [f.name for f, values in io.contents.ListFields() if len(values)]
    expected = CONTENTS_FIELD.get(datatype)
    if len(given) > 1 or (given and given[0] != expected):
        raise InvalidArgument(
            f"unexpected explicit tensor data for input tensor '{io.name}' for model "
            f"'{model}' of type '{_FIELD_TYPE[given[-1]]}', expected datatype '{datatype}'"
        )
    if expected is None:  # FP16, BF16: only raw_input_contents can carry them
        if not given and tensors.element_count(shape) == 0:
            return b""
        raise InvalidArgument(
            f"input '{io.name}' for model '{model}': {datatype} data can only be given in "
            "raw_input_contents"
        )
    values = list(getattr(io.contents, expected))
    if datatype == "BYTES":
        raw = tensors.encode_bytes_elements(values)
        tensors.raw_size_ok(datatype, shape, raw, io.name)
        return raw
    return tensors.json_to_raw(datatype, shape, values, io.name)


def _requested_outputs(
    entries: Any, shm: v2_json.SharedMemoryPort | None = None
) -> list[RequestedOutput] | None:
    if not entries:
        return None  # Triton returns every output when none are named
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for entry in entries:
        name = entry.name
        if name in seen:
            raise InvalidArgument(already_in_request("output", name))
        seen.add(name)
        params = entry.parameters
        in_shm = not v2_json.SHM_PARAMETERS.isdisjoint(params)
        if in_shm and shm is None:
            raise InvalidArgument(f"output '{name}': shared memory is not supported")
        class_count = 0
        if "classification" in params:
            class_count = parameter_value(params["classification"])
            if type(class_count) is not int or class_count < 0:
                raise InvalidArgument(
                    f"'classification' of output '{name}' must be a non-negative integer"
                )
        if in_shm and shm is not None:
            outputs.append(shm.output(name, True, class_count, _values(params)))
        else:
            outputs.append(RequestedOutput(name, True, class_count))
    return outputs


def _values(params: Any) -> dict[str, Any]:
    """An ``InferParameter`` map as Python values."""
    return {key: parameter_value(param) for key, param in params.items()}


def decode_request(request: Any, shm: v2_json.SharedMemoryPort | None = None) -> InferRequest:
    """A ``ModelInferRequest`` as an ``InferRequest`` with raw tensors; every structural
    mistake is an ``InvalidArgument`` that names the input or output. Inputs and outputs
    in shared-memory regions go through ``shm`` (refused without one)."""
    model = request.model_name
    raws = request.raw_input_contents
    next_raw = 0  # inputs in shared memory take no raw_input_contents entry
    inputs: list[InputTensor] = []
    seen: set[str] = set()
    for index, io in enumerate(request.inputs):
        name, datatype = io.name, io.datatype
        if not name:
            raise InvalidArgument(f"inputs[{index}] must have a non-empty 'name'")
        if name in seen:
            raise InvalidArgument(already_in_request("input", name))
        seen.add(name)
        tensors.check_datatype(datatype, name)
        if any(d < 0 for d in io.shape):
            raise InvalidArgument(
                f"input '{name}' must have a 'shape' of non-negative integers, got {list(io.shape)}"
            )
        shape = tuple(io.shape)
        if "shared_memory_region" in io.parameters:
            if shm is None:
                raise InvalidArgument(f"input '{name}': shared memory is not supported")
            if io.HasField("contents"):
                raise InvalidArgument(
                    f"input '{name}' must set only one of 'contents' and "
                    "'shared_memory_region' in 'parameters'"
                )
            raw = shm.input_bytes(name, datatype, shape, _values(io.parameters))
        elif io.HasField("contents"):
            if raws:
                raise InvalidArgument(
                    "contents field must not be specified when using raw_input_contents "
                    f"for '{name}' for model '{model}'"
                )
            raw = _typed_contents(io, datatype, shape, model)
        else:
            if next_raw >= len(raws):
                raise InvalidArgument(
                    f"unable to find data for input tensor '{name}' for model '{model}' in request."
                )
            raw = raws[next_raw]
            next_raw += 1
            tensors.raw_size_ok(datatype, shape, raw, name)
        inputs.append(InputTensor(name, datatype, shape, raw))
    if len(raws) > next_raw:
        raise InvalidArgument(
            f"unexpected additional input data: {len(raws)} raw_input_contents for "
            f"{len(inputs)} inputs of model '{model}'"
        )
    return InferRequest(
        id=request.id,
        inputs=inputs,
        outputs=_requested_outputs(request.outputs, shm),
        binary_data_output=True,
        parameters=_parameters(request.parameters),
    )


def encode_outcome(outcome: InferOutcome) -> Any:
    """The ``ModelInferResponse`` of an answered call: every output's bytes in
    ``raw_output_contents``, in the order of ``outputs``."""
    response = pb.ModelInferResponse(
        model_name=outcome.model, model_version=str(outcome.version), id=outcome.request.id
    )
    selected = v2_json.select_outputs(
        outcome.outputs,
        outcome.request,
        model_name=outcome.model,
        labels=outcome.labels,
        batched=outcome.batched,
    )
    slots = shared_memory.output_slots(outcome.request.outputs)  # written to regions
    for out, _binary in selected:
        response.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        slot = slots.get(out.name)
        if slot is None:
            response.raw_output_contents.append(out.raw)
            continue
        slot.write(out.raw)
        response.raw_output_contents.append(b"")  # kept in step with ``outputs``
    return response


__all__ = ["CONTENTS_FIELD", "decode_request", "encode_outcome", "parameter_value"]
