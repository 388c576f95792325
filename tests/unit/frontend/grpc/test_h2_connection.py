"""One h2 transport connection, in process, on real threads over a socket pair: calls of
each kind, status and deadlines, cancellation, keepalive, ping policing and the
connection's maximum age, against h2's own client state machine."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.protobuf.wrappers_pb2 import StringValue
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    PingReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from h2.settings import SettingCodes

from conch.frontend.grpc import grpc_framing as framing
from conch.frontend.grpc import h2_connection
from conch.frontend.grpc.h2_connection import Connection, Limits
from conch.frontend.grpc.h2_methods import Method
from conch.frontend.grpc.h2_pings import PingLimits

WAIT_S = 5.0
QUIET = PingLimits(3600.0, 20.0, False, 2, 300.0, 2)  # nothing fires within a test


def _method(handler: Callable[..., Any], *, streams: bool = False) -> Method:
    return Method("Test", handler, StringValue.FromString, streams, streams)


class Client:
    """h2's client state machine on one end of the pair; what came back, per stream."""

    def __init__(
        self, sock: socket.socket, *, answer_pings: bool = True, window: int | None = None
    ) -> None:
        self.sock = sock
        self.h2 = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        if window is not None:
            self.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.answer_pings = answer_pings
        self.headers: dict[int, dict[str, str]] = {}
        self.trailers: dict[int, dict[str, str]] = {}
        self.data: dict[int, bytes] = {}
        self.ended: set[int] = set()
        self.resets: dict[int, int] = {}
        self.pings = 0
        self.goaway: int | None = None
        self.closed = False
        self.flush()

    def flush(self) -> None:
        out = self.h2.data_to_send()
        if out:
            # The server may have closed: what it sent last is still to read.
            with contextlib.suppress(OSError):
                self.sock.sendall(out)

    def call(self, path: str, *messages: bytes, headers=(), end: bool = True) -> int:
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "test"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *headers,
            ],
        )
        for message in messages:
            self.h2.send_data(stream, message)
        if end:
            self.h2.end_stream(stream)
        self.flush()
        return stream

    def pump(self, done: Callable[[], bool], timeout: float = WAIT_S) -> bool:
        deadline = time.monotonic() + timeout
        while not done() and not self.closed and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, min(0.2, deadline - time.monotonic())))
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            if self.goaway is not None:
                continue
            for ev in self.h2.receive_data(chunk):
                if isinstance(ev, ResponseReceived):
                    self.headers[ev.stream_id] = dict(ev.headers)
                elif isinstance(ev, TrailersReceived):
                    self.trailers[ev.stream_id] = dict(ev.headers)
                elif isinstance(ev, DataReceived):
                    self.data[ev.stream_id] = self.data.get(ev.stream_id, b"") + ev.data
                    self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, StreamEnded):
                    self.ended.add(ev.stream_id)
                elif isinstance(ev, StreamReset):
                    self.resets[ev.stream_id] = ev.error_code
                elif isinstance(ev, PingReceived):
                    self.pings += 1
                elif isinstance(ev, ConnectionTerminated):
                    self.goaway = ev.error_code
            if self.answer_pings:
                self.flush()
        return done()

    def status(self, stream: int) -> tuple[int, str]:
        found = self.trailers.get(stream) or self.headers.get(stream) or {}
        message = framing.percent_decode(found.get("grpc-message", "").encode())
        return int(found["grpc-status"]), message

    def messages(self, stream: int) -> list[bytes]:
        reader = framing.MessageReader(1 << 20, self.headers[stream].get("grpc-encoding"))
        return reader.feed(self.data.get(stream, b""))


@pytest.fixture
def connect() -> Iterator[Callable[..., tuple[Connection, Client]]]:
    made: list[tuple[Connection, Client, threading.Thread]] = []

    def make(
        methods: dict[bytes, Method],
        *,
        ping: PingLimits = QUIET,
        window: int | None = None,
        slots: threading.Semaphore | None = None,
        **limits: Any,
    ) -> tuple[Connection, Client]:
        ours, theirs = socket.socketpair()
        ours.settimeout(30)
        limited = Limits(max_message_bytes=1000, ping=ping, **limits)
        conn = Connection(ours, methods, limited, slots=slots)
        thread = threading.Thread(target=conn.serve, daemon=True)
        thread.start()
        client = Client(theirs, window=window)
        made.append((conn, client, thread))
        return conn, client

    yield make
    for _conn, client, thread in made:
        client.sock.close()
        thread.join(WAIT_S)
        assert not thread.is_alive()


def _msg(text: str) -> bytes:
    return framing.frame(StringValue(value=text).SerializeToString())


def _text(data: bytes) -> str:
    return StringValue.FromString(data).value


def test_a_unary_call_is_answered_with_its_message_and_ok(connect) -> None:
    echo = _method(lambda request, context: StringValue(value=request.value.upper()))
    _, client = connect({b"/t/Echo": echo})
    stream = client.call("/t/Echo", _msg("hi"))
    assert client.pump(lambda: stream in client.ended)
    assert client.headers[stream][":status"] == "200"
    assert client.status(stream) == (0, "")
    assert [_text(m) for m in client.messages(stream)] == ["HI"]


def test_an_unknown_method_is_unimplemented_trailers_only(connect) -> None:
    _, client = connect({})
    stream = client.call("/t/Nope", _msg("x"))
    assert client.pump(lambda: stream in client.ended)
    assert client.status(stream)[0] == framing.Status.UNIMPLEMENTED
    assert stream not in client.trailers  # the status came in the only headers


def test_an_abort_ends_the_call_with_its_status_and_message(connect) -> None:
    def refuse(request, context):
        context.abort(framing.Status.NOT_FOUND, "no model 'é' (100%)")

    _, client = connect({b"/t/Refuse": _method(refuse)})
    stream = client.call("/t/Refuse", _msg("x"))
    assert client.pump(lambda: stream in client.ended)
    assert client.status(stream) == (5, "no model 'é' (100%)")


def test_a_message_past_the_limit_is_resource_exhausted(connect) -> None:
    _, client = connect({b"/t/Echo": _method(lambda request, context: request)})
    stream = client.call("/t/Echo", _msg("x" * 2000), end=False)
    assert client.pump(lambda: stream in client.ended)
    assert client.status(stream)[0] == framing.Status.RESOURCE_EXHAUSTED
    assert client.pump(lambda: stream in client.resets)  # told to stop sending
    assert client.resets[stream] == ErrorCodes.NO_ERROR


def test_the_response_is_compressed_as_the_service_asks(connect) -> None:
    def big(request, context):
        context.set_compression("gzip")
        return StringValue(value="z" * 5000)

    _, client = connect({b"/t/Big": _method(big)})
    stream = client.call("/t/Big", _msg(""), headers=[("grpc-accept-encoding", "identity,gzip")])
    assert client.pump(lambda: stream in client.ended)
    assert client.headers[stream]["grpc-encoding"] == "gzip"
    assert len(client.data[stream]) < 200
    assert [_text(m) for m in client.messages(stream)] == ["z" * 5000]


def test_a_deadline_ends_the_call_and_runs_its_callbacks(connect) -> None:
    ended = threading.Event()
    released = threading.Event()

    def wait(request, context):
        context.add_callback(ended.set)
        assert 0 < context.time_remaining() <= 0.2
        released.wait(WAIT_S)
        return StringValue(value="late")

    _, client = connect({b"/t/Wait": _method(wait)})
    stream = client.call("/t/Wait", _msg(""), headers=[("grpc-timeout", "200m")])
    assert client.pump(lambda: stream in client.ended)
    assert client.status(stream)[0] == framing.Status.DEADLINE_EXCEEDED
    assert ended.wait(WAIT_S)
    released.set()


def test_a_reset_cancels_the_call_and_runs_its_callbacks(connect) -> None:
    ended, started = threading.Event(), threading.Event()

    def wait(request, context):
        context.add_callback(ended.set)
        started.set()
        ended.wait(WAIT_S)
        return StringValue(value="nobody reads this")

    _, client = connect({b"/t/Wait": _method(wait)})
    stream = client.call("/t/Wait", _msg(""))
    assert started.wait(WAIT_S)
    client.h2.reset_stream(stream, ErrorCodes.CANCEL)
    client.flush()
    assert ended.wait(WAIT_S)
    again = client.call("/t/Wait", _msg(""))  # the connection serves on
    assert started.wait(WAIT_S)
    client.h2.reset_stream(again, ErrorCodes.CANCEL)
    client.flush()


def test_unary_calls_past_the_slots_wait_and_streams_take_none(connect) -> None:
    """--grpc-infer-thread-count, here 1: a second unary call runs once the first is
    done; one cancelled while it waits never runs; a stream runs beside them."""
    running: list[str] = []
    release = threading.Event()

    def hold(request, context):
        running.append(request.value)
        release.wait(WAIT_S)
        return request

    def each(requests, context):
        yield from requests

    methods = {b"/t/Hold": _method(hold), b"/t/Each": _method(each, streams=True)}
    _, client = connect(methods, slots=threading.BoundedSemaphore(1))
    first = client.call("/t/Hold", _msg("first"))
    assert client.pump(lambda: running == ["first"])
    cancelled = client.call("/t/Hold", _msg("cancelled"))
    last = client.call("/t/Hold", _msg("last"))
    stream = client.call("/t/Each", _msg("beside"))
    assert client.pump(lambda: stream in client.ended)
    assert [_text(m) for m in client.messages(stream)] == ["beside"]
    client.h2.reset_stream(cancelled, ErrorCodes.CANCEL)
    client.flush()
    client.pump(lambda: False, timeout=0.2)
    assert running == ["first"]
    release.set()
    assert client.pump(lambda: {first, last} <= client.ended)
    assert running == ["first", "last"]
    assert client.status(last) == (0, "")


def test_a_stream_its_service_does_not_read_closes_its_window(connect, monkeypatch) -> None:
    """Requests the service has not taken are held to STREAM_INBOX, then one window:
    what the peer sends more is not acknowledged until the service reads again."""
    monkeypatch.setattr(h2_connection, "STREAM_INBOX", 4)
    monkeypatch.setattr(h2_connection, "STREAM_WINDOW", 4096)
    reading = threading.Event()

    def each(requests, context):
        reading.wait(WAIT_S)
        yield from requests

    conn, client = connect({b"/t/Each": _method(each, streams=True)})
    assert client.pump(lambda: client.h2.remote_settings.initial_window_size == 4096)
    stream = client.call("/t/Each", end=False)
    message, sent = _msg("x" * 500), 0

    def send_while_open(most: int) -> None:
        nonlocal sent
        for _ in range(most):
            if client.h2.local_flow_control_window(stream) < len(message):
                client.pump(lambda: False, timeout=0.3)  # a window update, if one comes
                if client.h2.local_flow_control_window(stream) < len(message):
                    return
            client.h2.send_data(stream, message)
            client.flush()
            sent += 1

    send_while_open(100)
    assert sent <= 4 + 4096 // len(message) + 1, sent  # the window closed
    assert conn.calls[stream].inbox.qsize() == sent
    reading.set()  # the service reads: the window opens again
    send_while_open(10)
    client.h2.end_stream(stream)
    client.flush()
    assert client.pump(lambda: stream in client.ended)
    assert client.status(stream) == (0, "")
    assert len(client.messages(stream)) == sent > 4 + 4096 // len(message) + 1


def test_a_bidi_stream_answers_each_request_in_turn(connect) -> None:
    def each(requests, context):
        for request in requests:
            yield StringValue(value=request.value * 2)

    _, client = connect({b"/t/Each": _method(each, streams=True)})
    stream = client.call("/t/Each", end=False)
    for text in ("a", "b", "c"):
        client.h2.send_data(stream, _msg(text))
        client.flush()
    client.h2.end_stream(stream)
    client.flush()
    assert client.pump(lambda: stream in client.ended)
    assert client.status(stream) == (0, "")
    assert [_text(m) for m in client.messages(stream)] == ["aa", "bb", "cc"]


def test_keepalive_pings_and_closes_a_peer_that_does_not_answer(connect) -> None:
    ping = PingLimits(0.1, 0.2, True, 0, 300.0, 2)
    _, client = connect({}, ping=ping)
    assert client.pump(lambda: client.pings >= 3)  # answered: it pings on
    assert not client.closed
    client.answer_pings = False
    assert client.pump(lambda: client.closed)


def test_too_many_pings_end_the_connection_enhance_your_calm(connect) -> None:
    _, client = connect({}, ping=PingLimits(3600.0, 20.0, True, 2, 300.0, 2))
    for n in range(4):
        client.h2.ping(struct.pack(">Q", n))
        client.flush()
    assert client.pump(lambda: client.goaway is not None)
    assert client.goaway == ErrorCodes.ENHANCE_YOUR_CALM
    assert client.pump(lambda: client.closed)


def test_a_connection_past_its_age_goes_away_after_its_calls(connect) -> None:
    release, started = threading.Event(), threading.Event()

    def slow(request, context):
        started.set()
        release.wait(WAIT_S)
        return StringValue(value="done")

    _, client = connect({b"/t/Slow": _method(slow)}, max_age_s=0.3, grace_s=0.0)
    client.call("/t/Slow", _msg(""))
    assert started.wait(WAIT_S)
    # Past its age (with gRPC core's jitter): a GOAWAY, and the call goes on. (h2's client
    # reads nothing after a GOAWAY, so the answer is not read here; grpcio's client in
    # the integration tests reads it.)
    assert client.pump(lambda: client.goaway is not None)
    assert client.goaway == ErrorCodes.NO_ERROR
    client.pump(lambda: False, timeout=0.3)
    assert not client.closed
    release.set()
    assert client.pump(lambda: client.closed)  # the last call over: the close


def test_a_window_that_stays_shut_resets_the_call(connect) -> None:
    """A peer that never opens its window: the answer waits ``stall_s``, then the call is
    reset (CANCEL) and its callbacks run; the connection serves on."""
    ended = threading.Event()

    def big(request, context):
        context.add_callback(ended.set)
        return StringValue(value="w" * 10_000)

    _, client = connect({b"/t/Big": _method(big)}, window=0, stall_s=0.3)
    stream = client.call("/t/Big", _msg(""))
    assert client.pump(lambda: stream in client.resets)
    assert client.resets[stream] == ErrorCodes.CANCEL
    assert stream in client.headers and not client.data.get(stream)
    assert ended.wait(WAIT_S)
    assert not client.closed


def test_stopping_the_server_drains_its_connections() -> None:
    """SIGTERM's path: no new connections; a GOAWAY on each open one, whose call in flight
    finishes; the connection closes once it has, and ``stop`` returns."""
    from conch.frontend.grpc.h2_server import H2Server, listen

    release, started = threading.Event(), threading.Event()

    def slow(request, context):
        started.set()
        release.wait(WAIT_S)
        return StringValue(value="done")

    limits = Limits(max_message_bytes=1000, ping=QUIET)
    server = H2Server(
        listen("127.0.0.1", 0, shared=False), {b"/t/Slow": _method(slow)}, limits, None
    )
    server.start()
    client = Client(socket.create_connection(("127.0.0.1", server.port)))
    try:
        client.call("/t/Slow", _msg(""))
        assert started.wait(WAIT_S)
        stopping = threading.Thread(target=server.stop, args=(WAIT_S,))
        stopping.start()
        assert client.pump(lambda: client.goaway is not None)
        assert client.goaway == ErrorCodes.NO_ERROR
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
        assert stopping.is_alive()  # its call still runs
        release.set()
        assert client.pump(lambda: client.closed)
        stopping.join(WAIT_S)
        assert not stopping.is_alive() and not server.connections
    finally:
        release.set()
        client.sock.close()


def test_health_watch_is_unimplemented_as_a_base_class_would_say(connect) -> None:
    """Watch (server streaming) is not served: the call ends UNIMPLEMENTED with grpcio's
    words, not UNKNOWN; the request is grpcio-health-checking's own message."""
    from grpc_health.v1 import health_pb2

    from conch.frontend.grpc.h2_methods import method_table
    from conch.frontend.grpc.health import HealthService

    methods = method_table(object(), HealthService(None))  # type: ignore[arg-type]
    _, client = connect(methods)
    request = framing.frame(health_pb2.HealthCheckRequest(service="").SerializeToString())
    stream = client.call("/grpc.health.v1.Health/Watch", request)
    assert client.pump(lambda: stream in client.ended)
    assert client.status(stream) == (framing.Status.UNIMPLEMENTED, "Method not implemented!")
