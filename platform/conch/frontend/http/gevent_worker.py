"""gunicorn's gevent worker, tuned for many small request/response pairs.

- A warm shutdown does not wait on idle clients. perf_analyzer and tritonclient keep
  their connections open between requests; the stock worker counts an idle keep-alive
  connection as work in progress and holds the shutdown for the whole graceful timeout.
  This one closes idle connections at once and lets the ones mid-request finish.
- A response goes out in one write: status line and headers with the body, instead of
  a separate send for the headers (that send alone was a large share of the gateway's
  CPU per infer call: bench/README.md, "Measurements the code cites").
- Infer calls skip WSGI altogether: ``fast_path.serve_infer`` answers them and
  ``_infer`` writes the bytes, with no environ, response object or middleware between
  (the rest of the API, and the metrics port, go through the WSGI app).
- An infer call in its plain form (``infer_head``) skips gunicorn's parser too: the
  connection loop here reads it, and hands every other request on the connection,
  bytes and all, to gunicorn's parser, then takes the connection back. An infer call
  gunicorn parsed goes to the same ``_infer``; the rest to WSGI. A head longer than
  gunicorn's shortest line limit goes to gunicorn too, so its limits hold for every
  request; what it refuses is answered in Triton's JSON (``parse_errors``).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import socket
import ssl
import time
from collections.abc import Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote_to_bytes

import gevent
from gunicorn import http, util
from gunicorn.http import wsgi
from gunicorn.workers.ggevent import GeventWorker

from conch.core import timeline
from conch.frontend.dataplane import DataPlane
from conch.frontend.http import infer_head, routes
from conch.frontend.http.fast_path import Header, InferCall, infer_call, serve_infer, status_line
from conch.frontend.http.parse_errors import TritonParseErrors

_READ = 64 * 1024


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

    def _flush(self) -> None:
        """Send the header block now, on its own."""
        if not self.headers_sent:
            self.send_headers()
        if self._held:
            util.write(self.sock, self._held)
            self._held = b""

    def sendfile(self, respiter: Any) -> bool:
        # A file body (a docs page asset) goes from its descriptor straight to the
        # socket, past _emit_body: the header block must be on the wire before it.
        self._flush()
        return super().sendfile(respiter)

    def close(self) -> None:
        # An app that yields no body at all (an OPTIONS answer, any answer to HEAD) never
        # calls write(): the header block is made here, and must go out here too.
        self._flush()
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


class GatewayWorker(TritonParseErrors, GeventWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle: dict[socket.socket, bool] = {}  # connection -> between requests
        self._plane: DataPlane | None = None
        self._metrics_port = -1
        self._date = _Date()
        # Read once: each read of gunicorn's config is a lookup and a validation.
        self._keepalive = self.cfg.keepalive
        # The longest head read here: one gunicorn's limits on the request line and on
        # each header line could not refuse (those limits are 0 when off).
        limits = (self.cfg.limit_request_line, self.cfg.limit_request_field_size)
        self._max_head = min([infer_head.MAX_HEAD_BYTES, *(n for n in limits if n > 0)])

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
        # What the process holds once loaded (modules, the app, the repository's configs)
        # lives as long as it does: out of the collector's sight, a full collection walks
        # only what requests made since.
        gc.collect()
        gc.freeze()

    def handle(self, listener: Any, client: socket.socket, addr: Any) -> None:
        self._idle[client] = True
        try:
            if self._plain_http(listener, client, addr):
                self._connection(listener, client, addr)
            else:
                super().handle(listener, client, addr)
        finally:
            self._idle.pop(client, None)

    def _plain_http(self, listener: Any, client: socket.socket, addr: Any) -> bool:
        """Whether this connection is one the loop below may read: plain HTTP/1.x with
        keep-alive on the API port (not TLS, PROXY protocol or HTTP/2, not metrics)."""
        cfg = self.cfg
        return (
            self._plane is not None
            and bool(cfg.keepalive)
            and not isinstance(client, ssl.SSLSocket)
            and getattr(cfg, "proxy_protocol", "off") in ("off", False, None)
            and getattr(cfg, "http2_cleartext", "off") in ("off", False, None)
            and _port(listener.getsockname()) != self._metrics_port
        )

    def _connection(self, listener: Any, client: socket.socket, addr: Any) -> None:
        """One keep-alive connection: plain infer calls here, the rest through gunicorn."""
        name = listener.getsockname()
        try:
            buf = b""
            while self.alive:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    # Between requests the keep-alive timeout applies, as in gunicorn.
                    client.settimeout(self._keepalive)
                    while end < 0 and len(buf) <= infer_head.MAX_HEAD_BYTES:
                        try:
                            data = client.recv(_READ)
                        except TimeoutError:
                            return
                        if not data:
                            return
                        buf += data
                        end = buf.find(b"\r\n\r\n", max(0, len(buf) - len(data) - 3))
                    client.settimeout(None)
                    timeline.stamp("gateway.read")
                head = infer_head.parse(buf, end, self._max_head) if end >= 0 else None
                if head is None:
                    rest = self._through_gunicorn(name, client, addr, buf)
                    if rest is None:
                        return
                    buf = rest
                    continue
                self._idle[client] = False
                buf = self._plain_call(head, client, buf, end + 4)
                self._idle[client] = True
                if buf is None:
                    return
        except (http.errors.NoMoreData, StopIteration):
            pass
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.exception("Socket error processing request.")
        except Exception as exc:
            self.handle_error(None, client, addr, exc)
        finally:
            util.close(client)

    def _plain_call(
        self, head: infer_head.InferHead, client: socket.socket, buf: bytes, start: int
    ) -> bytes | None:
        """Read one plain infer call's body and answer it; the bytes after it, or None
        to close. The body is read once, into its own buffer when it did not come with
        the head, and handed on as a view: its tensors are never copied here."""
        assert self._plane is not None
        length, limit = head.length, self._plane.settings.max_input_bytes
        close = head.close
        body: bytes | memoryview
        if length > limit:  # answered without reading the body: the connection must go
            body, rest, close = b"", b"", True
        else:
            need = start + length
            if len(buf) >= need:
                body, rest = memoryview(buf)[start:need], buf[need:]
            else:
                whole = bytearray(length)
                view = memoryview(whole)
                have = len(buf) - start
                view[:have] = memoryview(buf)[start:]
                while have < length:
                    got = client.recv_into(view[have:])
                    if not got:
                        return None
                    have += got
                body, rest = view, b""
        if self._infer(client, head.call, head.http, close, length, lambda _n: body, head.header):
            return None
        return rest

    def _through_gunicorn(
        self, name: Any, client: socket.socket, addr: Any, buf: bytes
    ) -> bytes | None:
        """One request read by gunicorn's parser (with ``buf``, the bytes read so far)
        and answered as gunicorn answers it; the bytes read past it, or None to close."""
        parser = http.get_parser(self.cfg, client, addr)
        if buf:
            parser.unreader.unread(buf)
        req = None
        with self.timeout_ctx():  # gevent.Timeout(keepalive, False): no request, no error
            req = next(parser)
        if not req:
            return None
        self._idle[client] = False
        try:
            self.handle_request(name, req, client, addr)  # StopIteration: close
        finally:
            self._idle[client] = True
        if req.should_close() or not parser.finish_body():
            return None
        return parser.unreader.take_buffered()

    def handle_request(self, listener_name: Any, req: Any, sock: socket.socket, addr: Any) -> Any:
        self._idle[sock] = False
        try:
            if self._plane is not None:
                path = req.path
                if "%" in path:  # as WSGI's PATH_INFO: percent-decoded, latin-1
                    path = unquote_to_bytes(path).decode("latin-1")
                call = infer_call(req.method, path)
                if call is not None and _port(listener_name) != self._metrics_port:
                    return self._parsed_call(call, req, sock)
            return super().handle_request(listener_name, req, sock, addr)
        finally:
            self._idle[sock] = True

    def _parsed_call(self, call: InferCall, req: Any, sock: socket.socket) -> bool:
        """Answer one infer call gunicorn's parser read (``req``); StopIteration to close."""
        headers: dict[str, str] = {}
        for name, value in req.headers:  # gunicorn upper-cases the names
            headers.setdefault(name, value)
        expect = getattr(req, "_expected_100_continue", None)
        if expect is None:  # gunicorn < 27 leaves the interim response to the WSGI layer
            expect = headers.get("EXPECT", "").lower() == "100-continue"
        if expect:
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        text = headers.get("CONTENT-LENGTH")
        length = int(text) if text and text.isdigit() else 0
        if self._infer(
            sock,
            call,
            req.version,
            req.should_close(),
            length,
            req.body.read,
            lambda name: headers.get(name.upper()),
        ):
            raise StopIteration()
        return True

    def _infer(
        self,
        sock: socket.socket,
        call: InferCall,
        version: tuple[int, int],
        close: bool,
        length: int,
        read: Callable[[int], bytes | memoryview],
        header: Header,
    ) -> bool:
        """Answer one infer call, however it was read, and write the response in one
        send; True when the connection then closes."""
        assert self._plane is not None
        status, out, payload = serve_infer(
            self._plane, call, length=length, read=read, header=header, client=sock
        )
        self.nr += 1
        if self.nr >= self.max_requests:
            self.alive = False
        close = close or not self.alive or not self._keepalive
        fields = "".join([f"{k}: {v}\r\n" for k, v in out])
        head = (
            f"HTTP/{version[0]}.{version[1]} {status_line(status)}\r\n"
            f"Date: {self._date()}\r\nConnection: {'close' if close else 'keep-alive'}\r\n"
            f"{fields}\r\n"
        )
        timeline.stamp("gateway.writing")
        sock.sendall(head.encode("latin-1") + payload)
        return close

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
