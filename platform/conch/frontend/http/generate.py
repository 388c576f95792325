"""Triton's generate extension: ``POST v2/models/<m>[/versions/<v>]/generate`` and
``.../generate_stream``, a text-oriented body mapped onto the model's tensors.

The body is one JSON object. Each top-level field whose name is one of the model's
inputs becomes that input (a scalar is one element, a flat list as many); any other
field becomes a request parameter (a string, integer, boolean or number). A
``parameters`` object is read the same way, one level down: its fields may be inputs
too. ``id`` is the request's id (and, as in Triton, a parameter as well). An input's
shape is the model's (its metadata shape, the batch dimension included) with the
elements spread over it: fixed dimensions first, the innermost variable one takes what
is left, other variable ones are 1. An answer is one JSON object: ``id`` (when the
request had one), ``model_name``, ``model_version`` and each output by name, a
one-element output as its bare value, others as a flat list; fields in Triton's order
(sorted by name).

- ``generate`` answers once, ``application/json``. A model that sends any other number
  of responses than one (a decoupled model may) gets Triton's error for it.
- ``generate_stream`` answers as Server-Sent Events (``text/event-stream``): one
  ``data: {...}`` event per response as it arrives. The status is the first response's:
  an error after it is an event ``data: {"error": "..."}``, the status staying 200, as
  Triton sends it. A decoupled model's empty final response sends nothing.

conch's own, for a decoupled model's ``generate_stream``: the stream outlives its
connection (``conch.wire.stream_log``). Its answer's ``Content-Location`` is
``/v2/streams/<id>``, and each event has an ``id:`` (``<run>-<seq>``). A client whose
connection drops sends ``GET /v2/streams/<id>`` with ``Last-Event-ID``, to this gateway
or another, within ``--stream-keep-secs``, and gets exactly the events it had not
received. One that does not come back within ``--stream-grace-secs`` cancels the request.
When a worker dies mid-stream, the request runs again elsewhere, and an ``event: restart``
comes before the new run's first response: the client drops the responses before it.

Either way an error found before anything is queued (an unknown model, a body that fits
no input, a missing input) is Triton's plain JSON error with its status. A client that
closes its connection while it waits (``HangupWatch``) withdraws its request if no worker
took it yet, and ends its stream (``producer.Abandonment``, as a cancelled gRPC call).

Triton's words are kept for the errors its tests read; where Triton answers a client's
malformed value with a 500 (its JSON reader's "attempt to access JSON non-string as
string"), this answers 400, as conch's infer does. Priority, timeout and the sequence
parameters are the ones infer reads, with infer's checks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, request

from conch.core import tensors, validation
from conch.core.errors import ConchError, Internal, InvalidArgument
from conch.core.inference import (
    ALLOWED_TRITON_PARAMETERS,
    InferRequest,
    InputTensor,
)
from conch.core.restricted_apis import ApiGroup
from conch.frontend import calls, v2_json
from conch.frontend.dataplane import DataPlane, InferOutcome, InferStream
from conch.frontend.http.api_groups import api_group
from conch.frontend.http.fast_path import error_answer, too_large
from conch.frontend.http.hangup_watch import HangupWatch
from conch.frontend.http.routes import plane
from conch.frontend.producer import Abandonment
from conch.frontend.stream_resume import ResumedStream, resume
from conch.wire.stream_log import Position

log = logging.getLogger(__name__)

bp = Blueprint("generate", __name__)

SSE_TYPE = "text/event-stream; charset=utf-8"
PARAMETERS = "parameters"  # the one nested object of a generate body
# Triton's words where ``generate`` gets other than one response.
NOT_ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model "
    "that generates various number of responses"
)
STREAMS_PATH = "/v2/streams/"  # where a kept stream is read again

Answer = InferOutcome | ConchError  # one response: outputs, or its error


@dataclass(frozen=True)
class Event:
    """One response as an SSE event: its ``answer``, and for a kept stream its place
    (``position``, the event's id) and whether it begins a new run (``restarted``)."""

    answer: Answer
    position: Position | None = None
    restarted: bool = False


# -- the body: JSON fields → tensors and parameters ------------------------------------
class _Object(dict[str, Any]):
    """A JSON object as parsed, with its members in order, duplicates included (Triton
    reads every member: a name given twice is an input added twice)."""

    members: list[tuple[str, Any]]


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    for key, value in pairs:
        obj.setdefault(key, value)  # the first, as Triton's lookups find it
    obj.members = pairs
    return obj


def parse_body(body: bytes) -> _Object:
    """The generate body: a JSON object (an empty body is an empty one, as in Triton)."""
    if not body.strip():
        return _object([])
    try:
        doc = json.loads(body, object_pairs_hook=_object)
    except RecursionError:
        raise InvalidArgument(v2_json.DEPTH_ERROR) from None
    except ValueError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, _Object):
        raise InvalidArgument("the generate request JSON must be an object")
    v2_json.check_depth(doc)
    return doc


def decode_request(
    doc: _Object, inputs: Sequence[dict[str, Any]], *, max_input_bytes: int = 0
) -> InferRequest:
    """``doc`` (``parse_body``) as an infer request to a model whose metadata ``inputs``
    (name, datatype, shape) are given; ``max_input_bytes`` (0: none) bounds the tensors'
    bytes, as ``--http-max-input-size`` does."""
    request_id = ""
    if "id" in doc:
        if not isinstance(doc["id"], str):
            raise InvalidArgument(
                "Unable to parse 'id': attempt to access JSON non-string as string"
            )
        request_id = doc["id"]
    built = _Built({spec["name"]: spec for spec in inputs}, max_input_bytes)
    built.members(doc.members, nested=False)
    _check_reserved(built.parameters)
    return InferRequest(
        id=request_id,
        inputs=built.inputs,
        outputs=None,  # every output, in JSON
        binary_data_output=False,
        parameters=built.parameters,
    )


class _Built:
    """The inputs and parameters read so far."""

    def __init__(self, specs: dict[str, dict[str, Any]], max_input_bytes: int) -> None:
        self.specs = specs
        self.max_input_bytes = max_input_bytes
        self.consumed = 0
        self.inputs: list[InputTensor] = []
        self.parameters: dict[str, Any] = {}

    def members(self, members: list[tuple[str, Any]], *, nested: bool) -> None:
        for key, value in members:
            if key == PARAMETERS and not nested:
                self.nested(value)
            elif key in self.specs:
                self.tensor(self.specs[key], value)
            else:
                self.parameters[key] = parameter_value(key, value)

    def nested(self, value: Any) -> None:
        if PARAMETERS in self.specs:
            raise InvalidArgument(
                f"Keyword '{PARAMETERS}' for nested schema also given as input tensor name"
            )
        if not isinstance(value, _Object):
            raise InvalidArgument(
                f"Expected JSON object for keyword: '{PARAMETERS}': "
                "attempt to access JSON non-object as object"
            )
        try:
            self.members(value.members, nested=True)
        except InvalidArgument as exc:
            raise InvalidArgument(f"Converting keyword: '{PARAMETERS}': {exc.message}") from None

    def tensor(self, spec: dict[str, Any], value: Any) -> None:
        name = spec["name"]
        if any(t.name == name for t in self.inputs):
            raise InvalidArgument(f"input '{name}' already exists in request")
        tensor = input_tensor(name, spec["datatype"], spec["shape"], value)
        size = len(tensor.raw)
        if self.max_input_bytes and size + self.consumed > self.max_input_bytes:
            raise InvalidArgument(
                f"request size of {self.consumed} bytes with input '{name}' of size {size} "
                f"bytes exceeds the maximum allowed input size of {self.max_input_bytes}. "
                "Use --http-max-input-size to increase the limit."
            )
        self.consumed += size
        self.inputs.append(tensor)


def parameter_value(key: str, value: Any) -> str | int | float | bool:
    """A field that names no input: a request parameter, as Triton takes it."""
    if isinstance(value, str | int | float):  # bool is an int
        return value
    raise InvalidArgument(
        f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
    )


def _check_reserved(params: dict[str, Any]) -> None:
    """The parameters conch reads itself (infer's), with infer's checks."""
    for key, value in params.items():
        if key.startswith("triton_") and key not in ALLOWED_TRITON_PARAMETERS:
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage "
                f"and should not be specified: '{key}'"
            )
        uint = type(value) is int and value >= 0
        if key in ("priority", "timeout") and not uint:
            raise InvalidArgument(f"parameter '{key}' must be an unsigned integer")
        if key in ("sequence_start", "sequence_end", "binary_data_output") and (
            type(value) is not bool
        ):
            raise InvalidArgument(f"parameter '{key}' must be a boolean")
        if key == "sequence_id" and not (uint or isinstance(value, str)):
            raise InvalidArgument("parameter 'sequence_id' must be an unsigned integer or a string")


# Triton's JSON reader's words for a value of the wrong JSON type, by datatype.
_INTS = ("INT8", "INT16", "INT32", "INT64")
_UINTS = ("UINT8", "UINT16", "UINT32", "UINT64")


def _kind_error(datatype: str, value: Any) -> str | None:
    """What Triton says of ``value`` as an element of ``datatype``; None when it fits."""
    if datatype == "BYTES":
        ok, what = isinstance(value, str), "non-string as string"
    elif datatype == "BOOL":
        ok, what = isinstance(value, bool), "non-boolean as boolean"
    elif datatype in _INTS:
        ok, what = type(value) is int, "non-signed-integer as signed-integer"
    elif datatype in _UINTS:
        ok = type(value) is int and value >= 0
        what = "non-unsigned-integer as unsigned-integer"
    else:
        ok = type(value) in (int, float)
        what = "non-number as double"
    return None if ok else f"attempt to access JSON {what}"


def input_tensor(name: str, datatype: str, shape: Sequence[int], value: Any) -> InputTensor:
    """One field as the input ``name`` (``datatype``, metadata ``shape``): a scalar or a
    list, in Triton's words when it cannot be one."""
    if datatype in ("FP16", "BF16"):
        raise InvalidArgument(
            f"receiving {datatype} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    count = len(value) if isinstance(value, list) else 1
    leaves = _leaves(value)
    prefix = "Unable to parse JSON bytes array" if datatype == "BYTES" else "Unable to parse 'data'"
    for leaf in leaves:
        problem = _kind_error(datatype, leaf)
        if problem is not None:
            raise InvalidArgument(f"{prefix}: {problem}")
    if len(leaves) != count:  # a list of lists: Triton takes a scalar or a flat list
        raise InvalidArgument(f"{prefix}: Shape does not match true shape of 'data' field")
    if count == 0:
        return InputTensor(name, datatype, (), b"")  # as Triton adds an empty input
    dims = spread(count, shape, name)
    return InputTensor(name, datatype, dims, tensors.json_to_raw(datatype, dims, leaves, name))


def _leaves(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return [value]
    out: list[Any] = []
    stack = [iter(value)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def spread(count: int, shape: Sequence[int], name: str) -> tuple[int, ...]:
    """``count`` elements over a metadata ``shape`` (-1: variable), as Triton spreads
    them: each fixed dimension takes its size, the innermost variable one the rest, and
    every other variable one is 1."""
    left = count
    for dim in shape:
        if dim != -1:
            if dim <= 0 or left % dim:
                raise _no_shape(name)
            left //= dim
    dims = list(shape)
    for i in range(len(dims) - 1, -1, -1):
        if dims[i] == -1:
            dims[i], left = left, 1
    if left != 1:
        raise _no_shape(name)
    return tuple(dims)


def _no_shape(name: str) -> InvalidArgument:
    return InvalidArgument(f"The schema can not convert input '{name}' to tensor with proper shape")


# -- the answer: outputs → JSON fields ------------------------------------------------
def response_document(outcome: InferOutcome) -> dict[str, Any]:
    """One response as Triton's generate writes it: ``id`` when the request had one,
    ``model_name``, ``model_version``, then each output by name (a name already used
    is left out), a one-element output as its value; sorted by name."""
    fields: dict[str, Any] = {}
    if outcome.request.id:
        fields["id"] = outcome.request.id
    fields["model_name"] = outcome.model
    fields["model_version"] = str(outcome.version)
    for out in outcome.outputs:
        if out.name in fields:
            continue
        data = tensors.raw_to_json(out.datatype, out.shape, out.raw, out.name)
        count = tensors.element_count(out.shape)
        fields[out.name] = data[0] if count == 1 else data
    return dict(sorted(fields.items()))


def _document(answer: Answer) -> dict[str, Any]:
    if isinstance(answer, ConchError):
        return {"error": answer.message}
    return response_document(answer)


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def sse_event(event: Event) -> bytes:
    """One response (or its error) as a Server-Sent Event, after an ``event: restart``
    when a new run of the request begins with it."""
    head = b""
    if event.restarted:
        head = b"event: restart\ndata: {}\n\n"
    if event.position is not None and not isinstance(event.answer, ConchError):
        head += b"id: " + str(event.position).encode() + b"\n"
    return head + b"data: " + _dumps(_document(event.answer)) + b"\n\n"


# -- the calls --------------------------------------------------------------------------
class _Call:
    """One generate call, up to its responses: every error before anything is queued
    is raised by the constructor (Triton's JSON error); ``answers`` are the responses."""

    def __init__(self, model: str, version: int | None, *, keep: bool) -> None:
        data_plane = plane()
        to = data_plane.target(model, "" if version is None else str(version))
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            raise InvalidArgument("Unsupported content-encoding, only 'identity' is supported.")
        limit = data_plane.settings.max_input_bytes
        if (request.content_length or 0) > limit:
            raise too_large(request.content_length or 0, limit)
        body = request.get_data(cache=False)
        if len(body) > limit:  # a chunked body, whose size no header gave
            raise too_large(len(body), limit)
        doc = parse_body(body)
        inputs = to.entry.metadata(to.version)["inputs"]
        decoded = decode_request(doc, inputs, max_input_bytes=limit)
        self.abandonment = Abandonment()
        self.watch = HangupWatch.start(request.environ, self.abandonment)
        self.location = ""  # where a kept stream is read again
        try:
            traceparent = request.headers.get("traceparent", "")
            if not to.decoupled:
                validation.validate_request(decoded, to.entry.config, model_name=to.entry.name)
                self.answers = _one(data_plane, to, decoded, self.abandonment, traceparent)
            else:
                stream = data_plane.infer_stream(
                    to, decoded, abandonment=self.abandonment, traceparent=traceparent, keep=keep
                )
                if stream.kept:
                    self.location = STREAMS_PATH + stream.message_id
                self.answers = _streamed(stream)
        except BaseException:
            self.watch.stop()
            raise

    def close(self) -> None:
        self.watch.stop()
        self.answers.close()


def _one(
    data_plane: DataPlane,
    to: calls.Target,
    decoded: InferRequest,
    abandonment: Abandonment,
    traceparent: str,
) -> Iterator[Event]:
    """A model that is not decoupled: its one response, run as it is asked for."""
    try:
        yield Event(data_plane.infer(to, decoded, abandonment=abandonment, traceparent=traceparent))
    except ConchError as exc:
        yield Event(exc)
    except Exception as exc:
        log.exception("generate failed")
        yield Event(Internal(f"internal error: {exc}"))


def _streamed(stream: InferStream | ResumedStream) -> Iterator[Event]:
    """A decoupled model's responses as they come, each an event (a kept stream's with
    its place); an error ends them. A restart with no response to show (the new run
    ended with only its final flag) is still told."""
    position = None
    try:
        for outcome in stream:
            position = stream.position if stream.kept else None
            if not outcome.flag_only:
                yield Event(outcome, position, outcome.restarted)
            elif outcome.restarted:
                yield Event(outcome, position, True)
    except ConchError as exc:
        yield Event(exc, position)
    except Exception as exc:
        log.exception("generate stream failed")
        yield Event(Internal(f"internal error: {exc}"), position)
    finally:
        stream.close()


@bp.post("/v2/models/<model>/generate")
@bp.post("/v2/models/<model>/versions/<int:version>/generate")
@api_group(ApiGroup.INFERENCE)
def generate(model: str, version: int | None = None) -> Response:
    """One JSON answer: the model's one response, or Triton's error when it sent any
    other number (as Triton's documentation asks, an error status: Triton's own
    server, which has sent its headers by then, says 200)."""
    call = _Call(model, version, keep=False)
    try:
        answers = [event.answer for event in call.answers]
    finally:
        call.close()
    if len(answers) != 1:
        answers = [Internal(NOT_ONE_RESPONSE)]
    answer = answers[0]
    if isinstance(answer, ConchError):
        status, headers, payload = error_answer(answer)
        return Response(payload, status=status, headers=headers)
    return Response(_dumps(response_document(answer)), status=200, mimetype="application/json")


@bp.post("/v2/models/<model>/generate_stream")
@bp.post("/v2/models/<model>/versions/<int:version>/generate_stream")
@api_group(ApiGroup.INFERENCE)
def generate_stream(model: str, version: int | None = None) -> Response:
    """Server-Sent Events, one per response as it comes; the status is the first
    response's (200 when there is none)."""
    call = _Call(model, version, keep=True)
    return _sse(call.answers, call.close, call.location)


@bp.get("/v2/streams/<stream_id>")
@api_group(ApiGroup.INFERENCE)
def resume_stream(stream_id: str) -> Response:
    """A kept stream again, after its ``Last-Event-ID`` (from its start without one):
    conch's own route, for an SSE client whose connection dropped."""
    abandonment = Abandonment()
    last = request.headers.get("Last-Event-ID", "")
    stream = resume(plane(), stream_id, last, abandonment)
    watch = HangupWatch.start(request.environ, abandonment)

    def close() -> None:
        watch.stop()
        stream.close()

    return _sse(_streamed(stream), close, STREAMS_PATH + stream_id)


def _sse(events: Iterator[Event], close: Callable[[], None], location: str) -> Response:
    """``events`` as an SSE answer whose status is the first event's."""
    try:
        first = next(events, None)
    except BaseException:
        close()
        raise
    status = first.answer.status if first and isinstance(first.answer, ConchError) else 200

    def body() -> Iterator[bytes]:
        try:
            if first is not None:
                yield sse_event(first)
            for event in events:
                yield sse_event(event)
        finally:
            close()

    response = Response(body(), status=status, direct_passthrough=True)
    response.call_on_close(close)  # also when the body is never read
    response.headers["Content-Type"] = SSE_TYPE
    response.headers["Cache-Control"] = "no-cache"
    if location:
        response.headers["Content-Location"] = location
    return response
