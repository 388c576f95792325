"""A waiting HTTP call's client, watched: when it closes its connection, what the call
has queued is withdrawn and its waits end (``producer.Abandonment``), as a cancelled gRPC
call's are. The generate extension and OpenAI's routes hold calls open for a long time
(a stream); a client gone meanwhile should cost no model time.
"""

from __future__ import annotations

import _socket
import os
import select
import socket
import ssl
import threading
from typing import Any

from conch.frontend.producer import Abandonment

HANGUP_POLL_S = 0.25  # how often a waiting call looks at its client's socket


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
                    if self._over.is_set():
                        return
                    if not readable:
                        continue
                    data = peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue  # read by the connection meanwhile
                except (OSError, ValueError):
                    data = b""
                if not data and not self._over.is_set():
                    self._abandonment.abandon("the client closed the connection")
                return
        finally:
            peek.close()
