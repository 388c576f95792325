"""The API's own description: the OpenAPI document and a page to browse it.

``GET /v2/openapi.json`` answers ``openapi.document()``; ``GET /v2/docs`` is Swagger UI
over it. Both are in the ``metadata`` API group (``--http-restricted-api``). The page's scripts and style sheets come from the ``flask-swagger-ui`` package
and are served by the gateway itself, so the page works where the gateway has no way
out to the internet.
"""

from __future__ import annotations

from functools import cache

import orjson
from flask import Blueprint, Flask, Response
from flask_swagger_ui import get_swaggerui_blueprint

from conch.core.restricted_apis import ApiGroup
from conch.frontend.http import openapi
from conch.frontend.http.api_groups import api_group

bp = Blueprint("openapi", __name__)


@cache
def _encoded() -> bytes:
    return orjson.dumps(openapi.document())


@bp.get(openapi.DOCUMENT_PATH)
@api_group(ApiGroup.METADATA)
def document() -> Response:
    return Response(_encoded(), mimetype="application/json")


def register(app: Flask) -> None:
    """The document's route and the docs page (with the files the page loads)."""
    app.register_blueprint(bp)
    app.register_blueprint(
        get_swaggerui_blueprint(
            openapi.DOCS_PATH,
            openapi.DOCUMENT_PATH,
            config={"app_name": openapi.document()["info"]["title"]},
            blueprint_name="docs_page",
        )
    )
    # The page's own route is "/v2/docs/"; the document lists "/v2/docs", which without
    # a rule of its own would be a 404, not a 405, for a method it does not take.
    app.add_url_rule(openapi.DOCS_PATH, view_func=app.view_functions["docs_page.show"])
    # The page and its files describe the API, as the document does: Triton's metadata.
    for endpoint, view in app.view_functions.items():
        if endpoint.startswith("docs_page."):
            api_group(ApiGroup.METADATA)(view)
