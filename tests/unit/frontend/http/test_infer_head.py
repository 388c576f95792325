"""The plain form of an infer call's head, and everything that is left to gunicorn."""

from __future__ import annotations

import pytest

from conch.frontend.http import fast_path, infer_head


def _parse(head: bytes) -> infer_head.InferHead | None:
    buf = head + b"\r\n\r\nBODY"
    return infer_head.parse(buf, buf.find(b"\r\n\r\n"))


PLAIN = (
    b"POST /v2/models/mlp/versions/3/infer HTTP/1.1\r\nHost: x\r\n"
    b"Inference-Header-Content-Length: 174\r\ncontent-length: 430"
)


def test_the_plain_form_is_read() -> None:
    head = _parse(PLAIN)
    assert head is not None
    assert (head.model, head.version, head.http, head.length, head.close) == (
        "mlp",
        "3",
        (1, 1),
        430,
        False,
    )
    assert head.header("Inference-Header-Content-Length") == "174"
    assert head.header("Accept-Encoding") is None


@pytest.mark.parametrize(
    ("request_line", "connection", "close"),
    [
        (b"POST /v2/models/m/infer HTTP/1.1", b"", False),
        (b"POST /v2/models/m/infer HTTP/1.1", b"Connection: Close\r\n", True),
        (b"POST /v2/models/m/infer HTTP/1.0", b"", True),
        (b"POST /v2/models/m/infer HTTP/1.0", b"Connection: keep-alive\r\n", False),
    ],
)
def test_connection_semantics_follow_the_http_version(
    request_line: bytes, connection: bytes, close: bool
) -> None:
    head = _parse(request_line + b"\r\n" + connection + b"Content-Length: 2")
    assert head is not None and head.close is close


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2",
        b"POST /v2/models/m/ready HTTP/1.1\r\nContent-Length: 2",
        b"POST /v2/models/m/infer HTTP/2.0\r\nContent-Length: 2",
        b"POST /v2/models/m/infer  HTTP/1.1\r\nContent-Length: 2",
        b"POST /v2/models/m%2F/infer HTTP/1.1\r\nContent-Length: 2",
        b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nContent-Length: 2",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x",  # no length
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: -2",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: \xb2",  # "²": a digit to str
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nUpgrade: h2c",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nX-A: 1\r\n folded",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nBad Name: 1",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nNoColon",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nX: a\nb",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nX: a\x00b",
        b"POST /v2/models/m/infer HTTP/1.1",  # no header line at all
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nX: "
        + b"a" * infer_head.MAX_HEAD_BYTES,
    ],
)
def test_anything_else_is_left_to_gunicorn(head: bytes) -> None:
    assert _parse(head) is None


def test_a_head_past_the_limit_given_is_left_to_gunicorn() -> None:
    """The gateway passes gunicorn's shortest line limit: a head no longer than it holds
    no line gunicorn would refuse; a longer one is gunicorn's to judge."""
    buf = PLAIN + b"\r\n\r\n"
    end = buf.find(b"\r\n\r\n")
    assert infer_head.parse(buf, end, max_head=end) is not None
    assert infer_head.parse(buf, end, max_head=end - 1) is None


def test_a_percent_encoded_model_name_is_left_to_gunicorn_and_read_as_utf8() -> None:
    # "modèle x" as a client sends it: not the plain form ...
    assert _parse(b"POST /v2/models/mod%C3%A8le%20x/infer HTTP/1.1\r\ncontent-length: 2") is None
    # ... and from a WSGI path (the URL's bytes as latin-1 text) the name is UTF-8 again.
    wsgi_path = "/v2/models/mod\xc3\xa8le x,1/infer"
    assert fast_path.path_model(fast_path.INFER_PATH.fullmatch(wsgi_path)) == "modèle x,1"
