"""OpenAI's API on the gateway: ``/v1/models``, ``/v1/embeddings`` and ``/v1/completions``.

A client written for OpenAI (its own Python client, with ``base_url`` set to the
gateway's ``/v1``) reaches the repository's models through these routes, on the same
data plane as the v2 routes: the same checks before anything is queued, the same
queues, deadlines and statistics. Which models each route serves, and how a body maps
onto their tensors, is ``openai_mapping``'s.

- ``GET /v1/models`` lists the ready models (``created``: when the model's config was
  last written; ``owned_by``: conch); ``GET /v1/models/<m>`` shows one. Both are in the
  ``metadata`` API group, as the v2 model metadata is.
- ``POST /v1/embeddings`` runs an embedding model once per ``max_batch_size`` texts,
  one request after another, and answers every vector in the order given, as floats or
  as base64 (OpenAI's Python client asks for base64 unless told otherwise).
- ``POST /v1/completions`` runs a model of Triton's ``text_input``/``text_output``
  convention. Unstreamed, the answer's text is every response's text joined; streamed
  (``stream: true``), each response is a Server-Sent Event as it comes, the last with
  ``finish_reason`` (``length`` when ``max_tokens`` cut the text, else ``stop``:
  ``openai_mapping``), then ``data: [DONE]``. An error after the first event is an event
  ``{"error": {...}}`` (OpenAI's client raises it), and the stream ends there.

Both inference routes are in the ``inference`` API group. A client that closes its
connection while it waits withdraws its request (``HangupWatch``). Every
error on these routes is OpenAI's ``{"error": {"message", "type", "param", "code"}}``
with conch's status; an unknown model is a 404.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from conch.core.errors import ConchError, Internal, InvalidArgument, Unavailable
from conch.core.restricted_apis import ApiGroup
from conch.frontend import calls, v2_json
from conch.frontend.dataplane import DataPlane, InferOutcome
from conch.frontend.http import openai_mapping as mapping
from conch.frontend.http.api_groups import api_group
from conch.frontend.http.fast_path import too_large
from conch.frontend.http.generate import SSE_TYPE
from conch.frontend.http.hangup_watch import HangupWatch
from conch.frontend.http.routes import plane
from conch.frontend.producer import Abandonment

log = logging.getLogger(__name__)

bp = Blueprint("openai", __name__)

OWNED_BY = "conch"
DONE = b"data: [DONE]\n\n"
LOST_RUN = (
    "the worker running this completion was lost and it ran again: the text streamed "
    "so far is void; send the request again"
)


def _json(doc: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(doc, separators=(",", ":")), status=status, mimetype="application/json"
    )


@bp.errorhandler(ConchError)
def _error(exc: ConchError) -> Response:
    response = _json(mapping.error_document(exc), exc.status)
    if exc.retry_after_s is not None:
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


@bp.errorhandler(Exception)
def _unexpected(exc: Exception) -> Response:
    if isinstance(exc, HTTPException):  # Flask's own refusals keep their status
        return _error(ConchError(exc.name, exc.code or 500))
    log.exception("unexpected error on an OpenAI route")
    return _error(Internal(f"internal error: {exc}"))


def _body() -> dict[str, Any]:
    """The request's JSON object, within ``--http-max-input-size``."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise mapping.OpenAIError("unsupported content-encoding, only 'identity' is supported")
    limit = plane().settings.max_input_bytes
    if (request.content_length or 0) > limit:
        raise too_large(request.content_length or 0, limit)
    body = request.get_data(cache=False)
    if len(body) > limit:
        raise too_large(len(body), limit)
    try:
        doc = json.loads(body)
    except RecursionError:
        raise mapping.OpenAIError(v2_json.DEPTH_ERROR) from None
    except ValueError as exc:
        raise mapping.OpenAIError(f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise mapping.OpenAIError("the body must be a JSON object")
    v2_json.check_depth(doc)
    return doc


def _target(data_plane: DataPlane, name: str) -> calls.Target:
    """The model's latest version; a model that is unknown, unloaded or broken is
    OpenAI's 404 (the data plane's 400 says which)."""
    try:
        return data_plane.target(name)
    except InvalidArgument as exc:
        raise mapping.unknown_model(name, exc.message) from None


# -- models ---------------------------------------------------------------------------
def _ready_names(data_plane: DataPlane) -> list[str]:
    return sorted({row["name"] for row in data_plane.index(ready_only=True)})


def _card(data_plane: DataPlane, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": _created(data_plane, name),
        "owned_by": OWNED_BY,
    }


def _created(data_plane: DataPlane, name: str) -> int:
    """When the model's config was last written (its folder's time for a model with no
    config file); 0 when neither can be read."""
    try:
        path = Path(data_plane.target(name).entry.path)
        config = path / "config.pbtxt"
        return int((config if config.exists() else path).stat().st_mtime)
    except (ConchError, OSError):
        return 0


@bp.get("/v1/models")
@api_group(ApiGroup.METADATA)
def list_models() -> Response:
    data_plane = plane()
    cards = [_card(data_plane, name) for name in _ready_names(data_plane)]
    return _json({"object": "list", "data": cards})


@bp.get("/v1/models/<model>")
@api_group(ApiGroup.METADATA)
def retrieve_model(model: str) -> Response:
    data_plane = plane()
    if model not in _ready_names(data_plane):
        raise mapping.unknown_model(model, "no ready version")
    return _json(_card(data_plane, model))


# -- embeddings -------------------------------------------------------------------------
@bp.post("/v1/embeddings")
@api_group(ApiGroup.INFERENCE)
def embeddings() -> Response:
    doc = _body()
    name = mapping.model_field(doc)
    data_plane = plane()
    to = _target(data_plane, name)
    model = mapping.EmbeddingModel.of(to.entry, to.version, to.decoupled)
    texts = mapping.embedding_texts(doc)
    fmt = mapping.embedding_format(doc)
    mapping.check_dimensions(doc, model.width)
    abandonment = Abandonment()
    watch = HangupWatch.start(request.environ, abandonment)
    traceparent = request.headers.get("traceparent", "")
    items: list[dict[str, Any]] = []
    tokens = 0
    try:
        for chunk in model.chunks(texts):
            outcome = data_plane.infer(
                to, model.request(chunk), abandonment=abandonment, traceparent=traceparent
            )
            vectors, counted = model.vectors(outcome, len(chunk))
            if not items and not model.width:  # a width the config leaves variable
                mapping.check_dimensions(doc, vectors.shape[1])
            items.extend(mapping.embedding_item(len(items), v, fmt) for v in vectors)
            tokens += counted
    finally:
        watch.stop()
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return _json({"object": "list", "data": items, "model": name, "usage": usage})


# -- completions ------------------------------------------------------------------------
class _Completion:
    """One completions call: every error before anything is queued is raised by the
    constructor; ``outcomes`` are the model's responses as they come."""

    def __init__(self) -> None:
        doc = _body()
        self.name = mapping.model_field(doc)
        data_plane = plane()
        to = _target(data_plane, self.name)
        model = mapping.TextModel.of(to.entry, to.version)
        self.fields = mapping.completion_fields(doc)
        self.limit = model.token_limit(self.fields)
        self.echoes = model.echoes(self.fields)
        self.prefix = self.fields.prompt if self.echoes else ""
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.usage = mapping.Usage()
        infer_request = model.request(self.fields)
        abandonment = Abandonment()
        self.watch = HangupWatch.start(request.environ, abandonment)
        traceparent = request.headers.get("traceparent", "")
        try:
            if to.decoupled:
                stream = data_plane.infer_stream(
                    to, infer_request, abandonment=abandonment, traceparent=traceparent
                )
                self.outcomes: Iterator[InferOutcome] = stream
                self._close: Callable[[], None] = stream.close
            else:
                self.outcomes = iter(
                    [
                        data_plane.infer(
                            to, infer_request, abandonment=abandonment, traceparent=traceparent
                        )
                    ]
                )
                self._close = lambda: None
        except BaseException:
            self.watch.stop()
            raise

    def close(self) -> None:
        self.watch.stop()
        self._close()

    def restart(self) -> None:
        self.usage = mapping.Usage()
        self.prefix = self.fields.prompt if self.echoes else ""

    def text(self, outcome: InferOutcome) -> str:
        self.usage.add(outcome)
        text = self.prefix + mapping.response_text(outcome)
        self.prefix = ""
        return text

    def finish(self, final: bool) -> str | None:
        """The choice's ``finish_reason`` on its last chunk (None before it)."""
        return self.usage.finish_reason(self.limit) if final else None

    def chunk(self, text: str | None, final: bool, usage: dict[str, int] | None = None) -> bytes:
        finish = self.finish(final)
        doc = mapping.completion_document(self.id, self.created, self.name, text, finish, usage)
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


@bp.post("/v1/completions")
@api_group(ApiGroup.INFERENCE)
def completions() -> Response:
    call = _Completion()
    if call.fields.stream:
        return _streamed(call)
    parts: list[str] = []
    try:
        for outcome in call.outcomes:
            if outcome.restarted:  # its worker was lost: a new run's text replaces the old
                parts.clear()
                call.restart()
            parts.append(call.text(outcome))
    finally:
        call.close()
    text = "".join(parts)
    doc = mapping.completion_document(
        call.id, call.created, call.name, text, call.finish(True), call.usage.document()
    )
    return _json(doc)


def _streamed(call: _Completion) -> Response:
    """The responses as SSE chunks; the status is the first response's."""
    try:
        first = next(call.outcomes, None)
    except BaseException:
        call.close()
        raise

    def body() -> Iterator[bytes]:
        try:
            outcome = first
            while outcome is not None:
                if outcome.restarted and outcome is not first:
                    raise Unavailable(LOST_RUN)
                yield call.chunk(call.text(outcome), outcome.final)
                outcome = next(call.outcomes, None)
            if first is None:  # a model that sent nothing still ends its choice
                yield call.chunk("", True)
            usage = call.usage.document()
            if call.fields.include_usage and usage is not None:
                yield call.chunk(None, True, usage)
            yield DONE
        except ConchError as exc:
            yield b"data: " + json.dumps(mapping.error_document(exc)).encode() + b"\n\n"
        except Exception as exc:
            log.exception("completion stream failed")
            yield (
                b"data: "
                + json.dumps(mapping.error_document(Internal(str(exc)))).encode()
                + b"\n\n"
            )
        finally:
            call.close()

    response = Response(body(), status=200, direct_passthrough=True)
    response.call_on_close(call.close)
    response.headers["Content-Type"] = SSE_TYPE
    response.headers["Cache-Control"] = "no-cache"
    return response


# -- the routes in OpenAPI ------------------------------------------------------------------
def openapi_paths(generic_errors: dict[str, str], triton_error: dict[str, Any]) -> dict[str, Any]:
    """These routes as OpenAPI 3.1 path items, for ``openapi.document`` to merge: every
    error answer is OpenAI's form, but those of ``generic_errors`` that gunicorn's parser
    gives before any route (414, 431) are Triton's (``triton_error``, a schema)."""
    error = {"content": {"application/json": {"schema": _OPENAI_ERROR}}}

    def op(op_id: str, tag: str, summary: str, ok: dict[str, Any], **extra: Any) -> dict[str, Any]:
        responses: dict[str, Any] = {"200": ok}
        for status, text in {**generic_errors, **_ERRORS}.items():
            parsed = status in ("414", "431")
            body = {"content": {"application/json": {"schema": triton_error}}} if parsed else error
            responses[status] = {"description": text, **body}
        return {
            "operationId": op_id,
            "tags": [tag],
            "summary": summary,
            "responses": dict(sorted(responses.items())),
            **extra,
        }

    def body(schema: dict[str, Any]) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {"schema": schema}}}

    def ok(text: str, schema: dict[str, Any], stream: bool = False) -> dict[str, Any]:
        content: dict[str, Any] = {"application/json": {"schema": schema}}
        if stream:
            content[SSE_TYPE.split(";")[0]] = {"schema": {"type": "string"}}
        return {"description": text, "content": content}

    model_param = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "/v1/models": {
            "get": op(
                "openaiListModels",
                "openai",
                "OpenAI: the ready models",
                ok("The models.", _MODEL_LIST),
            )
        },
        "/v1/models/{model}": {
            "parameters": [model_param],
            "get": op(
                "openaiRetrieveModel", "openai", "OpenAI: one ready model", ok("The model.", _MODEL)
            ),
        },
        "/v1/embeddings": {
            "post": op(
                "openaiEmbeddings",
                "openai",
                "OpenAI: embed texts with an embedding model (text_embedding)",
                ok("One vector per text, in order.", _EMBEDDINGS),
                requestBody=body(_EMBEDDING_REQUEST),
            )
        },
        "/v1/completions": {
            "post": op(
                "openaiCompletions",
                "openai",
                "OpenAI: complete a prompt with a text_input/text_output model",
                ok("The completion; streamed: SSE chunks, then `data: [DONE]`.", _COMPLETION, True),
                requestBody=body(_COMPLETION_REQUEST),
            )
        },
    }


_ERRORS = {
    "404": "No such model, or no ready version of it.",
    "500": "The model failed while running the request.",
    "501": "The request is valid but conch does not support it for this model.",
}
_STR: dict[str, Any] = {"type": "string"}
_INT: dict[str, Any] = {"type": "integer"}
_OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": _STR,
                "type": _STR,
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {"id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR},
}
_MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}},
}
_TEXTS = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "array",
            "minItems": 1,
            "maxItems": mapping.MAX_EMBEDDING_INPUTS,
            "items": {"type": "string", "minLength": 1},
        },
    ]
}
_EMBEDDING_REQUEST = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": _STR,
        "input": _TEXTS,
        "encoding_format": {"enum": list(mapping.ENCODINGS)},
        "dimensions": {"type": "integer", "minimum": 1},
        "user": _STR,
    },
}
_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "total_tokens"],
    "properties": {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT},
}
_EMBEDDINGS = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "model": _STR,
        "usage": _USAGE,
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["object", "index", "embedding"],
                "properties": {
                    "object": {"const": "embedding"},
                    "index": _INT,
                    "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, _STR]},
                },
            },
        },
    },
}
_COMPLETION_REQUEST = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": _STR,
        "prompt": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1,
                    "items": {"type": "string", "minLength": 1},
                },
            ]
        },
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": mapping.MAX_TOKENS},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "seed": {"type": "integer", "minimum": 0},
        "stop": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "maxItems": mapping.MAX_STOP_WORDS, "items": {"type": "string"}},
            ]
        },
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "echo": {"type": "boolean"},
        "user": _STR,
    },
}
_COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": _STR,
        "object": {"const": "text_completion"},
        "created": _INT,
        "model": _STR,
        "usage": _USAGE,
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "text", "finish_reason"],
                "properties": {
                    "index": _INT,
                    "text": _STR,
                    "logprobs": {"type": "null"},
                    "finish_reason": {"enum": ["stop", "length", None]},
                },
            },
        },
    },
}
