"""Requests gunicorn refuses to read: the status each gets, and Triton's JSON body."""

from __future__ import annotations

import json
from http import HTTPStatus

import pytest
from gunicorn.http import errors

from conch.frontend.http import parse_errors


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (errors.LimitRequestLine(5000, 4094), 414),
        (errors.LimitRequestHeaders("limit request headers fields size"), 431),
        (errors.InvalidRequestLine("GET"), 400),
        (errors.InvalidHeaderName("Bad Name"), 400),
        (errors.InvalidHTTPVersion("HTTP/9"), 400),
        (errors.UnsupportedTransferCoding("gzip"), 501),
        (errors.InvalidResponseHeader("X"), 500),  # the app's fault, not the client's
    ],
)
def test_each_refusal_has_its_status(exc: Exception, status: int) -> None:
    assert parse_errors.refusal(exc) == status


def test_other_errors_are_no_refusal() -> None:
    assert parse_errors.refusal(RuntimeError("bug")) is None


def test_the_answer_is_tritons_json_and_closes() -> None:
    raw = parse_errors.answer(HTTPStatus.REQUEST_URI_TOO_LONG, "URI Too Long: x")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == f"HTTP/1.1 414 {HTTPStatus(414).phrase}"  # "URI Too Long" from 3.13
    assert "Connection: close" in lines and "Content-Type: application/json" in lines
    assert f"Content-Length: {len(body)}" in lines
    assert json.loads(body) == {"error": "URI Too Long: x"}


def test_gunicorn_worker_names_map_to_the_gateways_classes() -> None:
    assert parse_errors.worker_class("gthread").endswith(".GatewayThreadWorker")
    assert parse_errors.worker_class("sync").endswith(".GatewaySyncWorker")
    other = "conch.frontend.http.gevent_worker.GatewayWorker"
    assert parse_errors.worker_class(other) == other
