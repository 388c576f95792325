"""The gateway's composition root: ``create_app`` wires the HTTP frontend to its data plane.

Nothing here handles a request. The pieces, each in its own module:

- ``DataPlane`` (``conch.frontend.dataplane``): every v2 operation on neutral types,
  over the model view, the dispatcher and the job store, built as every frontend builds
  it (``conch.frontend.composition``);
- ``fast_path``: the one infer entry, ahead of Flask (and without WSGI under the gevent
  worker);
- ``routes`` and ``job_routes``: the other routes, HTTP → DataPlane → HTTP, and the one
  mapping of errors to Triton's body and status;
- ``generate``: Triton's generate extension (``generate``, ``generate_stream``: SSE);
- ``openai_routes``: OpenAI's ``/v1`` models, embeddings and completions;
- ``shared_memory_routes``: Triton's shared-memory extension (``--allow-client-shm``);
- ``api_groups``: ``--http-restricted-api``, each route's group and the header check;
- ``docs_routes``: the OpenAPI document of all of them (``openapi``) and its docs page;
- ``metrics``: the metrics port.
"""

from __future__ import annotations

from flask import Flask

from conch.frontend.composition import build_dataplane
from conch.frontend.http import (
    api_groups,
    docs_routes,
    generate,
    job_routes,
    openai_routes,
    routes,
    shared_memory_routes,
)
from conch.frontend.http.fast_path import InferFastPath
from conch.frontend.http.metrics import MetricsPort
from conch.settings import Settings


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or Settings.from_env()
    plane = build_dataplane(settings)
    app = Flask("conch", static_folder=None)  # no file route the API does not list
    app.extensions[routes.PLANE] = plane  # the gevent worker takes it from here
    app.url_map.strict_slashes = False
    app.url_map.merge_slashes = False  # "/v2/jobs//result" is a 404, not a redirect page
    app.register_blueprint(routes.v2)
    app.register_blueprint(job_routes.bp)
    app.register_blueprint(generate.bp)
    app.register_blueprint(openai_routes.bp)
    app.register_blueprint(shared_memory_routes.bp)
    if settings.http_restricted_api:
        app.before_request(api_groups.checker(settings.http_restricted_api))
    docs_routes.register(app)
    app.wsgi_app = InferFastPath(app.wsgi_app, plane)  # type: ignore[method-assign]
    if settings.allow_metrics:
        app.wsgi_app = MetricsPort(app.wsgi_app, plane, settings.metrics_port)  # type: ignore[method-assign]
    return app
