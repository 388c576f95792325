"""Flask app factory and Triton's routes.

The routes are thin: decode (codec) → check against the config (validation) → hand
to the dispatcher → encode the reply. Every failure becomes Triton's
``{"error": "..."}`` body with Triton's status code.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any

import redis
from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException

from conch import __version__
from conch.core.errors import ConchError, InvalidArgument
from conch.frontend import model_control
from conch.frontend.http import job_routes
from conch.frontend.http.dataplane import DataPlane, InferFastPath, too_large
from conch.frontend.http.metrics import MetricsPort
from conch.frontend.model_view import ModelView
from conch.frontend.producer import Dispatcher
from conch.settings import Settings
from conch.wire import statistics

log = logging.getLogger(__name__)

EXTENSIONS = [
    "classification",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "schedule_policy",
    "statistics",
    "async_jobs",  # conch's own: /v2/models/<m>/jobs and /v2/jobs/<id> (job_routes)
]

v2 = Blueprint("v2", __name__)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(obj, separators=(",", ":")), status=status, mimetype="application/json"
    )


def _empty(status: int = 200) -> Response:
    return Response(b"", status=status)


def _catalog() -> ModelView:
    return current_app.extensions["conch.catalog"]


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


@v2.get("/v2/models/stats")
@v2.get("/v2/models/<model>/stats")
@v2.get("/v2/models/<model>/versions/<int:version>/stats")
def model_statistics(model: str | None = None, version: int | None = None) -> Response:
    """Triton's statistics extension: all models, one model, or one version."""
    catalog = _catalog()
    if model is None:
        names = [
            n
            for n, e in sorted(catalog.entries.items())
            if catalog.is_loaded(n) and e.config is not None and not e.error
        ]
        wanted = {n: list(catalog.entries[n].versions) for n in names}
    else:
        entry = catalog.serving(model)
        versions = [entry.resolve_version(str(version))] if version is not None else entry.versions
        wanted = {model: list(versions)}
    out = []
    for name, versions in wanted.items():
        counters = statistics.read(catalog.client, name)
        out.extend(statistics.model_stats(name, v, counters.get(v, {})) for v in versions)
    return _json({"model_stats": out})


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


# -- model control (explicit mode) ----------------------------------------------------
def _control_params(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    params = parsed.get("parameters", {}) if isinstance(parsed, dict) else None
    if not isinstance(params, dict):
        raise InvalidArgument(
            "the request must be a JSON object with an optional 'parameters' object"
        )
    return params


@v2.post("/v2/repository/models/<model>/load")
def load_model(model: str) -> Response:
    catalog = _catalog()
    model_control.require_explicit(catalog.settings)
    limit = catalog.settings.max_input_bytes
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
    model_control.load(
        catalog.client,
        catalog.settings,
        model,
        config=params.get("config"),
        files=files,
        states=lambda: catalog.states(max_age=0.05),
        refresh=catalog.refresh,
    )
    return _empty()


@v2.post("/v2/repository/models/<model>/unload")
def unload_model(model: str) -> Response:
    catalog = _catalog()
    params = _control_params(request.get_data(cache=False))
    model_control.unload(
        catalog.client,
        catalog.settings,
        model,
        unload_dependents=bool(params.get("unload_dependents", False)),
        states=lambda: catalog.states(max_age=0.05),
        refresh=catalog.refresh,
    )
    return _empty()


# -- inference -------------------------------------------------------------------------
@v2.post("/v2/models/<model>/infer")
@v2.post("/v2/models/<model>/versions/<int:version>/infer")
def infer(model: str, version: int | None = None) -> Response:
    """The Flask adapter of the data plane (the WSGI fast path normally answers first)."""
    plane: DataPlane = current_app.extensions["conch.dataplane"]
    length = request.content_length
    if length is not None and length > plane.settings.max_input_bytes:
        raise too_large(length, plane.settings.max_input_bytes)
    body, headers = plane.infer(
        model,
        "" if version is None else str(version),
        request.get_data(cache=False),
        header_length=request.headers.get("Inference-Header-Content-Length"),
        content_encoding=request.headers.get("Content-Encoding"),
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
    catalog = ModelView(settings, client)
    plane = DataPlane(settings, catalog, Dispatcher(client))
    app.extensions["conch.catalog"] = catalog
    app.extensions["conch.dataplane"] = plane
    app.url_map.strict_slashes = False
    app.url_map.merge_slashes = False  # "/v2/jobs//result" is a 404, not a redirect page
    app.register_blueprint(v2)
    app.register_blueprint(job_routes.bp)
    app.register_error_handler(ConchError, _conch_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
    catalog.follow()
    app.wsgi_app = InferFastPath(app.wsgi_app, plane)  # type: ignore[method-assign]
    if settings.allow_metrics:
        app.wsgi_app = MetricsPort(app.wsgi_app, catalog, settings.metrics_port)  # type: ignore[method-assign]
    return app
