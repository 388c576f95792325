"""gunicorn's gevent worker, with a warm shutdown that does not wait on idle clients.

perf_analyzer and tritonclient keep their connections open between requests. The stock
worker counts such an idle keep-alive connection as work in progress and holds a warm
shutdown for the whole graceful timeout; this one closes idle connections at once and
lets the ones mid-request finish.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import gevent
from gunicorn.workers.ggevent import GeventWorker


class GatewayWorker(GeventWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle: dict[socket.socket, bool] = {}  # connection -> between requests

    def handle(self, listener: Any, client: socket.socket, addr: Any) -> None:
        self._idle[client] = True
        try:
            super().handle(listener, client, addr)
        finally:
            self._idle.pop(client, None)

    def handle_request(self, listener_name: Any, req: Any, sock: socket.socket, addr: Any) -> Any:
        self._idle[sock] = False
        try:
            return super().handle_request(listener_name, req, sock, addr)
        finally:
            self._idle[sock] = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        gevent.spawn(self._close_idle)

    def _close_idle(self) -> None:
        for sock, idle in list(self._idle.items()):
            if idle:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
