"""A waiting HTTP call's client, watched: when it closes its connection, what the call
has queued is withdrawn and its waits end (``producer.Abandonment``), as a cancelled gRPC
call's are. A client gone meanwhile should cost no model time.

Two watches, for two kinds of call:

- ``HangupWatch``, a thread per call: the generate extension and OpenAI's routes, which
  hold calls open for a long time (a stream).
- ``InferWatcher``, one thread per process for every v2 infer call (``fast_path``), the
  gateway's busiest path: a call is only registered, and its client's socket is looked
  at once it has waited ``INFER_WATCH_AFTER_S`` (most are answered sooner, and never
  cost more than the registration), then every ``HANGUP_POLL_S`` with one non-blocking
  peek.
"""

from __future__ import annotations

import _socket
import itertools
import logging
import os
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

from conch.frontend.producer import Abandonment

log = logging.getLogger(__name__)

HANGUP_POLL_S = 0.25  # how often a waiting call looks at its client's socket
INFER_WATCH_AFTER_S = 0.25  # how long an infer call waits before its client is looked at


class HangupWatch:
    """Watches a waiting call's client socket: when the client closes it, ``abandonment``
    withdraws what the call still has queued and ends its waits. Data from the client
    (a next request on the connection) ends the watch: the client is there. On a TLS
    socket nothing is watched (its bytes cannot be peeked at); a client gone is then
    found when the next event cannot be written."""

    def __init__(self, sock: Any, abandonment: Abandonment) -> None:
        self._sock = sock
        self._abandonment = abandonment
        self._over = threading.Event()

    @classmethod
    def start(cls, environ: dict[str, Any], abandonment: Abandonment) -> HangupWatch:
        sock = environ.get("gunicorn.socket")
        watch = cls(sock, abandonment)
        if isinstance(sock, socket.socket) and not isinstance(sock, ssl.SSLSocket):
            threading.Thread(target=watch._run, name="generate-hangup", daemon=True).start()
        return watch

    def stop(self) -> None:
        self._over.set()

    def _run(self) -> None:
        # A raw socket on a duplicate of the connection's descriptor: its peek never
        # waits, where the connection's own (gevent's) socket would park this watch on
        # the socket's read event, which the connection's greenlet then finds taken
        # when it reads the next request (gevent's ConcurrentObjectUseError).
        try:
            peek = _socket.socket(fileno=os.dup(self._sock.fileno()))
        except OSError:
            return  # the connection is gone already; the call finds out as it answers
        try:
            while not self._over.is_set():
                try:
                    readable, _, _ = select.select([peek], [], [], HANGUP_POLL_S)
                except (OSError, ValueError):
                    readable = [peek]  # the peek says what became of it
                if self._over.is_set():
                    return
                data = _peek(peek) if readable else None
                if data is None:
                    continue  # nothing yet, or read by the connection meanwhile
                if not data:
                    self._abandonment.abandon("the client closed the connection")
                return
        finally:
            peek.close()


def _peekable(sock: Any) -> bool:
    """A plain socket whose bytes can be peeked at (not TLS)."""
    return isinstance(sock, socket.socket) and not isinstance(sock, ssl.SSLSocket)


def _peek(sock: socket.socket) -> bytes | None:
    """What a client sent and nobody read yet: b"" once it closed its side, None while
    it is there and silent. ``sock`` is a raw socket: the peek never waits."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None
    except (OSError, ValueError):  # reset by the peer, or closed: gone too
        return b""


@dataclass
class _Call:
    sock: socket.socket
    abandonment: Abandonment
    since: float  # time.monotonic() when it began to wait


class InferWatcher:
    """Watches the client sockets of a process's waiting infer calls (the module
    docstring). ``watch`` registers a call and ``done`` ends its watch; a client that
    closes its connection meanwhile abandons the call. Data from the client (its next
    request, pipelined) ends the watch: the client is there. TLS sockets are not watched.
    """

    def __init__(self, after_s: float = INFER_WATCH_AFTER_S, poll_s: float = HANGUP_POLL_S) -> None:
        self.after_s = after_s
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._tokens = itertools.count(1)
        self._pid = 0  # the process whose thread runs (a fork starts its own)

    def watch(self, sock: Any, abandonment: Abandonment) -> int:
        """Watch ``sock`` for the waiting call ``abandonment`` speaks for; the token to
        end it with (0: nothing is watched)."""
        if not _peekable(sock):
            return 0
        token = next(self._tokens)
        # One dict operation, atomic under the GIL: the watch thread copies the dict.
        self._calls[token] = _Call(sock, abandonment, time.monotonic())
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._pid = os.getpid()
                    threading.Thread(target=self._run, name="infer-hangup", daemon=True).start()
        return token

    def done(self, token: int) -> None:
        if token:  # under the lock: the watch thread duplicates sockets still registered
            with self._lock:
                self._calls.pop(token, None)

    def _run(self) -> None:
        # Raw sockets on duplicates of the watched connections' descriptors (see
        # ``HangupWatch._run``), made while the call is registered, so while its
        # connection is open; closed here once its call is done.
        peeks: dict[int, socket.socket] = {}
        while True:
            time.sleep(self.poll_s)
            now = time.monotonic()
            with self._lock:
                calls = dict(self._calls)
                for token, call in calls.items():
                    if token not in peeks and now - call.since >= self.after_s:
                        try:
                            peeks[token] = _socket.socket(fileno=os.dup(call.sock.fileno()))
                        except OSError:
                            continue  # closed already: its call finds out as it answers
            for token in [t for t in peeks if t not in calls]:
                peeks.pop(token).close()
            for token, peek in list(peeks.items()):
                data = _peek(peek)
                if data is None:
                    continue
                if not data:
                    try:
                        calls[token].abandonment.abandon("the client closed the connection")
                    except Exception:  # Redis away: the call ends at its deadline anyway
                        log.exception("an infer call whose client left was not withdrawn")
                self.done(token)
                peeks.pop(token).close()


INFER_WATCHER = InferWatcher()  # the process's, for every infer call
