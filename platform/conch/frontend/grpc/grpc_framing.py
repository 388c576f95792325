"""gRPC over HTTP/2, the layer above the HTTP/2 library: messages, status, deadlines, encodings.

gRPC's own wire rules (its PROTOCOL-HTTP2.md), which no HTTP/2 library knows and the ``h2``
transport (``h2_connection``) needs: each message is a 1-byte compressed flag, a 4-byte
big-endian length and the payload; a call ends with ``grpc-status`` and a percent-encoded
``grpc-message`` in its trailers; ``grpc-timeout`` is the caller's deadline; and
``grpc-encoding`` / ``grpc-accept-encoding`` name how a message is compressed (gzip and
deflate, as every gRPC library has them). Pure functions and one small class, nothing of
HTTP/2 or sockets, so that each rule is tested alone (tests/unit/frontend/grpc).
"""

from __future__ import annotations

import functools
import re
import struct
import zlib
from enum import IntEnum

PREFIX = struct.Struct(">BI")  # compressed flag, length
IDENTITY = "identity"
ENCODINGS = ("gzip", "deflate")  # what this server decompresses and compresses with
# Sent on every response: what a client may compress its messages with.
ACCEPT_ENCODING = ",".join((IDENTITY, *ENCODINGS)).encode()


class Status(IntEnum):
    """gRPC's status codes (the numbers are the protocol's)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """A call that fails in the gRPC layer itself (a bad message, an unknown encoding)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- grpc-timeout ---------------------------------------------------------------------------

_TIMEOUT = re.compile(rb"([0-9]{1,8})([HMSmun])")
_UNIT_S = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(value: bytes) -> float:
    """``grpc-timeout`` (at most 8 digits, then a unit: Hours, Minutes, Seconds, milli-,
    micro-, nanoseconds) in seconds; ValueError for anything else."""
    found = _TIMEOUT.fullmatch(value)
    if found is None:
        raise ValueError(f"malformed grpc-timeout: {value[:32]!r}")
    return int(found[1]) * _UNIT_S[found[2]]


# -- trailers -------------------------------------------------------------------------------

# What grpc-message may carry as it is: printable ASCII but '%'.
_UNSAFE = re.compile(rb"[^\x20-\x24\x26-\x7e]")


def percent_encode(message: str) -> bytes:
    """``grpc-message``'s encoding: the UTF-8 bytes, each outside printable ASCII (and
    '%' itself) written as %XX."""
    raw = message.encode("utf-8", "replace")
    return _UNSAFE.sub(lambda m: b"%%%02X" % m[0][0], raw)


def percent_decode(value: bytes) -> str:
    """A ``grpc-message`` read back (a malformed escape is left as it is, as gRPC says)."""
    return re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m[1], 16)]), value).decode(
        "utf-8", "replace"
    )


def status_trailers(status: int, message: str = "") -> list[tuple[bytes, bytes]]:
    """The trailers that end a call: ``grpc-status``, and ``grpc-message`` when there is one."""
    trailers = [(b"grpc-status", b"%d" % status)]
    if message:
        trailers.append((b"grpc-message", percent_encode(message)))
    return trailers


# -- encodings --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)  # a client sends the same value on every call
def accepted_encodings(value: bytes | None) -> frozenset[str]:
    """The encodings a ``grpc-accept-encoding`` header names that this server has."""
    if not value:
        return frozenset()
    named = {part.strip().lower() for part in value.decode("latin-1").split(",")}
    return frozenset(named.intersection(ENCODINGS))


def compress(encoding: str, data: bytes) -> bytes:
    """``data`` compressed as ``encoding`` (gRPC's "deflate" is zlib's format, RFC 1950)."""
    if encoding == "gzip":
        packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        packer = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS)
    else:
        raise ValueError(f"no such encoding: {encoding}")
    return packer.compress(data) + packer.flush()


def decompress(encoding: str, data: bytes, limit: int) -> bytes:
    """``data`` decompressed, never past ``limit`` bytes (a small message must not expand
    into a large one): RESOURCE_EXHAUSTED past it, INTERNAL when it does not decompress."""
    bits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    unpacker = zlib.decompressobj(bits)
    try:
        out = unpacker.decompress(data, limit + 1)
        if len(out) > limit:
            raise GrpcError(
                Status.RESOURCE_EXHAUSTED,
                f"decompressed message larger than the limit of {limit} bytes",
            )
        out += unpacker.flush()
    except zlib.error as exc:
        raise GrpcError(Status.INTERNAL, f"cannot decompress a {encoding} message: {exc}") from None
    if not unpacker.eof or len(out) > limit:
        raise GrpcError(Status.INTERNAL, f"a truncated {encoding} message")
    return out


def request_encoding(value: bytes | None) -> str | None:
    """The encoding a request's ``grpc-encoding`` header names (None: identity); an
    encoding this server does not have is UNIMPLEMENTED, as gRPC says."""
    if not value:
        return None
    name = value.decode("latin-1").strip().lower()
    if name == IDENTITY:
        return None
    if name not in ENCODINGS:
        raise GrpcError(Status.UNIMPLEMENTED, f"grpc-encoding {name!r} is not supported")
    return name


# -- messages ---------------------------------------------------------------------------------


def frame(payload: bytes, encoding: str | None = None) -> bytes:
    """One length-prefixed message, compressed with ``encoding`` when given."""
    if encoding is not None:
        payload = compress(encoding, payload)
    return PREFIX.pack(encoding is not None, len(payload)) + payload


class MessageReader:
    """A call's request messages, cut from the DATA the peer sends in any pieces.

    ``limit`` bounds each message (its prefix's claim is refused at once, before its bytes
    come), decompressed too; ``encoding`` is the call's ``grpc-encoding``. What is held is
    at most one message's bytes (and the prefix of the next).
    """

    __slots__ = ("_buffer", "encoding", "limit")

    def __init__(self, limit: int, encoding: str | None = None) -> None:
        self.limit = limit
        self.encoding = encoding
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The whole messages ``data`` completes (none yet, often), decompressed;
        GrpcError for one this server cannot take."""
        buffer = self._buffer
        if not buffer and len(data) >= PREFIX.size:  # the common case: one whole message
            flag, length = PREFIX.unpack_from(data)
            if len(data) == PREFIX.size + length and length <= self.limit:
                return [self._open(flag, data[PREFIX.size :])]
        buffer += data
        messages = []
        while len(buffer) >= PREFIX.size:
            flag, length = PREFIX.unpack_from(buffer)
            if length > self.limit:
                raise GrpcError(
                    Status.RESOURCE_EXHAUSTED,
                    f"received message larger than max ({length} vs. {self.limit})",
                )
            end = PREFIX.size + length
            if len(buffer) < end:
                break
            payload = bytes(buffer[PREFIX.size : end])
            del buffer[:end]
            messages.append(self._open(flag, payload))
        return messages

    def _open(self, flag: int, payload: bytes) -> bytes:
        if flag == 0:
            return payload
        if flag != 1:
            raise GrpcError(Status.INTERNAL, f"invalid compressed flag {flag}")
        if self.encoding is None:
            raise GrpcError(
                Status.INTERNAL, "a compressed message without a grpc-encoding to decompress it"
            )
        return decompress(self.encoding, payload, self.limit)

    @property
    def partial(self) -> bool:
        """Whether bytes of an unfinished message are held (an error at the stream's end)."""
        return bool(self._buffer)


__all__ = [
    "ACCEPT_ENCODING",
    "ENCODINGS",
    "GrpcError",
    "MessageReader",
    "Status",
    "accepted_encodings",
    "compress",
    "decompress",
    "frame",
    "parse_timeout",
    "percent_decode",
    "percent_encode",
    "request_encoding",
    "status_trailers",
]
