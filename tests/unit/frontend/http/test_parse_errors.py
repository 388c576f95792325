"""Requests gunicorn refuses to read: the status each gets, and Triton's JSON body."""

from __future__ import annotations

import json
from http import HTTPStatus

import pytest
from gunicorn.config import Config
from gunicorn.http import RequestParser, errors
from gunicorn.http.message import Request

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


def _parsed(raw: bytes, parser: str) -> Request:
    """The first request gunicorn's parser (``parser``: its ``http_parser`` setting) reads
    from ``raw``, as a gateway worker's parser makes it."""
    cfg = Config()
    cfg.set("http_parser", parser)
    reader = type("GatewayParser", (RequestParser,), {"mesg_class": parse_errors.GatewayRequest})
    return next(reader(cfg, iter([raw]), ("127.0.0.1", 1)))


CHUNKED_WITH_A_LENGTH = (
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 13\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
)


@pytest.mark.parametrize("parser", ["python", "auto"])  # auto: gunicorn_h1c's, when there
def test_a_chunked_body_with_a_length_is_read_by_its_chunks_and_closes(parser: str) -> None:
    """What ``requests`` sends for bytes and a hand-set ``Transfer-Encoding: chunked``
    (Triton's L0_http test_content_encoding_chunked_manually): Triton reads it, as RFC 9112
    lets a server do if it closes the connection after it."""
    req = _parsed(CHUNKED_WITH_A_LENGTH, parser)
    assert req.body.read() == b"abcde"
    assert [name for name, _ in req.headers] == ["HOST", "TRANSFER-ENCODING"]
    assert req.should_close()
    # The stock parser refuses it.
    with pytest.raises(errors.InvalidHeader):
        next(RequestParser(Config(), iter([CHUNKED_WITH_A_LENGTH]), ("127.0.0.1", 1)))


@pytest.mark.parametrize("parser", ["python", "auto"])
@pytest.mark.parametrize(
    "raw",
    [
        # HTTP/1.0 has no chunked framing.
        CHUNKED_WITH_A_LENGTH.replace(b"HTTP/1.1", b"HTTP/1.0"),
        # A coding after chunked: no length can be found.
        CHUNKED_WITH_A_LENGTH.replace(b"chunked", b"chunked, gzip"),
        # A bad header beside them is still one.
        CHUNKED_WITH_A_LENGTH.replace(b"Host: t", b"Bad Header: x"),
    ],
    ids=["http-1.0", "chunked-then-gzip", "bad-header"],
)
def test_what_gunicorn_refuses_beside_it_is_still_refused(raw: bytes, parser: str) -> None:
    with pytest.raises(errors.ParseException):
        _parsed(raw, parser)


def test_a_plain_length_or_chunked_body_is_read_as_before() -> None:
    plain = b"POST /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
    req = _parsed(plain, "auto")
    assert req.body.read() == b"abc" and not req.should_close()
    chunked = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    req = _parsed(chunked, "auto")
    assert req.body.read() == b"abc" and not req.should_close()
