"""The gateway's one infer entry: ``serve_infer`` answers every HTTP infer call.

``infer_call`` says whether a request (its method and path) is an infer call, and
``serve_infer`` answers one as (status, headers, body), never raising. It is the only
code that turns an HTTP infer request into data-plane calls: the restricted ``inference``
group, the body's size limit, decoding (binary tensors, compression), the call, encoding
and Triton's error bodies all happen here, whatever server carries the call. The
servers reach it in three ways, and each only reads the request in its own form and
writes the answer:

- the gevent worker's own keep-alive loop (``gevent_worker``), for an infer call in its
  plain form (``infer_head``): no gunicorn parser and no WSGI, because their
  per-request work cost the gateway more CPU than the rest of an infer call;
- the same worker's gunicorn parser, for the rest (TLS, chunked or expected bodies,
  percent-encoded paths), still without WSGI;
- ``InferFastPath``, WSGI middleware ahead of Flask, for the other worker classes
  (gthread, sync), which only speak WSGI.

Flask keeps a route for the infer path (``routes.infer``) that never answers a call:
it is there for what Flask does with a path it knows (a 405 with ``Allow`` for other
methods, OPTIONS, and the restricted-API check ahead of both). The body's bytes are
handed to the codec and the response's bytes to the server as they are: no copy or
re-encoding on the way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from conch.core import timeline
from conch.core.errors import ConchError, Internal
from conch.core.inference import InferRequest
from conch.core.restricted_apis import ApiGroup
from conch.frontend import calls
from conch.frontend.dataplane import DataPlane
from conch.frontend.http import http_codec
from conch.frontend.http.api_groups import refuse
from conch.frontend.http.hangup_watch import INFER_WATCHER
from conch.frontend.http.http_codec import too_large
from conch.frontend.producer import Abandonment

# Triton's infer route: a model name without "/", an optional numeric version.
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer/?")
InferCall = re.Match[str]  # an INFER_PATH match: the model and version a call is for

Header = Callable[[str], str | None]  # a request header by name, None when absent

_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def infer_call(method: str, path: str) -> InferCall | None:
    """The infer call a request is, None for any other request. ``path`` is in WSGI's
    form (percent-decoded, the URL's bytes as latin-1 text)."""
    return INFER_PATH.fullmatch(path) if method == "POST" else None


def path_model(match: InferCall) -> str:
    """The model an ``INFER_PATH`` match on a WSGI path names. WSGI's PATH_INFO holds the
    URL's bytes as latin-1 text; a model name is UTF-8 (a client percent-encodes
    ``modèle`` or ``a,b``), so the bytes are read again as what they are."""
    name = match.group(1)
    return name if name.isascii() else name.encode("latin-1").decode("utf-8", "replace")


Answer = tuple[int, list[tuple[str, str]], bytes]  # status, headers, body


def error_answer(exc: ConchError) -> Answer:
    """Triton's ``{"error": ...}`` answer for ``exc``, with when to retry if it says."""
    payload = orjson.dumps({"error": exc.message})
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
    if exc.retry_after_s is not None:
        headers.append(("Retry-After", str(exc.retry_after_s)))
    return exc.status, headers, payload


def decode_call(
    plane: DataPlane,
    model: str,
    version: str,
    body: bytes | memoryview,
    header: Header,
    *,
    endpoint: str = "HTTP end point",
    regions: bool = False,
) -> tuple[calls.Target, InferRequest]:
    """The model and version an infer (or job) body is for, then the body decoded: the
    errors about the model come first, whatever the body holds (a decoupled model's
    too, refused as Triton refuses it where ``endpoint`` answers once; "" takes it).
    ``regions``: inputs and outputs may be shared-memory regions (an infer call's; a
    job's may not, as it outlives the call)."""
    to = plane.target(model, version, endpoint=endpoint)
    limit = plane.settings.max_input_bytes
    header_length = header(http_codec.HEADER_LENGTH)
    if len(body) > limit:
        raise too_large(len(body), limit, header_length)
    request = http_codec.decode_request(
        body,
        header_length,
        header("Content-Encoding"),
        max_body_bytes=limit,
        config=to.entry.config,  # a raw binary request's one input is the config's
        model_name=to.entry.name,
        shm=plane.shared_memory if regions else None,
    )
    return to, request


def serve_infer(
    plane: DataPlane,
    call: InferCall,
    *,
    length: int,
    read: Callable[[int], bytes | memoryview],
    header: Header,
    client: Any = None,
) -> Answer:
    """One infer call, whatever server carries it: (status, headers, body), never raises.

    ``call`` is what ``infer_call`` found, ``length`` the Content-Length (0 when
    absent), ``read`` reads the body and ``header`` looks a request header up by name.
    A restricted ``inference`` group is checked first, before the body is read
    (Triton's order). ``client``: the connection's socket, watched while the call waits
    (``hangup_watch.InferWatcher``): a client that closes it withdraws the request if
    it is still queued alone (one that shares a bundle runs, its answer dropped).
    """
    try:
        if plane.settings.http_restricted_api.rules:
            refuse(plane.settings.http_restricted_api, ApiGroup.INFERENCE, header)
        limit = plane.settings.max_input_bytes
        if length > limit:
            raise too_large(length, limit, header(http_codec.HEADER_LENGTH))
        body = read(length) if length else read(limit + 1)
        to, request = decode_call(
            plane, path_model(call), call.group(2) or "", body, header, regions=True
        )
        timeline.stamp("gateway.parsed")
        abandonment = Abandonment(bundles=True)
        watch = INFER_WATCHER.watch(client, abandonment)
        try:
            outcome = plane.infer(
                to, request, abandonment=abandonment, traceparent=header("traceparent") or ""
            )
        finally:
            INFER_WATCHER.done(watch)
        payload, headers = http_codec.encode_outcome(outcome, header("Accept-Encoding"))
        timeline.stamp("gateway.encoded")
    except ConchError as exc:
        return error_answer(exc)
    except Exception as exc:  # never a bare 500 page: Triton's error body, always
        return error_answer(Internal(f"internal error: {exc}"))
    return 200, [*headers.items(), ("Content-Length", str(len(payload)))], payload


def status_line(status: int) -> str:
    return f"{status} {_REASONS.get(status, 'Error')}"


class InferFastPath:
    """WSGI middleware: infer calls go straight to ``serve_infer``, the rest to Flask.
    It reads the call from WSGI's environ and writes the answer through
    ``start_response``; nothing else."""

    def __init__(self, app: Callable, plane: DataPlane) -> None:
        self.app = app
        self.plane = plane

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        call = infer_call(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""))
        if call is None:
            return self.app(environ, start_response)
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        status, headers, payload = serve_infer(
            self.plane,
            call,
            length=length,
            read=environ["wsgi.input"].read,
            header=lambda name: environ.get("HTTP_" + name.upper().replace("-", "_")),
            client=environ.get("gunicorn.socket"),
        )
        start_response(status_line(status), headers)
        return [payload]
