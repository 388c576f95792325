"""One call's context: what ``InferenceService`` and ``HealthService`` ask of the call they
serve (``ServicerContext``), and the ``h2`` transport's ``CallContext`` that gives it.

The services abort with a status code, read the caller's metadata and deadline, choose
the response's compression, and register callbacks for the end of the call (which is how
a cancelled call withdraws its queued request). These are the semantics of grpcio's
context, which the services were first written against, with gRPC's own status numbers
(``grpc_framing.Status``) and encoding names, so that no transport's types reach the
services. ``CallContext`` gives exactly that over one HTTP/2 stream; ``h2_connection``
reads back what the service chose (status, compression) and runs the callbacks when the
call ends, however it ends. grpcio's transport adapts its own context (``server``).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from conch.frontend.grpc.grpc_framing import Status

log = logging.getLogger(__name__)

# The headers that are gRPC's or HTTP/2's own, never the caller's metadata.
_RESERVED = frozenset(
    {
        b"content-type",
        b"te",
        b"grpc-timeout",
        b"grpc-encoding",
        b"grpc-accept-encoding",
        b"grpc-message-type",
    }
)


class CallAborted(Exception):
    """``abort``: the call ends with this status, answered by the transport as trailers."""

    def __init__(self, status: int, details: str) -> None:
        super().__init__(details)
        self.status = status
        self.details = details


def metadata(headers: Sequence[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    """The caller's metadata from a request's headers, as grpcio hands it: keys and text
    values as ``str``; ``-bin`` values base64-decoded to ``bytes``."""
    found: list[tuple[str, str | bytes]] = []
    for key, value in headers:
        if key[:1] == b":" or key in _RESERVED:
            continue
        name = key.decode("latin-1")
        if name.endswith("-bin"):
            try:
                found.append((name, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:
                continue  # not base64: dropped, as a malformed value is
        else:
            found.append((name, value.decode("latin-1")))
    return tuple(found)


class ServicerContext(Protocol):
    """What a service may ask of the call it serves, on either transport."""

    def abort(self, code: int, details: str) -> NoReturn:
        """End the call with ``code`` (a ``Status``) and ``details``: raises."""

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        """The caller's metadata: text values as ``str``, ``-bin`` values as ``bytes``."""

    def time_remaining(self) -> float | None:
        """Seconds to the caller's deadline (None or a huge number: it set none)."""

    def set_compression(self, encoding: str | None) -> None:
        """Responses sent with this ``grpc-encoding`` (None: as they are)."""

    def add_callback(self, callback: Callable[[], Any]) -> bool:
        """``callback`` runs when the call ends; False if it has ended already."""

    def is_active(self) -> bool: ...

    def peer(self) -> str: ...

    def set_code(self, code: int) -> None: ...

    def set_details(self, details: str) -> None: ...


class CallContext:
    """``ServicerContext`` over one call of the ``h2`` transport.

    ``deadline`` is a ``time.monotonic()`` instant (None: the caller set none).
    ``accepted`` are the encodings the caller takes (``grpc-accept-encoding``).
    """

    __slots__ = (
        "_callbacks",
        "_headers",
        "_lock",
        "_metadata",
        "_peer",
        "accepted",
        "code",
        "deadline",
        "details",
        "encoding",
        "ended",
    )

    def __init__(
        self,
        headers: Sequence[tuple[bytes, bytes]],
        deadline: float | None,
        accepted: frozenset[str],
        peer: str = "",
    ) -> None:
        self._headers = headers
        self._metadata: tuple[tuple[str, str | bytes], ...] | None = None
        self._peer = peer
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], Any]] = []
        self.deadline = deadline
        self.accepted = accepted
        self.encoding: str | None = None  # the response's, once set_compression chose one
        self.code: int | None = None  # set_code: the status when the handler raises
        self.details = ""
        self.ended = False  # the call is over; its callbacks have run or are running

    # -- what the services call ----------------------------------------------------------

    def abort(self, code: int, details: str) -> NoReturn:
        raise CallAborted(int(code), details)

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        if self._metadata is None:
            self._metadata = metadata(self._headers)
        return self._metadata

    def time_remaining(self) -> float | None:
        """Seconds until the caller's deadline (0 once past); None when it set none."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def set_compression(self, encoding: str | None) -> None:
        """Responses compressed so, when the caller takes that encoding (else as they are)."""
        self.encoding = encoding if encoding in self.accepted else None

    def add_callback(self, callback: Callable[[], Any]) -> bool:
        """``callback`` runs when the call ends: answered, failed, cancelled or past its
        deadline. False (not registered) when it has ended already, as grpcio says."""
        with self._lock:
            if self.ended:
                return False
            self._callbacks.append(callback)
            return True

    def is_active(self) -> bool:
        return not self.ended

    def peer(self) -> str:
        return self._peer

    def set_code(self, code: int) -> None:
        self.code = int(code)

    def set_details(self, details: str) -> None:
        self.details = details

    # -- what the transport calls ----------------------------------------------------------

    def end(self) -> None:
        """The call is over: its callbacks run, once, in the order they were added."""
        with self._lock:
            if self.ended:
                return
            self.ended = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a gRPC call's callback failed")


def failure(exc: BaseException, context: CallContext) -> tuple[int, str]:
    """The status a handler's exception ends its call with: an abort's own; the code the
    handler set (grpcio's servicer stubs set UNIMPLEMENTED, then raise); else UNKNOWN."""
    if isinstance(exc, CallAborted):
        return exc.status, exc.details
    if context.code is not None and context.code != Status.OK:
        return context.code, context.details or str(exc)
    return Status.UNKNOWN, f"Exception calling application: {exc}"


__all__ = ["CallAborted", "CallContext", "ServicerContext", "failure", "metadata"]
