"""One HTTP/2 connection of the ``h2`` transport: h2's state machine fed from a socket, and
gRPC calls run over its streams.

The ``h2`` library does HTTP/2 itself (framing, HPACK, flow control both ways, SETTINGS,
PING and its ACK, RST_STREAM, GOAWAY on a protocol error); ``grpc_framing`` does gRPC's
messages, trailers, deadlines and encodings; this module drives both. Its threads, which
are greenlets in ``conch grpc --grpc-transport h2`` (the process is gevent-patched before
anything is imported, so ``threading`` and ``socket`` here are gevent's):

- the **reader** (``serve``) reads the socket and feeds h2, and acts on its events under
  the connection's lock, never blocking there: it starts calls, hands them their
  messages, cancels them;
- one **writer** sends whatever h2 has ready, so a peer that reads slowly holds only its
  own connection's writer, and one that takes nothing for ``stall_s`` is dropped;
- a thread per **call** runs its servicer method, as grpcio's thread per RPC does, and
  blocks where the service blocks (the data plane's wait for a reply); the thread is one
  that waits for work (``h2_threads``), not one started for the call. A response waits
  while the peer's flow-control window is shut, releasing the lock;
- a **ticker** sends keepalive pings, closes a connection whose pings go unanswered, and
  ends a connection past its maximum age (GOAWAY, then the grace, then the close).

The module is written against the standard library's threads and sockets, not gevent's
own API: the import contracts keep gevent in the HTTP adapter, and the same code runs
(slower) on real threads, which is how its unit tests run it.

Everything a peer can make the server hold is bounded: concurrent streams
(SETTINGS_MAX_CONCURRENT_STREAMS, h2 ends a connection that opens more), the header list
(SETTINGS_MAX_HEADER_LIST_SIZE, enforced by h2's HPACK decoder), each request message
and what a stream buffers of it (``max_message_bytes``: RESOURCE_EXHAUSTED at its
prefix's claim), and what a response holds while the peer's window is shut (its own
message, until the peer leaves or the call ends), and a stream's requests not yet read
by its service (``STREAM_INBOX``, then the stream's window). The calls that run at once in the
process are bounded by ``--grpc-infer-thread-count`` (``slots``), as grpcio's pool of
threads bounds them; the rest wait, each holding only its stream (unary calls: see
``_run`` for streams).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from google.protobuf.message import DecodeError
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hyperframe.frame import GoAwayFrame

from conch.frontend.grpc import grpc_framing as framing
from conch.frontend.grpc import h2_threads
from conch.frontend.grpc.call_context import CallAborted, CallContext, failure
from conch.frontend.grpc.grpc_framing import GrpcError, Status
from conch.frontend.grpc.h2_methods import Method
from conch.frontend.grpc.h2_pings import PingBook, PingLimits

log = logging.getLogger(__name__)

# The peer's headers are checked as h2 checks them; ours are constants, written once.
CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)
RECV_BYTES = 1 << 16
SEND_CHUNK = 1 << 18  # what one send may take: the stall timeout measures progress
# Each stream's receive window, and the connection's: large enough that a client sending a
# large request is not held to a round trip per 64 KiB (what a stream buffers is bounded by
# the message limit, not by these).
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 1 << 24
# A stream's requests read but not yet taken by its service: past this many, what the
# peer sends more is not acknowledged, so its window closes (back-pressure, not a buffer
# that grows with what the peer sends).
STREAM_INBOX = 64
_DEFAULT_WINDOW = 65_535

_HEAD = [
    (b":status", b"200"),
    (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", framing.ACCEPT_ENCODING),
]
_HEADS: dict[str | None, list[tuple[bytes, bytes]]] = {
    None: _HEAD,
    **{name: [*_HEAD, (b"grpc-encoding", name.encode())] for name in framing.ENCODINGS},
}
_END = object()  # on a streaming call's inbox: no more requests
_INF = float("inf")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection allows its peer, and how long it waits on it."""

    max_message_bytes: int
    ping: PingLimits
    max_concurrent_streams: int = 1024
    max_header_list_bytes: int = 1 << 16
    stall_s: float = 30.0  # a peer that takes nothing we send for this long is dropped
    max_age_s: float = 0.0  # 0: no limit
    grace_s: float = 0.0  # after the age's GOAWAY; 0: no limit


class _Gone(Exception):
    """The call ended (cancelled, past its deadline, its connection closed) while its
    handler still ran: what it sends now goes nowhere."""


class Call:
    """One RPC on one stream: its method, context, and request messages as they come."""

    __slots__ = (
        "context",
        "finished",
        "headers_sent",
        "inbox",
        "input_ended",
        "messages",
        "method",
        "over",
        "reader",
        "stream",
        "unacked",
    )

    def __init__(
        self, stream: int, method: Method, context: CallContext, reader: framing.MessageReader
    ) -> None:
        self.stream = stream
        self.method = method
        self.context = context
        self.reader = reader
        self.messages: list[bytes] = []  # a unary request's (one, once the stream ends)
        # A streaming request's messages, as they come; _END after the last.
        self.inbox: queue.Queue[Any] | None = queue.Queue() if method.client_streaming else None
        self.unacked = 0  # bytes received on a full inbox, acknowledged once it drains
        self.headers_sent = False
        self.input_ended = False  # the peer ended its side of the stream
        self.finished = False  # our side is over: trailers sent, or the stream reset
        # Set when finished, for the deadline's watcher (only calls with a deadline).
        self.over: threading.Event | None = None


class Connection:
    """One client connection (see the module docstring); ``serve`` runs it to its end."""

    def __init__(
        self,
        sock: socket.socket,
        methods: dict[bytes, Method],
        limits: Limits,
        peer: str = "",
        slots: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.sock = sock
        self.methods = methods
        self.limits = limits
        self.peer = peer
        # The process's calls at once (--grpc-infer-thread-count), shared by its
        # connections; a call waits for one before its method runs. None: no bound.
        self.slots = slots
        self.h2 = h2.connection.H2Connection(CONFIG)
        self.lock = threading.Lock()
        self.window = threading.Condition(self.lock)  # a peer's window opened, or a call ended
        self._blocked = 0  # senders waiting on ``window`` (most of the time none)
        self.ready = threading.Event()  # for the writer: bytes to send, or the close
        self.tick = threading.Event()  # for the ticker: look again now
        self.written = threading.Event()  # the writer is done
        self.calls: dict[int, Call] = {}
        self.pings = PingBook(limits.ping)
        self.closing = False
        self.draining = False  # a GOAWAY sent: no new calls, the close once the last ends
        self._extra = b""  # frames for after h2's (the draining GOAWAY, which h2 has not)
        self._ping_payload = b""
        self._ping_deadline: float | None = None
        self._events: dict[type, Callable[[Any], None]] = {
            h2.events.RequestReceived: self._on_request,
            h2.events.DataReceived: self._on_data,
            h2.events.StreamEnded: self._on_end,
            h2.events.StreamReset: self._on_reset,
            h2.events.WindowUpdated: self._on_window,
            h2.events.RemoteSettingsChanged: self._on_window,
            h2.events.PingReceived: self._on_ping,
            h2.events.PingAckReceived: self._on_ping_ack,
            h2.events.ConnectionTerminated: self._on_goaway,
        }

    # -- the reader ----------------------------------------------------------------------

    def serve(self) -> None:
        """Run the connection until the peer leaves, breaks the protocol, or it is closed."""
        try:
            with self.lock:
                self.h2.initiate_connection()
                self.h2.update_settings(
                    {
                        SettingCodes.MAX_CONCURRENT_STREAMS: self.limits.max_concurrent_streams,
                        SettingCodes.MAX_HEADER_LIST_SIZE: self.limits.max_header_list_bytes,
                        SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                    }
                )
                self.h2.increment_flow_control_window(CONNECTION_WINDOW - _DEFAULT_WINDOW)
            self.ready.set()
            h2_threads.spawn(self._write)
            h2_threads.spawn(self._ticker)
            while not self.closing:
                try:
                    data = self.sock.recv(RECV_BYTES)
                except TimeoutError:
                    continue  # idle; the writer and the ticker watch the peer
                except (OSError, ValueError):
                    break
                if not data or not self._receive(data):
                    break
        except Exception:
            log.exception("gRPC connection from %s failed", self.peer)
        finally:
            self.close()

    def _receive(self, data: bytes) -> bool:
        """``data`` fed to h2 and its events acted on; False once the connection must end."""
        with self.lock:
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError as exc:  # h2 has queued its GOAWAY
                log.debug("HTTP/2 protocol error from %s: %s", self.peer, exc)
                self.closing = True
                events = []
            for event in events:
                act = self._events.get(type(event))
                if act is not None:
                    try:  # noqa: SIM105  (per event: cheaper than contextlib.suppress)
                        act(event)
                    except h2.exceptions.StreamClosedError:
                        pass  # the peer ended that stream in the same read: nothing to answer
            if not self.closing and self._oversized_frame():
                self._goaway(ErrorCodes.FRAME_SIZE_ERROR, b"frame too large")
        self.ready.set()
        return not self.closing

    def _oversized_frame(self) -> bool:
        """Whether the frame h2 has begun to buffer is longer than SETTINGS_MAX_FRAME_SIZE.
        h2 checks a frame's length once the whole frame has come; until then a peer could
        make it buffer up to 16 MiB a connection for a frame it will refuse. Its header
        (the first 9 bytes, the length first) is read here as soon as it has come, from
        h2's frame buffer (private in h2 4.x: should it move, this check does nothing and
        tests/integration/grpc/test_grpc_hostile_peers.py's oversized frame says so)."""
        pending = getattr(self.h2.incoming_buffer, "_data", b"")
        return len(pending) >= 9 and int.from_bytes(pending[:3]) > self.h2.max_inbound_frame_size

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream = event.stream_id
        if self.draining:  # after our GOAWAY: the peer retries it on another connection
            self.h2.reset_stream(stream, ErrorCodes.REFUSED_STREAM)
            return
        path = verb = content_type = timeout = encoding = accept = None
        for key, value in event.headers:
            if key == b":path":
                path = value
            elif key == b":method":
                verb = value
            elif key == b"content-type":
                content_type = value
            elif key == b"grpc-timeout":
                timeout = value
            elif key == b"grpc-encoding":
                encoding = value
            elif key == b"grpc-accept-encoding":
                accept = value
        if verb != b"POST":
            self._refuse_http(stream, b"405")
            return
        if content_type is None or not _is_grpc(content_type):
            self._refuse_http(stream, b"415")
            return
        method = self.methods.get(path or b"")
        if method is None:
            name = (path or b"").decode("latin-1")
            self._trailers_only(stream, Status.UNIMPLEMENTED, f"Method not found: {name}")
            return
        try:
            decoding = framing.request_encoding(encoding)
            deadline = (
                None if timeout is None else time.monotonic() + framing.parse_timeout(timeout)
            )
        except GrpcError as exc:
            self._trailers_only(stream, exc.status, exc.message)
            return
        except ValueError as exc:
            self._trailers_only(stream, Status.INTERNAL, str(exc))
            return
        context = CallContext(
            event.headers, deadline, framing.accepted_encodings(accept), self.peer
        )
        call = Call(
            stream, method, context, framing.MessageReader(self.limits.max_message_bytes, decoding)
        )
        self.calls[stream] = call
        if method.client_streaming:
            self._start(call)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream = event.stream_id
        call = self.calls.get(stream)
        if call is not None and call.inbox is not None and call.inbox.qsize() >= STREAM_INBOX:
            call.unacked += event.flow_controlled_length  # held until the service reads
        else:
            self.h2.acknowledge_received_data(event.flow_controlled_length, stream)
        if call is None or call.finished:
            return  # a call already answered (or refused): its bytes are dropped
        try:
            messages = call.reader.feed(event.data)
        except GrpcError as exc:
            self._end_call(call, exc.status, exc.message, spawn=True)
            return
        if not messages:
            return
        if call.inbox is not None:
            for message in messages:
                call.inbox.put(message)
            return
        call.messages += messages
        if len(call.messages) > 1:
            self._end_call(
                call, Status.INTERNAL, "a unary call sent more than one request message", spawn=True
            )

    def _on_end(self, event: h2.events.StreamEnded) -> None:
        call = self.calls.get(event.stream_id)
        if call is None or call.finished:
            return
        call.input_ended = True
        if call.reader.partial:
            self._end_call(call, Status.INTERNAL, "the stream ended inside a message", spawn=True)
        elif call.inbox is not None:
            call.inbox.put(_END)
        elif len(call.messages) != 1:
            self._end_call(
                call, Status.INTERNAL, "a unary call sent no request message", spawn=True
            )
        else:
            self._start(call)

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        """The peer cancelled the call: it ends, and its callbacks withdraw what it queued."""
        call = self.calls.pop(event.stream_id, None)
        if call is not None and not call.finished:
            self._cancelled(call)
            h2_threads.spawn(call.context.end)
        self._wake_senders()

    def _on_window(self, _event: object) -> None:
        self._wake_senders()

    def _wake_senders(self) -> None:
        """Under the lock: senders held by a shut window look again (a notify costs, and
        there is seldom one to wake)."""
        if self._blocked:
            self.window.notify_all()

    def _on_ping(self, _event: object) -> None:
        if self.pings.received(time.monotonic(), bool(self.calls)):
            log.info("gRPC connection from %s: too many pings; closing it", self.peer)
            self._goaway(ErrorCodes.ENHANCE_YOUR_CALM, b"too_many_pings")

    def _on_ping_ack(self, event: h2.events.PingAckReceived) -> None:
        if event.ping_data == self._ping_payload:
            self._ping_deadline = None

    def _on_goaway(self, _event: object) -> None:
        self.closing = True  # the peer is done with the connection (h2 is closed too)

    # -- answering -------------------------------------------------------------------------

    def _refuse_http(self, stream: int, status: bytes) -> None:
        """Not a gRPC request: an HTTP status of its own (gRPC's rule for the content type)."""
        self.h2.send_headers(stream, [(b":status", status)], end_stream=True)
        self._reset_unended(stream)

    def _trailers_only(self, stream: int, status: int, message: str) -> None:
        """A call answered with its status alone (the trailers-only response)."""
        self.h2.send_headers(
            stream, _HEAD + framing.status_trailers(status, message), end_stream=True
        )
        self._reset_unended(stream)

    def _reset_unended(self, stream: int) -> None:
        """Our side is over: a peer still sending is told to stop (RST_STREAM NO_ERROR)."""
        state = self.h2.streams.get(stream)
        if state is not None and not state.closed:
            self.h2.reset_stream(stream, ErrorCodes.NO_ERROR)

    def _start(self, call: Call) -> None:
        if call.context.deadline is not None:
            call.over = threading.Event()
            h2_threads.spawn(self._watch_deadline, call)
        h2_threads.spawn(self._run, call)

    def _run(self, call: Call) -> None:
        """The call's thread. A unary call takes a slot first, as grpcio's server takes a
        thread of its pool for each call, and runs unless it ended while it waited
        (cancelled, reset or past its deadline: its callbacks have run, and it must not
        queue work now). A stream takes none: it lasts as long as its peer keeps it open,
        so streams holding slots would let one peer starve every other call; the work
        of its requests is bounded by the service's own pool of as many threads."""
        if self.slots is None or call.method.client_streaming:
            self._serve_call(call)
            return
        with self.slots:
            if not call.finished:
                self._serve_call(call)

    def _serve_call(self, call: Call) -> None:
        """The call's method run, its responses sent, its status, its callbacks."""
        method, context = call.method, call.context
        try:
            if method.client_streaming:
                request: Any = self._requests(call)
            else:
                try:
                    request = method.parse(call.messages[0])
                except DecodeError as exc:
                    raise CallAborted(Status.INTERNAL, f"cannot parse the request: {exc}") from None
            answer = method.handler(request, context)
            if method.server_streaming:
                try:
                    for response in answer:
                        self._send(call, response)
                finally:
                    close = getattr(answer, "close", None)
                    if close is not None:
                        close()
            else:
                self._send(call, answer, last=True)
            status, message = Status.OK, ""
        except _Gone:
            return
        except Exception as exc:
            status, message = failure(exc, context)
            if status == Status.UNKNOWN:
                log.exception("gRPC %s failed", method.name)
        if not call.finished:  # else its trailers went with its answer, or it was ended
            with self.lock:
                self._end_call(call, status, message, spawn=False)
            self.ready.set()
        context.end()

    def _requests(self, call: Call) -> Iterator[Any]:
        """A streaming call's requests, parsed, as they come; over at the stream's end or
        the call's. One that does not parse ends the call, INTERNAL."""
        inbox, parse = call.inbox, call.method.parse
        assert inbox is not None
        while True:
            message = inbox.get()
            if message is _END:
                return
            if call.unacked and inbox.qsize() < STREAM_INBOX:
                self._acknowledge(call)
            try:
                request = parse(message)
            except DecodeError as exc:
                with self.lock:
                    self._end_call(
                        call, Status.INTERNAL, f"cannot parse a request: {exc}", spawn=True
                    )
                self.ready.set()
                return
            yield request

    def _acknowledge(self, call: Call) -> None:
        """The bytes held on ``call``'s full inbox acknowledged: the peer may send again."""
        with self.lock:
            self._release_held(call)
        self.ready.set()

    def _release_held(self, call: Call) -> None:
        """Under the lock: ``call``'s held bytes acknowledged (to the connection's window
        too, so that a call that ends holding some does not shrink it for good)."""
        held, call.unacked = call.unacked, 0
        if held:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.acknowledge_received_data(held, call.stream)

    def _send(self, call: Call, response: Any, *, last: bool = False) -> None:
        """One response message: the headers first, then its DATA as the window allows;
        when ``last`` (a unary call's answer), the trailers (OK) too, so that the writer
        sends the whole answer in one write, woken once. A window that stays shut for
        ``stall_s`` ends the call (RST_STREAM CANCEL): a peer that never opens it does not
        hold the message, nor the call's thread, for good."""
        data = framing.frame(response.SerializeToString(), call.context.encoding)
        stream = call.stream
        with self.lock:
            if call.finished or self.closing:
                raise _Gone
            view, sent, shut_until = memoryview(data), 0, 0.0
            try:
                if not call.headers_sent:
                    self.h2.send_headers(stream, _HEADS[call.context.encoding])
                    call.headers_sent = True
                while sent < len(data):
                    if call.finished or self.closing:
                        raise _Gone
                    room = min(
                        self.h2.local_flow_control_window(stream), self.h2.max_outbound_frame_size
                    )
                    if room <= 0:
                        shut_until = shut_until or time.monotonic() + self.limits.stall_s
                        self._await_window(call, shut_until)
                        continue
                    self.h2.send_data(stream, view[sent : sent + room])
                    sent, shut_until = sent + room, 0.0
                if last:
                    self._end_call(call, Status.OK, "", spawn=False)
            except h2.exceptions.ProtocolError:  # the stream was reset, or the connection
                raise _Gone from None
            self.pings.data_sent()
        self.ready.set()

    def _await_window(self, call: Call, until: float) -> None:
        """Under the lock: wait for the peer to open ``call``'s window (or for the call or
        the connection to end) until ``until``; past it, the call is reset and _Gone raised."""
        left = until - time.monotonic()
        if left > 0:
            self.ready.set()  # what is queued goes out meanwhile
            self._blocked += 1
            try:
                self.window.wait(left)
            finally:
                self._blocked -= 1
            return
        log.info(
            "gRPC call on %s: the peer's window stayed shut %ss; resetting it",
            self.peer,
            self.limits.stall_s,
        )
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.reset_stream(call.stream, ErrorCodes.CANCEL)
        self.calls.pop(call.stream, None)
        self._cancelled(call)
        h2_threads.spawn(call.context.end)
        self.ready.set()
        raise _Gone

    def _end_call(self, call: Call, status: int, message: str, *, spawn: bool) -> None:
        """Under the lock: the call's trailers sent (unless it has ended already), and its
        callbacks run (on a thread of their own when ``spawn``; else the caller runs them)."""
        if call.finished:
            return
        try:
            trailers = framing.status_trailers(status, message)
            if call.headers_sent:
                self.h2.send_headers(call.stream, trailers, end_stream=True)
            else:
                self.h2.send_headers(call.stream, _HEAD + trailers, end_stream=True)
            self._reset_unended(call.stream)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass  # the peer reset it meanwhile, or the connection is gone
        self.pings.data_sent()
        self.calls.pop(call.stream, None)
        self._cancelled(call)
        if spawn:
            h2_threads.spawn(call.context.end)

    def _cancelled(self, call: Call) -> None:
        """Under the lock: the call is over; whatever waits on its inbox or window wakes."""
        call.finished = True
        self._release_held(call)
        if call.inbox is not None:
            call.inbox.put(_END)
        if call.over is not None:
            call.over.set()
        self._wake_senders()
        if self.draining and not self.calls:
            self.tick.set()

    def _watch_deadline(self, call: Call) -> None:
        """A call still running at its deadline ends DEADLINE_EXCEEDED, its callbacks run
        (so what it queued is withdrawn), as gRPC servers end it."""
        assert call.over is not None and call.context.deadline is not None
        if call.over.wait(max(0.0, call.context.deadline - time.monotonic())):
            return
        with self.lock:
            self._end_call(call, Status.DEADLINE_EXCEEDED, "Deadline Exceeded", spawn=False)
        self.ready.set()
        call.context.end()

    # -- the writer ------------------------------------------------------------------------

    def _write(self) -> None:
        try:
            closing = False
            while True:
                if not closing:
                    self.ready.wait()
                    self.ready.clear()
                with self.lock:
                    out = self.h2.data_to_send()
                    if self._extra:
                        out, self._extra = out + self._extra, b""
                    closing = self.closing
                if out:
                    self._put(out)
                elif closing:
                    return
        except TimeoutError:
            log.info(
                "gRPC connection from %s took nothing for %ss; closing it",
                self.peer,
                self.limits.stall_s,
            )
        except (OSError, ValueError):
            pass  # the peer has gone
        except Exception:
            log.exception("gRPC connection from %s: the writer failed", self.peer)
        finally:
            self.written.set()
            self._stop_reading()

    def _put(self, out: bytes) -> None:
        """``out`` written to the socket: one ``send`` nearly always (``sendall`` would
        ask the socket its buffer's size first, each time), each taking what the socket
        takes of at most SEND_CHUNK, and waiting at most ``stall_s`` for room (the
        socket's timeout: TimeoutError)."""
        view, sent = memoryview(out), 0
        while sent < len(out):
            sent += self.sock.send(view[sent : sent + SEND_CHUNK])

    # -- the ticker: keepalive, maximum age ------------------------------------------------

    def _ticker(self) -> None:
        try:
            self._tick()
        except Exception:
            log.exception("gRPC connection from %s: the ticker failed", self.peer)
        finally:
            self._stop_reading()

    def _tick(self) -> None:
        limits = self.limits
        now = time.monotonic()
        next_ping = now + limits.ping.keepalive_time_s
        age_at = now + limits.max_age_s * random.uniform(0.9, 1.1) if limits.max_age_s else _INF
        grace_at = _INF
        while not self.closing:
            wake = min(next_ping, self._ping_deadline or _INF, age_at, grace_at)
            self.tick.wait(max(0.0, wake - time.monotonic()))
            self.tick.clear()
            now = time.monotonic()
            with self.lock:
                if self.closing:
                    return
                if self._ping_deadline is not None and now >= self._ping_deadline:
                    log.info(
                        "gRPC connection from %s: keepalive ping unanswered; closing it", self.peer
                    )
                    self.closing = True
                elif now >= next_ping:
                    next_ping = now + limits.ping.keepalive_time_s
                    if self._ping_deadline is None and self.pings.may_ping(bool(self.calls)):
                        self._ping_payload = os.urandom(8)
                        self.h2.ping(self._ping_payload)
                        self.pings.pinged()
                        self._ping_deadline = now + limits.ping.keepalive_timeout_s
                if now >= age_at:
                    age_at = _INF
                    self._drain()
                    grace_at = now + limits.grace_s if limits.grace_s else _INF
                if self.draining and (not self.calls or now >= grace_at):
                    self._goaway(ErrorCodes.NO_ERROR, b"")
            self.ready.set()

    # -- ending ----------------------------------------------------------------------------

    def drain(self) -> None:
        """Graceful end: GOAWAY, no new calls, and the close once the last call has ended."""
        with self.lock:
            self._drain()
        self.ready.set()
        self.tick.set()

    def _drain(self) -> None:
        """Under the lock: the first GOAWAY of a graceful end. h2 writes only a final
        GOAWAY (after which it sends nothing), so this one is hyperframe's frame, queued
        after h2's bytes; the calls up to its last stream id go on."""
        if self.draining or self.closing:
            return
        self.draining = True
        frame = GoAwayFrame(0)
        frame.last_stream_id = self.h2.highest_inbound_stream_id
        frame.error_code = ErrorCodes.NO_ERROR
        self._extra += frame.serialize()
        if not self.calls:
            self.tick.set()

    def _goaway(self, code: ErrorCodes, debug: bytes) -> None:
        """Under the lock: h2's final GOAWAY, and the connection closes."""
        with contextlib.suppress(h2.exceptions.ProtocolError):  # closed already
            self.h2.close_connection(error_code=code, additional_data=debug or None)
        self.closing = True
        self.tick.set()

    def _stop_reading(self) -> None:
        """Wake the reader (blocked on the socket) so that it ends the connection."""
        self.closing = True
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self.sock, socket.SHUT_RD)

    def close(self) -> None:
        """End the connection: the calls still running cancelled (their callbacks run:
        what they queued is withdrawn), what h2 has left sent, the socket closed."""
        with self.lock:
            self.closing = True
            calls = [c for c in self.calls.values() if not c.finished]
            self.calls.clear()
            for call in calls:
                self._cancelled(call)
        for call in calls:
            h2_threads.spawn(call.context.end)
        self.ready.set()
        self.tick.set()
        self.written.wait(self.limits.stall_s)
        with contextlib.suppress(OSError):
            self.sock.close()


def _is_grpc(content_type: bytes) -> bool:
    """``application/grpc``, alone or with a subtype (``+proto``) or parameters."""
    if not content_type.startswith(b"application/grpc"):
        return False
    return len(content_type) == 16 or content_type[16:17] in (b"+", b";")


__all__ = ["CONFIG", "Call", "Connection", "Limits"]
