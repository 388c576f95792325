"""Requests gunicorn cannot read, answered in Triton's ``{"error": "..."}`` JSON.

gunicorn's parser refuses a request line over ``limit_request_line``, too many headers
or one over ``limit_request_field_size``, malformed lines and the like before the app
sees anything, and its worker answers with an HTML page. Every gateway worker class
mixes in ``TritonParseErrors`` instead, so a client reads the same JSON error body there
as from any route.

Statuses: Triton's HTTP server (libevhtp) drops the connection without a word when its
parser fails, so there is no Triton status to copy; the closest honest answer is the
HTTP one: 414 for a request line too long, 431 for headers too large, 400 for the other
malformed requests (and 417, 501, 403 where gunicorn refuses a request for those
reasons). The connection is closed after the answer, as the bytes that follow cannot be
trusted to start a request.

One request gunicorn refuses is read here as Triton reads it: a chunked body that also
carries a ``Content-Length`` (what ``requests`` sends for bytes and a hand-set
``Transfer-Encoding: chunked``). RFC 9112 section 6.1 lets a server read such a request by
its chunks alone, if it then closes the connection, so the bytes after it never start a
request of their own. ``GatewayRequest`` does just that, for every worker class.
"""

from __future__ import annotations

import json
import ssl
from http import HTTPStatus
from typing import Any

from gunicorn import util
from gunicorn.http import RequestParser, errors
from gunicorn.http.message import Request
from gunicorn.workers.gthread import ThreadWorker
from gunicorn.workers.sync import SyncWorker

# Refusals that are not a plain 400, first match wins.
_STATUS: tuple[tuple[type[Exception], HTTPStatus], ...] = (
    (errors.LimitRequestLine, HTTPStatus.REQUEST_URI_TOO_LONG),
    (errors.LimitRequestHeaders, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
    (errors.ExpectationFailed, HTTPStatus.EXPECTATION_FAILED),
    (errors.UnsupportedTransferCoding, HTTPStatus.NOT_IMPLEMENTED),
    (errors.ForbiddenProxyRequest, HTTPStatus.FORBIDDEN),
    # The server's fault, not the client's: a bad setting, a header the app wrote.
    (errors.ConfigurationProblem, HTTPStatus.INTERNAL_SERVER_ERROR),
    (errors.InvalidResponseHeader, HTTPStatus.INTERNAL_SERVER_ERROR),
    (errors.InvalidResponseHeaderName, HTTPStatus.INTERNAL_SERVER_ERROR),
)


def refusal(exc: BaseException) -> HTTPStatus | None:
    """The status for a request gunicorn refused to read; None when ``exc`` is not one."""
    if not isinstance(exc, (errors.ParseException, ssl.SSLError)):
        return None
    return next((status for cls, status in _STATUS if isinstance(exc, cls)), HTTPStatus.BAD_REQUEST)


def answer(status: HTTPStatus, message: str) -> bytes:
    """A whole response: Triton's error body, and the connection closes after it."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def _ends_chunked(headers: list[tuple[str, str]]) -> bool:
    """Whether the last transfer coding ``headers`` name is chunked (gunicorn's parser
    judges every other list of codings itself)."""
    codings = [
        coding.strip(" \t").lower()
        for name, value in headers
        if name == "TRANSFER-ENCODING"
        for coding in value.split(",")
    ]
    return bool(codings) and codings[-1] == "chunked"


class GatewayRequest(Request):
    """gunicorn's request, reading a chunked body by its chunks whatever ``Content-Length``
    says, and closing the connection after it (the module's docstring says why)."""

    def _parse_fast(self, unreader: Any, buf: bytearray) -> bytes:
        # gunicorn_h1c refuses a Content-Length beside chunked while it reads the head,
        # before set_body_reader can judge it. gunicorn's own Python parser reads the same
        # bytes again and refuses every other bad header as the C one did.
        try:
            return super()._parse_fast(unreader, buf)
        except errors.InvalidHeader:
            return self._parse_python(unreader, buf)

    def set_body_reader(self) -> None:
        chunked = self.version >= (1, 1) and _ends_chunked(self.headers)
        if chunked and any(name == "CONTENT-LENGTH" for name, _ in self.headers):
            self.headers = [(n, v) for n, v in self.headers if n != "CONTENT-LENGTH"]
            self.force_close()
        super().set_body_reader()


class TritonParseErrors:
    """Mixed into a gunicorn worker class: its ``handle_error`` answers in JSON, and its
    parser makes ``GatewayRequest``s."""

    log: Any  # the worker's gunicorn logger

    def init_process(self) -> None:
        # gunicorn's parsers make requests of this class attribute; only this process's
        # parsers are touched.
        RequestParser.mesg_class = GatewayRequest
        super().init_process()  # type: ignore[misc]

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        status = refusal(exc)
        if status is None or status == HTTPStatus.INTERNAL_SERVER_ERROR:
            where = f" {req.method} {req.uri}" if hasattr(req, "uri") else ""
            self.log.exception("Error handling request%s", where)
            status, message = HTTPStatus.INTERNAL_SERVER_ERROR, "internal error"
        else:
            ip = addr[0] if isinstance(addr, tuple) and addr else ""
            self.log.warning("Invalid request from ip=%s: %s", ip, exc)
            message = f"{status.phrase}: {exc}"
        try:
            util.write_nonblock(client, answer(status, message))
        except Exception:
            self.log.debug("Failed to send error message.")


class GatewayThreadWorker(TritonParseErrors, ThreadWorker):
    """gunicorn's gthread worker, with errors in Triton's JSON."""


class GatewaySyncWorker(TritonParseErrors, SyncWorker):
    """gunicorn's sync worker, with errors in Triton's JSON."""


# gunicorn's names for its worker classes, and the gateway's class for each.
WORKER_CLASSES = {
    "gthread": f"{__name__}.GatewayThreadWorker",
    "sync": f"{__name__}.GatewaySyncWorker",
}


def worker_class(name: str) -> str:
    """The class the gateway runs for ``--worker-class``-style ``name``."""
    return WORKER_CLASSES.get(name, name)


__all__ = [
    "GatewayRequest",
    "GatewaySyncWorker",
    "GatewayThreadWorker",
    "TritonParseErrors",
    "answer",
    "refusal",
    "worker_class",
]
