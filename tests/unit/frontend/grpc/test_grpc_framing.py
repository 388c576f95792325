"""gRPC's own wire rules for the h2 transport: grpc-timeout, length-prefixed messages,
status trailers and their percent-encoding, and gzip/deflate."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest

from conch.frontend.grpc import grpc_framing as framing
from conch.frontend.grpc.grpc_framing import GrpcError, MessageReader, Status


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"1H", 3600.0),
        (b"2M", 120.0),
        (b"30S", 30.0),
        (b"100m", 0.1),
        (b"250u", 250e-6),
        (b"99999999n", 0.099999999),
        (b"0S", 0.0),
    ],
)
def test_grpc_timeout_is_parsed_in_seconds(value: bytes, seconds: float) -> None:
    assert framing.parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value", [b"", b"10", b"S", b"123456789S", b"1.5S", b"-1S", b"10s", b"1S "]
)
def test_a_malformed_grpc_timeout_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        framing.parse_timeout(value)


def test_status_trailers_percent_encode_the_message() -> None:
    assert framing.status_trailers(0) == [(b"grpc-status", b"0")]
    trailers = dict(framing.status_trailers(Status.NOT_FOUND, "no model 'x' at 100%\n\u00e9"))
    assert trailers[b"grpc-status"] == b"5"
    assert trailers[b"grpc-message"] == b"no model 'x' at 100%25%0A%C3%A9"
    assert framing.percent_decode(trailers[b"grpc-message"]) == "no model 'x' at 100%\n\u00e9"


def test_printable_ascii_is_sent_as_it_is() -> None:
    text = "".join(chr(c) for c in range(0x20, 0x7F) if c != 0x25)
    assert framing.percent_encode(text) == text.encode()


def test_a_message_is_framed_with_its_flag_and_length() -> None:
    assert framing.frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    packed = framing.frame(b"a" * 1000, "gzip")
    flag, length = struct.unpack(">BI", packed[:5])
    assert flag == 1 and length == len(packed) - 5 < 1000
    assert gzip.decompress(packed[5:]) == b"a" * 1000
    deflated = framing.frame(b"b" * 1000, "deflate")
    assert zlib.decompress(deflated[5:]) == b"b" * 1000  # gRPC's deflate: zlib's format


def test_the_reader_cuts_messages_from_any_pieces() -> None:
    data = framing.frame(b"one") + framing.frame(b"") + framing.frame(b"three" * 100)
    reader = MessageReader(limit=1000)
    got = []
    for i in range(0, len(data), 3):
        got += reader.feed(data[i : i + 3])
    assert got == [b"one", b"", b"three" * 100]
    assert not reader.partial
    assert reader.feed(data[:7]) == [] and reader.partial


def test_the_reader_decompresses_with_the_calls_encoding() -> None:
    reader = MessageReader(limit=10_000, encoding="gzip")
    assert reader.feed(framing.frame(b"x" * 5000, "gzip") + framing.frame(b"plain")) == [
        b"x" * 5000,
        b"plain",
    ]


def test_a_claim_past_the_limit_is_refused_before_its_bytes_come() -> None:
    reader = MessageReader(limit=100)
    with pytest.raises(GrpcError) as err:
        reader.feed(struct.pack(">BI", 0, 2**31 - 1))
    assert err.value.status is Status.RESOURCE_EXHAUSTED


def test_a_message_that_decompresses_past_the_limit_is_refused() -> None:
    reader = MessageReader(limit=1000, encoding="deflate")
    with pytest.raises(GrpcError) as err:
        reader.feed(framing.frame(b"\0" * 100_000, "deflate"))  # 100 kB in a few bytes
    assert err.value.status is Status.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("encoding", "message"),
    [
        (None, b"\x01\x00\x00\x00\x02ab"),  # compressed, with no grpc-encoding
        ("gzip", b"\x01\x00\x00\x00\x02ab"),  # not gzip
        ("gzip", b"\x02\x00\x00\x00\x00"),  # a flag that is neither 0 nor 1
    ],
)
def test_a_message_that_cannot_be_opened_is_internal(encoding: str | None, message: bytes) -> None:
    with pytest.raises(GrpcError) as err:
        MessageReader(limit=100, encoding=encoding).feed(message)
    assert err.value.status is Status.INTERNAL


def test_a_truncated_compressed_message_is_internal() -> None:
    whole = framing.compress("gzip", b"y" * 500)
    cut = whole[: len(whole) // 2]
    with pytest.raises(GrpcError) as err:
        MessageReader(limit=1000, encoding="gzip").feed(framing.PREFIX.pack(1, len(cut)) + cut)
    assert err.value.status is Status.INTERNAL


def test_request_and_accepted_encodings() -> None:
    assert framing.request_encoding(None) is None
    assert framing.request_encoding(b"identity") is None
    assert framing.request_encoding(b"GZIP") == "gzip"
    with pytest.raises(GrpcError) as err:
        framing.request_encoding(b"snappy")
    assert err.value.status is Status.UNIMPLEMENTED
    assert framing.accepted_encodings(b"identity,deflate, gzip") == {"gzip", "deflate"}
    assert framing.accepted_encodings(b"identity") == frozenset()
    assert framing.accepted_encodings(None) == frozenset()
