"""gunicorn's gevent worker, tuned for many small request/response pairs.

- A warm shutdown does not wait on idle clients. perf_analyzer and tritonclient keep
  their connections open between requests; the stock worker counts an idle keep-alive
  connection as work in progress and holds the shutdown for the whole graceful timeout.
  This one closes idle connections at once and lets the ones mid-request finish.
- A response goes out in one write: status line and headers with the body, instead of
  a separate send for the headers (measured: that send alone was a tenth of the
  gateway's CPU per infer call).
- Infer calls skip WSGI altogether: gunicorn parses the request, the data plane answers
  it and the worker writes the bytes, with no environ, response object or middleware
  between (the rest of the API, and the metrics port, go through the WSGI app).
"""

from __future__ import annotations

import contextlib
import socket
import time
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote_to_bytes

import gevent
from gunicorn import util
from gunicorn.http import wsgi
from gunicorn.workers.ggevent import GeventWorker

from conch.frontend.dataplane import DataPlane
from conch.frontend.http import routes
from conch.frontend.http.fast_path import INFER_PATH, serve_infer, status_line


class _OneWriteResponse(wsgi.Response):
    """Holds the header block back and sends it with the first body bytes."""

    _held = b""

    def send_headers(self) -> None:
        if self.headers_sent:
            return
        if self.chunked:
            super().send_headers()
            return
        lines = self.default_headers()
        lines.extend(f"{k}: {v}\r\n" for k, v in self.headers)
        self._held = ("".join(lines) + "\r\n").encode("latin-1")
        self.headers_sent = True

    def _emit_body(self, data: bytes) -> None:
        if self._held:
            data, self._held = self._held + data, b""
        super()._emit_body(data)

    def close(self) -> None:
        if self._held:  # no body was written (empty or HEAD)
            util.write(self.sock, self._held)
            self._held = b""
        super().close()


class _Date:
    """The Date header, formatted once a second rather than once a response."""

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def __call__(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, formatdate(now, usegmt=True)
        return self._value


class GatewayWorker(GeventWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle: dict[socket.socket, bool] = {}  # connection -> between requests
        self._plane: DataPlane | None = None
        self._metrics_port = -1
        self._date = _Date()

    def init_process(self) -> None:
        # gunicorn builds responses from this module global; the hook it calls for
        # body bytes (_emit_body) exists from gunicorn 23 on. Only this process is touched.
        if hasattr(wsgi.Response, "_emit_body"):
            wsgi.Response = _OneWriteResponse  # type: ignore[misc]
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        extensions = getattr(self.wsgi, "extensions", {})
        self._plane = extensions.get(routes.PLANE)
        if self._plane is not None and self._plane.settings.allow_metrics:
            self._metrics_port = self._plane.settings.metrics_port

    def handle(self, listener: Any, client: socket.socket, addr: Any) -> None:
        self._idle[client] = True
        try:
            super().handle(listener, client, addr)
        finally:
            self._idle.pop(client, None)

    def handle_request(self, listener_name: Any, req: Any, sock: socket.socket, addr: Any) -> Any:
        self._idle[sock] = False
        try:
            if self._plane is not None and req.method == "POST":
                path = req.path
                if "%" in path:  # as WSGI's PATH_INFO: percent-decoded, latin-1
                    path = unquote_to_bytes(path).decode("latin-1")
                match = INFER_PATH.fullmatch(path)
                if match is not None and _port(listener_name) != self._metrics_port:
                    return self._infer(self._plane, match, req, sock)
            return super().handle_request(listener_name, req, sock, addr)
        finally:
            self._idle[sock] = True

    def _infer(self, plane: DataPlane, match: Any, req: Any, sock: socket.socket) -> bool:
        headers: dict[str, str] = {}
        for name, value in req.headers:  # gunicorn upper-cases the names
            headers.setdefault(name, value)
        expect = getattr(req, "_expected_100_continue", None)
        if expect is None:  # gunicorn < 27 leaves the interim response to the WSGI layer
            expect = headers.get("EXPECT", "").lower() == "100-continue"
        if expect:
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        length = headers.get("CONTENT-LENGTH")
        status, out, payload = serve_infer(
            plane,
            match.group(1),
            match.group(2) or "",
            length=int(length) if length and length.isdigit() else 0,
            read=req.body.read,
            header=lambda name: headers.get(name.upper()),
        )
        self.nr += 1
        if self.nr >= self.max_requests:
            self.alive = False
        close = not self.alive or not self.cfg.keepalive or req.should_close()
        head = [
            f"HTTP/{req.version[0]}.{req.version[1]} {status_line(status)}\r\n",
            f"Date: {self._date()}\r\n",
            f"Connection: {'close' if close else 'keep-alive'}\r\n",
        ]
        head.extend(f"{k}: {v}\r\n" for k, v in out)
        head.append("\r\n")
        sock.sendall("".join(head).encode("latin-1") + payload)
        if close:
            raise StopIteration()
        return True

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        gevent.spawn(self._close_idle)

    def _close_idle(self) -> None:
        for sock, idle in list(self._idle.items()):
            if idle:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def _port(listener_name: Any) -> int:
    return listener_name[1] if isinstance(listener_name, tuple) and len(listener_name) > 1 else -1
