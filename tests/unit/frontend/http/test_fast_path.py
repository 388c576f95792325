"""The one infer entry: which requests are infer calls, and what is refused before a body
is read. The answers themselves, on every server, are in tests/integration/http/."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from conch.core.errors import NotFound
from conch.core.restricted_apis import RestrictedApis
from conch.frontend.http import fast_path


@pytest.mark.parametrize(
    ("method", "path", "call"),
    [
        ("POST", "/v2/models/m/infer", ("m", None)),
        ("POST", "/v2/models/m/versions/3/infer/", ("m", "3")),
        ("GET", "/v2/models/m/infer", None),
        ("POST", "/v2/models/m/ready", None),
        ("POST", "/v2/models/a/b/infer", None),
        ("POST", "/v2/models/m/versions/x/infer", None),
    ],
)
def test_which_requests_are_infer_calls(method: str, path: str, call: tuple | None) -> None:
    found = fast_path.infer_call(method, path)
    assert (None if found is None else found.groups()) == call


def _plane(*, restricted: tuple[str, ...] = (), limit: int = 100, target: Any = None) -> Any:
    settings = SimpleNamespace(
        http_restricted_api=RestrictedApis.parse(restricted), max_input_bytes=limit
    )
    return SimpleNamespace(settings=settings, target=target)


def _unread(_n: int) -> bytes:
    raise AssertionError("the body was read")


def _serve(plane: Any, length: int, read: Any = _unread) -> tuple[int, dict[str, str], Any]:
    call = fast_path.infer_call("POST", "/v2/models/m/infer")
    assert call is not None
    status, head, body = fast_path.serve_infer(plane, call, length=length, read=read, header={}.get)
    return status, dict(head), json.loads(body)


def test_a_restricted_inference_group_refuses_before_the_body_is_read() -> None:
    status, head, body = _serve(_plane(restricted=["inference:infer-key=s3cret"]), 10)
    assert status == 403 and head["Content-Type"] == "application/json"
    assert body == {"error": "This API is restricted, expecting header 'infer-key'"}


def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    status, _, body = _serve(_plane(limit=100), 101)
    assert status == 400 and "--http-max-input-size" in body["error"]


def _raises(exc: Exception) -> Any:
    def target(model: str, version: str, *, endpoint: str = "") -> Any:
        raise exc

    return target


def test_errors_are_tritons_body_and_status_never_a_raise() -> None:
    plane = _plane(target=_raises(NotFound("unknown model 'm'")))
    got = _serve(plane, 2, lambda _n: b"{}")
    assert (got[0], got[2]) == (404, {"error": "unknown model 'm'"})
    got = _serve(_plane(target=_raises(RuntimeError("boom"))), 2, lambda _n: b"{}")
    assert (got[0], got[2]) == (500, {"error": "internal error: boom"})
