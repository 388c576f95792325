"""Flask app factory and Triton's routes.

The routes are thin: decode (codec) → check against the config (validation) → hand
to the dispatcher → encode the reply. Every failure becomes Triton's
``{"error": "..."}`` body with Triton's status code.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis
from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException

from .. import __version__, codec, scheduling, validation
from ..broker import new_id
from ..dispatch import Dispatcher
from ..errors import ConchError, InvalidArgument, Unavailable
from ..settings import Settings
from ..wire import InferMessage
from .catalog import Catalog

log = logging.getLogger(__name__)

EXTENSIONS = [
    "classification",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "schedule_policy",
]

v2 = Blueprint("v2", __name__)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(obj, separators=(",", ":")), status=status, mimetype="application/json"
    )


def _empty(status: int = 200) -> Response:
    return Response(b"", status=status)


def _catalog() -> Catalog:
    return current_app.extensions["conch.catalog"]


def _dispatcher() -> Dispatcher:
    return current_app.extensions["conch.dispatcher"]


def _settings() -> Settings:
    return current_app.extensions["conch.settings"]


# -- health and metadata --------------------------------------------------------------
@v2.get("/v2/health/live")
def live() -> Response:
    return _empty()


@v2.get("/v2/health/ready")
def ready() -> Response:
    try:
        _catalog().client.ping()
    except redis.RedisError:
        return _empty(400)
    return _empty()


@v2.get("/v2")
def server_metadata() -> Response:
    return _json({"name": "conch", "version": __version__, "extensions": EXTENSIONS})


@v2.get("/v2/models/<model>")
@v2.get("/v2/models/<model>/versions/<int:version>")
def model_metadata(model: str, version: int | None = None) -> Response:
    entry = _catalog().serving(model)
    return _json(entry.metadata(None if version is None else entry.resolve_version(str(version))))


@v2.get("/v2/models/<model>/ready")
@v2.get("/v2/models/<model>/versions/<int:version>/ready")
def model_ready(model: str, version: int | None = None) -> Response:
    entry = _catalog().serving(model)
    v = entry.resolve_version("" if version is None else str(version))
    if not _catalog().version_ready(model, v):
        return _json({"error": "Model version not ready"}, 400)
    return _empty()


@v2.get("/v2/models/<model>/config")
@v2.get("/v2/models/<model>/versions/<int:version>/config")
def model_config(model: str, version: int | None = None) -> Response:
    entry = _catalog().serving(model)
    entry.resolve_version("" if version is None else str(version))
    return _json(entry.to_json())


@v2.post("/v2/repository/index")
def repository_index() -> Response:
    body = request.get_data(cache=False)
    ready_only = False
    if body.strip():
        try:
            parsed = json.loads(body)
        except ValueError as exc:
            raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
        if not isinstance(parsed, dict):
            raise InvalidArgument("the repository index request must be a JSON object")
        ready_only = bool(parsed.get("ready", False))
    return _json(_catalog().index(ready_only))


# -- inference -------------------------------------------------------------------------
@v2.post("/v2/models/<model>/infer")
@v2.post("/v2/models/<model>/versions/<int:version>/infer")
def infer(model: str, version: int | None = None) -> Response:
    settings = _settings()
    entry = _catalog().serving(model)
    v = entry.resolve_version("" if version is None else str(version))
    length = request.content_length
    if length is not None and length > settings.max_input_bytes:
        raise InvalidArgument(
            f"request body of {length} bytes exceeds the {settings.max_input_bytes}-byte limit "
            f"(--http-max-input-size)"
        )
    body = request.get_data(cache=False)
    if len(body) > settings.max_input_bytes:
        raise InvalidArgument(
            f"request body exceeds the {settings.max_input_bytes}-byte limit (--http-max-input-size)"
        )
    req = codec.decode_request(
        body,
        request.headers.get("Inference-Header-Content-Length"),
        request.headers.get("Content-Encoding"),
        max_body_bytes=settings.max_input_bytes,
    )
    config = entry.config
    validation.validate_request(req, config, model_name=model)
    reason = _catalog().unavailable_reason(model)
    if reason:
        raise Unavailable(f"model '{model}' is unavailable: {reason}")
    now = time.time()
    timeout_us = req.parameters.get("timeout")
    admission = scheduling.admit(config, req.parameters.get("priority"), timeout_us)
    timeout_s = timeout_us / 1e6 if timeout_us else settings.request_timeout_s
    all_outputs = [o.name for o in config.output]
    wanted = all_outputs if req.outputs is None else [o.name for o in req.outputs]
    custom = {k: val for k, val in req.parameters.items() if k not in codec.RESERVED_PARAMETERS}
    msg = InferMessage(
        id=new_id(),
        model=model,
        version=v,
        inputs=[(t.name, t.datatype, tuple(t.shape), t.raw) for t in req.inputs],
        outputs=wanted,
        reply_to=None,
        enqueued=now,
        deadline=now + timeout_s,
        priority=admission.step,
        params=custom,
        queue_deadline=now + admission.queue_timeout_s if admission.queue_timeout_s else 0.0,
        delay_on_timeout=admission.delay_on_timeout,
    )
    reply = _dispatcher().call(msg, max_queue_size=admission.max_queue_size)
    if reply.error is not None:
        raise reply.error
    wire_types = _catalog().output_types(entry)
    outputs = [
        codec.OutputTensor(name, wire_types.get(name, dt), tuple(shape), raw)
        for name, dt, shape, raw in reply.outputs or ()
    ]
    labels = entry.labels() if any(o.class_count for o in (req.outputs or ())) else None
    body, headers = codec.encode_response(
        model_name=model,
        model_version=str(v),
        request_id=req.id,
        outputs=outputs,
        request=req,
        labels=labels,
        batched=config.max_batch_size > 0,
        accept_encoding=request.headers.get("Accept-Encoding"),
    )
    return Response(body, status=200, headers=headers)


# -- errors ----------------------------------------------------------------------------
def _conch_error(exc: ConchError) -> Response:
    return _json({"error": exc.message}, exc.status)


def _http_error(exc: HTTPException) -> Response:
    return _json({"error": exc.name}, exc.code or 500)


def _unexpected(exc: Exception) -> Response:
    log.exception("unexpected error")
    return _json({"error": f"internal error: {exc}"}, 500)


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or Settings()
    app = Flask("conch")
    client = redis.Redis.from_url(settings.redis_url)
    app.extensions["conch.settings"] = settings
    app.extensions["conch.catalog"] = Catalog(settings, client)
    app.extensions["conch.dispatcher"] = Dispatcher(client)
    app.url_map.strict_slashes = False
    app.register_blueprint(v2)
    app.register_error_handler(ConchError, _conch_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
    return app
