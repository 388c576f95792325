"""The OpenAPI document against the app it describes, and against OpenAPI itself.

The real server is fuzzed against the document in tests/integration/http/test_openapi.py; here, with no
server: the document is valid OpenAPI 3.1, and the app's routes and the document's paths
are the same set, method for method, so neither gains a route the other lacks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openapi_spec_validator import validate

from conch.core.datatypes import WIRE_TYPES
from conch.frontend.dataplane import MAX_JOB_WAIT_S
from conch.frontend.http import openapi
from conch.frontend.http.app import create_app
from conch.settings import Settings
from conch.wire import statistics

_METHODS = {"get", "put", "post", "delete", "patch"}


def test_the_document_is_valid_openapi() -> None:
    validate(openapi.document())


def _app_routes(tmp_path: Path) -> set[tuple[str, str]]:
    # No Redis is reached: the app only connects on a request.
    app = create_app(Settings(model_repository=tmp_path, redis_url="redis://127.0.0.1:1/0"))
    routes = set()
    for rule in app.url_map.iter_rules():
        # <model>, <int:version>, <path:path> -> {model}, {version}, {path}; "/v2/docs/"
        # and "/v2/docs" are one route (the app does not insist on a trailing slash).
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule).rstrip("/")
        routes.update((path, m.lower()) for m in rule.methods or () if m.lower() in _METHODS)
    return routes


def test_every_route_of_the_app_is_in_the_document_and_no_other(tmp_path: Path) -> None:
    documented = {
        (path, method)
        for path, item in openapi.document()["paths"].items()
        for method in item
        if method in _METHODS
    }
    served = _app_routes(tmp_path)
    assert served - documented == set(), "routes the document does not describe"
    assert documented - served == set(), "operations the app does not serve"


def test_every_operation_documents_the_generic_errors() -> None:
    for path, item in openapi.document()["paths"].items():
        for method, op in item.items():
            if method in _METHODS:
                assert set(openapi.GENERIC_ERRORS) <= set(op["responses"]), (method, path)
                assert op["operationId"] and op["tags"], (method, path)


def test_the_document_takes_its_facts_from_the_code() -> None:
    doc = openapi.document()
    schemas = doc["components"]["schemas"]
    assert set(schemas["Datatype"]["enum"]) == WIRE_TYPES
    stats = schemas["ModelStatistics"]["properties"]["inference_stats"]
    assert stats["required"] == list(statistics.DURATIONS)
    wait = doc["components"]["parameters"]["wait"]["schema"]
    assert wait["maximum"] == MAX_JOB_WAIT_S
    assert doc["info"]["version"] == __import__("conch").__version__


@pytest.mark.parametrize("op_id", ["modelInfer", "modelInferVersion", "modelJobSubmit"])
def test_infer_bodies_take_json_or_binary_tensors(op_id: str) -> None:
    ops = {
        op["operationId"]: op
        for item in openapi.document()["paths"].values()
        for method, op in item.items()
        if method in _METHODS
    }
    body = ops[op_id]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/octet-stream"}
    headers = {p["$ref"].rsplit("/", 1)[1] for p in ops[op_id]["parameters"]}
    assert "header_length" in headers
