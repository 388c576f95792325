"""Triton's HTTP/REST routes, other than infer: HTTP in, a ``DataPlane`` call, HTTP out.

Health, server and model metadata, model config and readiness, statistics, the
repository API (index, load, unload, and conch's traffic splits) and the logging extension. A route parses its URL, query and body, calls
the data plane, and encodes the answer; it never reaches Redis or the model view
itself. Infer calls are answered by ``fast_path.serve_infer`` before Flask sees them;
the infer route here only makes their path known to Flask.

Every failure becomes Triton's ``{"error": "..."}`` body with Triton's status code,
mapped once here for the whole app (``ConchError`` carries the status).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from typing import Any

from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import HTTPException

from conch.core.errors import ConchError, Internal, InvalidArgument
from conch.core.restricted_apis import ApiGroup
from conch.frontend import v2_json
from conch.frontend.dataplane import DataPlane
from conch.frontend.http.api_groups import api_group
from conch.frontend.http.fast_path import error_answer, too_large

log = logging.getLogger(__name__)

PLANE = "conch.dataplane"  # where create_app keeps the data plane (the gevent worker reads it)

v2 = Blueprint("v2", __name__)


def plane() -> DataPlane:
    return current_app.extensions[PLANE]


def _json(obj: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(obj, separators=(",", ":")), status=status, mimetype="application/json"
    )


def _empty(status: int = 200) -> Response:
    return Response(b"", status=status)


def _version(version: int | None) -> str:
    return "" if version is None else str(version)


# -- health and metadata --------------------------------------------------------------
@v2.get("/v2/health/live")
@api_group(ApiGroup.HEALTH)
def live() -> Response:
    return _empty(200 if plane().live() else 400)


@v2.get("/v2/health/ready")
@api_group(ApiGroup.HEALTH)
def ready() -> Response:
    return _empty(200 if plane().ready() else 400)


@v2.get("/v2")
@api_group(ApiGroup.METADATA)
def server_metadata() -> Response:
    return _json(plane().server_metadata())


@v2.get("/v2/models/<model>")
@v2.get("/v2/models/<model>/versions/<int:version>")
@api_group(ApiGroup.METADATA)
def model_metadata(model: str, version: int | None = None) -> Response:
    return _json(plane().model_metadata(model, _version(version)))


@v2.get("/v2/models/<model>/ready")
@v2.get("/v2/models/<model>/versions/<int:version>/ready")
@api_group(ApiGroup.HEALTH)
def model_ready(model: str, version: int | None = None) -> Response:
    if not plane().model_ready(model, _version(version)):
        return _json({"error": "Model version not ready"}, 400)
    return _empty()


@v2.get("/v2/models/stats")
@v2.get("/v2/models/<model>/stats")
@v2.get("/v2/models/<model>/versions/<int:version>/stats")
@api_group(ApiGroup.STATISTICS)
def model_statistics(model: str | None = None, version: int | None = None) -> Response:
    """Triton's statistics extension: all models, one model, or one version."""
    return _json({"model_stats": plane().statistics(model, _version(version))})


@v2.get("/v2/models/<model>/config")
@v2.get("/v2/models/<model>/versions/<int:version>/config")
@api_group(ApiGroup.MODEL_CONFIG)
def model_config(model: str, version: int | None = None) -> Response:
    return _json(plane().model_config(model, _version(version)))


# -- inference -------------------------------------------------------------------------
@v2.post("/v2/models/<model>/infer")
@v2.post("/v2/models/<model>/versions/<int:version>/infer")
@api_group(ApiGroup.INFERENCE)
def infer(model: str, version: int | None = None) -> Response:
    """Never answers a call: every server hands a POST here to ``fast_path.serve_infer``
    before Flask routes it (``InferFastPath`` ahead of the WSGI app, the gevent worker
    without WSGI). The route makes the path known to Flask: other methods get a 405
    with ``Allow``, OPTIONS its answer, and the restricted ``inference`` group is
    checked ahead of both (``api_groups``)."""
    raise Internal(f"infer call to '{model}' reached Flask, past fast_path.InferFastPath")


# -- the model repository --------------------------------------------------------------
def _parse(body: bytes) -> Any:
    """A JSON body (not blank), no deeper than infer bodies may be."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise InvalidArgument(v2_json.DEPTH_ERROR) from None
    except ValueError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    v2_json.check_depth(doc)
    return doc


@v2.post("/v2/repository/index")
@api_group(ApiGroup.MODEL_REPOSITORY)
def repository_index() -> Response:
    body = request.get_data(cache=False)
    ready_only = False
    if body.strip():
        try:
            parsed = _parse(body)
        except InvalidArgument:
            # Nested too deep to read, but plainly no boolean: Triton answers as it does
            # for any 'ready' that is not one.
            if _READY_NESTS.match(body):
                raise InvalidArgument(_not_a_boolean("ready")) from None
            raise
        if not isinstance(parsed, dict):
            raise InvalidArgument("the repository index request must be a JSON object")
        ready_only = _flag(parsed, "ready")
    return _json(plane().index(ready_only))


# A body whose 'ready' opens an array or an object: no boolean, however deep it goes.
_READY_NESTS = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')


def _not_a_boolean(key: str) -> str:
    return f"Invalid value for '{key}': expected a boolean"  # Triton's words


def _flag(params: dict[str, Any], key: str) -> bool:
    """An optional boolean of a request body: false when absent, a 400 when no boolean."""
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InvalidArgument(_not_a_boolean(key))
    return value


def _control_params(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    parsed = _parse(body)
    params = parsed.get("parameters", {}) if isinstance(parsed, dict) else None
    if not isinstance(params, dict):
        raise InvalidArgument(
            "the request must be a JSON object with an optional 'parameters' object"
        )
    return params


@v2.post("/v2/repository/models/<model>/load")
@api_group(ApiGroup.MODEL_REPOSITORY)
def load_model(model: str) -> Response:
    """Explicit model control. ``file:<version>/<path>`` parameters carry file contents
    in base64, as Triton's HTTP API does."""
    data_plane = plane()
    limit = data_plane.settings.max_input_bytes
    if (request.content_length or 0) > limit:
        raise too_large(request.content_length or 0, limit)
    params = _control_params(request.get_data(cache=False))
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if not key.startswith("file:"):
            continue
        if not isinstance(value, str):
            raise InvalidArgument(
                f"failed to load '{model}': parameter '{key}' must be base64 text"
            )
        try:
            files[key] = base64.b64decode(value, validate=True)
        except (ValueError, binascii.Error) as exc:
            raise InvalidArgument(f"failed to load '{model}': {key}: {exc}") from None
    data_plane.load(model, config=params.get("config"), files=files)
    return _empty()


@v2.post("/v2/repository/models/<model>/unload")
@api_group(ApiGroup.MODEL_REPOSITORY)
def unload_model(model: str) -> Response:
    params = _control_params(request.get_data(cache=False))
    plane().unload(model, unload_dependents=_flag(params, "unload_dependents"))
    return _empty()


# Traffic splits across a model's versions (conch's own: canary, A/B, shadow), in the
# model-repository group with load and unload (``conch.frontend.traffic``).
@v2.get("/v2/repository/models/<model>/traffic")
@api_group(ApiGroup.MODEL_REPOSITORY)
def traffic_split(model: str) -> Response:
    return _json(plane().traffic_split(model))


@v2.post("/v2/repository/models/<model>/traffic")
@api_group(ApiGroup.MODEL_REPOSITORY)
def set_traffic_split(model: str) -> Response:
    """``{"weights": {"<version>": <weight>, ...}, "shadow": {"version": v, "share": s}}``;
    no weights and no shadow clear it. Answers the split that follows."""
    data_plane = plane()
    limit = data_plane.settings.max_input_bytes
    if (request.content_length or 0) > limit:
        raise too_large(request.content_length or 0, limit)
    body = request.get_data(cache=False)
    if not body.strip():
        raise InvalidArgument(f"the traffic split of model '{model}' needs a JSON body")
    return _json(data_plane.set_traffic_split(model, _parse(body)))


@v2.delete("/v2/repository/models/<model>/traffic")
@api_group(ApiGroup.MODEL_REPOSITORY)
def clear_traffic_split(model: str) -> Response:
    return _json(plane().clear_traffic_split(model))


# -- logging ----------------------------------------------------------------------------
@v2.get("/v2/logging")
@api_group(ApiGroup.LOGGING)
def log_settings() -> Response:
    """Triton's logging extension: this process's log settings."""
    return _json(plane().log_settings())


@v2.post("/v2/logging")
@api_group(ApiGroup.LOGGING)
def update_log_settings() -> Response:
    """Change them in every process; answers the settings that follow."""
    return _json(plane().update_log_settings(_parse(request.get_data(cache=False))))


# -- tracing ----------------------------------------------------------------------------
@v2.get("/v2/trace/setting")
@v2.get("/v2/models/<model>/trace/setting")
@api_group(ApiGroup.TRACE)
def trace_settings(model: str = "") -> Response:
    """Triton's trace extension: the sampling settings, for every model or for one."""
    return _json(plane().trace_settings(model))


@v2.post("/v2/trace/setting")
@v2.post("/v2/models/<model>/trace/setting")
@api_group(ApiGroup.TRACE)
def update_trace_settings(model: str = "") -> Response:
    """Change them in every process; answers the settings that follow."""
    return _json(plane().update_trace_settings(_parse(request.get_data(cache=False)), model))


# -- errors: Triton's body and status, for every route of the app ------------------------
@v2.app_errorhandler(ConchError)
def _conch_error(exc: ConchError) -> Response:
    status, headers, payload = error_answer(exc)
    return Response(payload, status=status, headers=headers)


@v2.app_errorhandler(HTTPException)
def _http_error(exc: HTTPException) -> Response:
    response = _json({"error": exc.name}, exc.code or 500)
    for name, value in exc.get_headers():  # a 405's Allow (RFC 9110 requires it)
        if name.lower() != "content-type":
            response.headers[name] = value
    return response


@v2.app_errorhandler(Exception)
def _unexpected(exc: Exception) -> Response:
    log.exception("unexpected error")
    return _json({"error": f"internal error: {exc}"}, 500)
