"""Triton's v2 inference documents in JSON: request document in, response document out.

What every carrier of Triton's JSON shares: the HTTP frontend's bodies
(``http.http_codec``), and a batch job's lines, which are one request document per
line in and one response document per line out. A batch job runs in a worker process,
which must never import ``conch.frontend.http`` (Flask, gunicorn, gevent), so what the
lines need lives here and only HTTP's own framing lives under ``http/``: the
binary-tensor extension (tensor bytes after the JSON, sized by
``Inference-Header-Content-Length``), compression and ``Accept-Encoding``. Tensors
come out in raw (Triton binary) form. Every client mistake becomes an
``InvalidArgument`` (400) whose message names the offending input or output.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import orjson

from conch.core import tensors
from conch.core.errors import Internal, InvalidArgument
from conch.core.inference import (
    ALLOWED_TRITON_PARAMETERS,
    InferRequest,
    InputTensor,
    OutputTensor,
    RequestedOutput,
    already_in_request,
)

MAX_JSON_DEPTH = 100  # Triton's limit on JSON nesting (src/common.h)
# Triton's words for a body nested past it, which its tests match.
DEPTH_ERROR = (
    f"failed to parse the request JSON: JSON nesting depth exceeds maximum allowed limit "
    f"({MAX_JSON_DEPTH})"
)


# --------------------------------------------------------------------------- request


def check_depth(doc: Any) -> None:
    """Refuse JSON nested deeper than Triton allows (arrays and objects both count)."""
    if not isinstance(doc, dict | list):
        return  # a scalar document (null, 3, "x"): its callers refuse it as no object
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidArgument(DEPTH_ERROR)
        children = node.values() if isinstance(node, dict) else node
        # set(map(type, ...)) runs at C speed, so flat ``data`` arrays cost almost nothing.
        kinds = set(map(type, children))
        if list in kinds or dict in kinds:
            stack.extend((c, depth + 1) for c in children if isinstance(c, list | dict))


def _parse_json(text: bytes) -> dict[str, Any]:
    try:
        # orjson first (a few times faster on an infer call's small header); what it
        # refuses (NaN literals, integers past 64 bits, lone surrogates, past 1,024
        # levels) goes to the standard parser, whose answers and errors stay the rule.
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        doc = _parse_json_stdlib(text)
    return _checked(doc, text)


def _parse_json_stdlib(text: bytes) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidArgument(DEPTH_ERROR) from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise InvalidArgument(f"failed to parse the request JSON: {e}") from None


def _checked(doc: Any, text: bytes) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InvalidArgument("the request JSON must be an object")
    # A document cannot nest deeper than it has opening brackets (those inside strings only
    # make the count larger), and counting bytes runs at C speed: the walk, a large part of
    # an infer call's Python here (bench/README.md, "Measurements the code cites"), is
    # needed only past that bound.
    if text.count(b"[") + text.count(b"{") > MAX_JSON_DEPTH:
        check_depth(doc)
    return doc


def _is_uint(v: Any) -> bool:
    return type(v) is int and v >= 0


def _request_parameters(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidArgument("request 'parameters' must be a JSON object")
    for key, value in params.items():
        if key.startswith("triton_") and key not in ALLOWED_TRITON_PARAMETERS:
            raise InvalidArgument(
                f"parameter keys starting with 'triton_' are reserved for Triton usage "
                f"and should not be specified: '{key}'"
            )
        if key == "sequence_id":
            if not (_is_uint(value) or isinstance(value, str)):
                raise InvalidArgument(
                    "parameter 'sequence_id' must be an unsigned integer or a string"
                )
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            if type(value) is not bool:
                raise InvalidArgument(f"parameter '{key}' must be a boolean")
        elif key in ("priority", "timeout"):
            if not _is_uint(value):
                raise InvalidArgument(f"parameter '{key}' must be an unsigned integer")
        elif key == "headers":
            if not isinstance(value, dict):
                raise InvalidArgument("parameter 'headers' must be a JSON object")
        elif not isinstance(value, str | int | float):  # bool is an int
            raise InvalidArgument(
                f"parameter '{key}' has invalid type; it should be a string, integer, "
                f"boolean or number"
            )
    return params


def _input_header(entry: Any, index: int) -> tuple[str, str, tuple[int, ...], dict[str, Any]]:
    if not isinstance(entry, dict):
        raise InvalidArgument(f"inputs[{index}] must be a JSON object")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"inputs[{index}] must have a non-empty string 'name'")
    datatype = entry.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidArgument(f"input '{name}' must have a string 'datatype'")
    tensors.check_datatype(datatype, name)
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise InvalidArgument(
            f"input '{name}' must have a 'shape' that is a list of non-negative integers, "
            f"got {json.dumps(shape)}"
        )
    params = entry.get("parameters")
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        raise InvalidArgument(f"'parameters' of input '{name}' must be a JSON object")
    return name, datatype, tuple(shape), params


def _requested_outputs(
    entries: Any, shm: SharedMemoryPort | None = None
) -> list[RequestedOutput] | None:
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise InvalidArgument("request 'outputs' must be a JSON array")
    if not entries:
        return None  # Triton returns every output when none are named
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidArgument(f"outputs[{i}] must be a JSON object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"outputs[{i}] must have a non-empty string 'name'")
        if name in seen:
            raise InvalidArgument(already_in_request("output", name))
        seen.add(name)
        params = entry.get("parameters")
        if params is None:
            params = {}
        elif not isinstance(params, dict):
            raise InvalidArgument(f"'parameters' of output '{name}' must be a JSON object")
        in_shm = not SHM_PARAMETERS.isdisjoint(params)
        if in_shm and shm is None:
            raise InvalidArgument(f"output '{name}': shared memory is not supported")
        binary = params.get("binary_data", False)
        if type(binary) is not bool:
            raise InvalidArgument(f"'binary_data' of output '{name}' must be a boolean")
        class_count = params.get("classification", 0)
        if not _is_uint(class_count):
            raise InvalidArgument(
                f"'classification' of output '{name}' must be a non-negative integer"
            )
        if in_shm and shm is not None:
            outputs.append(shm.output(name, binary, class_count, params))
        else:
            outputs.append(RequestedOutput(name, binary, class_count))
    return outputs


# Takes an input's binary data, given its name and ``binary_data_size``: the carrier's
# binary extension (HTTP's: the bytes after the JSON). None where there is none.
BinaryData = Callable[[str, int], bytes]

# Triton's shared-memory parameters of an input or a requested output.
SHM_PARAMETERS = frozenset(
    {"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"}
)


class SharedMemoryPort(Protocol):
    """Where a carrier that has the shared-memory extension (HTTP's and gRPC's
    frontends: ``conch.frontend.shared_memory``) reads an input given as a region and
    makes a requested output to be written into one. Without one (a JSON line) either
    is refused."""

    def input_bytes(
        self, name: str, datatype: str, shape: tuple[int, ...], params: Mapping[str, Any]
    ) -> bytes: ...

    def output(
        self, name: str, binary: bool, class_count: int, params: Mapping[str, Any]
    ) -> RequestedOutput: ...


def decode_request(
    text: bytes, binary: BinaryData | None = None, shm: SharedMemoryPort | None = None
) -> InferRequest:
    """Parse a request document into raw-tensor form, validating its structure.

    An input whose ``parameters`` give a ``binary_data_size`` takes that many bytes
    from ``binary``; without one (a JSON line) such an input is refused. An input or
    output whose ``parameters`` name a ``shared_memory_region`` goes through ``shm``
    (refused without one).
    """
    doc = _parse_json(text)

    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("request 'id' must be a string")
    parameters = _request_parameters(doc.get("parameters"))

    entries = doc.get("inputs")
    if not isinstance(entries, list):
        # As Triton: "inputs" must be there; it may be empty (every model input optional),
        # which the model's config decides (``validation.validate_request``).
        raise InvalidArgument("Unable to parse 'inputs': request 'inputs' must be a JSON array")

    inputs: list[InputTensor] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        name, datatype, shape, params = _input_header(entry, i)
        if name in seen:
            raise InvalidArgument(already_in_request("input", name))
        seen.add(name)
        has_data = "data" in entry
        has_binary = "binary_data_size" in params
        has_shm = "shared_memory_region" in params
        if has_data + has_binary + has_shm != 1:
            raise InvalidArgument(
                f"input '{name}' must set only one of the following fields: 'data', "
                f"'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'"
            )
        if has_shm:
            if shm is None:
                raise InvalidArgument(f"input '{name}': shared memory is not supported")
            raw = shm.input_bytes(name, datatype, shape, params)
        elif has_binary:
            nbytes = params["binary_data_size"]
            if not _is_uint(nbytes):
                raise InvalidArgument(
                    f"'binary_data_size' of input '{name}' must be a non-negative integer"
                )
            if binary is None:
                raise InvalidArgument(
                    f"input '{name}': 'binary_data_size' needs binary data after the JSON "
                    "(HTTP's binary tensor extension); give the tensor as 'data' here"
                )
            raw = binary(name, nbytes)
            tensors.raw_size_ok(datatype, shape, raw, name)
        else:
            raw = tensors.json_to_raw(datatype, shape, entry["data"], name)
        inputs.append(InputTensor(name, datatype, shape, raw))

    return InferRequest(
        id=request_id,
        inputs=inputs,
        outputs=_requested_outputs(doc.get("outputs"), shm),
        binary_data_output=bool(parameters.get("binary_data_output", False)),
        parameters=parameters,
    )


# -------------------------------------------------------------------------- response


def _format_class_value(datatype: str, value: Any) -> str:
    """A class score as C++ std::to_string writes it: "%f" for floats, plain integers."""
    if datatype in ("FP16", "BF16", "FP32", "FP64"):
        return f"{float(value):f}"
    return str(int(value))


def classify(out: OutputTensor, k: int, labels: list[str] | None, batched: bool) -> OutputTensor:
    """Replace an output by its top-``k`` classes (classification extension).

    Each element is ``"<value>:<index>[:<label>]"``, highest value first; ties keep the
    lower index first. With ``batched`` the first dimension is the batch and each batch
    entry is ranked separately.
    """
    if out.datatype in ("BYTES", "BOOL"):
        raise InvalidArgument(
            f"class result not available for output '{out.name}' due to unsupported "
            f"type '{out.datatype}'"
        )
    values = tensors.to_numpy(out.datatype, out.shape, out.raw, out.name)
    if out.datatype == "BF16":
        values = (values.astype("<u4") << 16).view("<f4")
    if batched:
        if not out.shape:
            raise InvalidArgument(f"output '{out.name}' has no batch dimension to classify")
        batch, n = out.shape[0], tensors.element_count(out.shape[1:])
    else:
        batch, n = 1, tensors.element_count(out.shape)
    rows = values.reshape(batch, n)
    top = min(k, n)
    # Descending with ties on the lower index: a stable ascending sort of the reversed
    # row, read backwards (no negation, so every integer type sorts exactly).
    order = (n - 1) - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :top]
    elements: list[str] = []
    for b in range(batch):
        row = rows[b]
        for idx in order[b].tolist():
            text = f"{_format_class_value(out.datatype, row[idx])}:{idx}"
            if labels is not None and idx < len(labels) and labels[idx]:
                text += f":{labels[idx]}"
            elements.append(text)
    shape = (batch, top) if batched else (top,)
    return OutputTensor(out.name, "BYTES", shape, tensors.encode_bytes_elements(elements))


def select_outputs(
    outputs: list[OutputTensor],
    request: InferRequest,
    *,
    model_name: str,
    labels: dict[str, list[str]] | None = None,
    batched: bool = False,
) -> list[tuple[OutputTensor, bool]]:
    """The outputs a response holds, each with whether ``request`` wants it binary.

    Listed outputs come in the order requested, each binary only if its own
    ``binary_data`` says so (Triton's rule); with no list, every output comes in model
    order, binary iff ``binary_data_output``. An output asked for with
    ``classification`` comes as its top classes (``classify``).
    """
    if request.outputs is None:
        return [(o, request.binary_data_output) for o in outputs]
    by_name = {o.name: o for o in outputs}
    wanted = []
    for want in request.outputs:
        out = by_name.get(want.name)
        if out is None:
            raise Internal(f"model '{model_name}' did not produce output '{want.name}'")
        wanted.append((out, want))
    return [
        (
            classify(out, want.class_count, (labels or {}).get(out.name), batched)
            if want.class_count > 0
            else out,
            want.binary,
        )
        for out, want in wanted
    ]


def output_header(out: OutputTensor) -> dict[str, Any]:
    """An output's entry in the response document, before its data."""
    return {"name": out.name, "datatype": out.datatype, "shape": list(out.shape)}


def output_data(out: OutputTensor) -> dict[str, Any]:
    """An output's entry with its data as JSON."""
    entry = output_header(out)
    entry["data"] = tensors.raw_to_json(out.datatype, out.shape, out.raw, out.name)
    return entry


def response_document(
    model_name: str, model_version: str, request_id: str, outputs: list[dict[str, Any]]
) -> bytes:
    """The response document around its output entries."""
    doc: dict[str, Any] = {}
    if request_id:
        doc["id"] = request_id
    doc["model_name"] = model_name
    doc["model_version"] = str(model_version)
    doc["outputs"] = outputs
    if all("data" not in entry for entry in outputs):  # names, shapes, sizes: no floats
        return orjson.dumps(doc)
    # JSON data keeps the standard encoder's spelling of every float (NaN included).
    return json.dumps(doc, separators=(",", ":")).encode()


def encode_response(
    *,
    model_name: str,
    model_version: str,
    request_id: str,
    outputs: list[OutputTensor],
    request: InferRequest,
    labels: dict[str, list[str]] | None = None,
    batched: bool = False,
) -> bytes:
    """The response document with every output as JSON data, whatever ``binary_data``
    asked for (a JSON line holds JSON only)."""
    entries = json_outputs(outputs, request, model_name=model_name, labels=labels, batched=batched)
    return response_document(model_name, model_version, request_id, entries)


def json_outputs(
    outputs: list[OutputTensor],
    request: InferRequest,
    *,
    model_name: str,
    labels: dict[str, list[str]] | None = None,
    batched: bool = False,
) -> list[dict[str, Any]]:
    """The output entries ``request`` asked for, every one with its data as JSON."""
    selected = select_outputs(
        outputs, request, model_name=model_name, labels=labels, batched=batched
    )
    return [output_data(out) for out, _ in selected]


def responses_document(
    model_name: str, model_version: str, request_id: str, responses: list[list[dict[str, Any]]]
) -> bytes:
    """A decoupled model's responses collected into one answer (an async job's result, a
    batch job's line): ``responses``, each one's output entries, in order. conch's own
    form, the response document with ``responses`` in place of ``outputs``: the binary
    extension has one body per response, so the data is JSON."""
    doc: dict[str, Any] = {}
    if request_id:
        doc["id"] = request_id
    doc["model_name"] = model_name
    doc["model_version"] = str(model_version)
    doc["responses"] = [{"outputs": entries} for entries in responses]
    return json.dumps(doc, separators=(",", ":")).encode()
