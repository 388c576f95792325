"""The h2 transport's call context: what the services ask of a call, over one stream."""

from __future__ import annotations

import time

import pytest

from conch.frontend.grpc.call_context import CallAborted, CallContext, failure, metadata
from conch.frontend.grpc.grpc_framing import Status
from conch.frontend.grpc.h2_methods import method_table

HEADERS = [
    (b":method", b"POST"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
    (b"grpc-timeout", b"1S"),
    (b"traceparent", b"00-abc-def-01"),
    (b"triton-grpc-protocol-key", b"s3cret"),
    (b"x-blob-bin", b"AAEC"),  # unpadded base64 of b"\0\1\2"
]


def _context(deadline: float | None = None, accepted=frozenset()) -> CallContext:
    return CallContext(HEADERS, deadline, frozenset(accepted))


def test_metadata_is_the_callers_own_headers_as_grpcio_hands_them() -> None:
    assert metadata(HEADERS) == (
        ("traceparent", "00-abc-def-01"),
        ("triton-grpc-protocol-key", "s3cret"),
        ("x-blob-bin", b"\0\1\2"),
    )
    assert dict(_context().invocation_metadata())["traceparent"] == "00-abc-def-01"


def test_abort_raises_with_the_protocols_number() -> None:
    with pytest.raises(CallAborted) as err:
        _context().abort(Status.UNAVAILABLE, "restricted")
    assert (err.value.status, err.value.details) == (14, "restricted")
    assert failure(err.value, _context()) == (14, "restricted")


def test_time_remaining_is_none_without_a_deadline() -> None:
    assert _context().time_remaining() is None
    left = _context(time.monotonic() + 5).time_remaining()
    assert left is not None and 4 < left <= 5
    assert _context(time.monotonic() - 1).time_remaining() == 0.0


def test_compression_only_in_an_encoding_the_caller_takes() -> None:
    context = _context(accepted={"gzip", "deflate"})
    context.set_compression("deflate")
    assert context.encoding == "deflate"
    context.set_compression(None)
    assert context.encoding is None
    picky = _context(accepted={"gzip"})
    picky.set_compression("deflate")
    assert picky.encoding is None


def test_callbacks_run_once_when_the_call_ends() -> None:
    context = _context()
    ran: list[int] = []
    assert context.add_callback(lambda: ran.append(1))
    assert context.add_callback(lambda: 1 / 0)  # a failing one does not stop the rest
    assert context.add_callback(lambda: ran.append(2))
    context.end()
    context.end()
    assert ran == [1, 2]
    assert not context.is_active()
    assert not context.add_callback(lambda: ran.append(3))


def test_a_servicer_stub_ends_its_call_with_the_code_it_set() -> None:
    """grpcio's generated base classes set UNIMPLEMENTED, then raise."""
    context = _context()
    context.set_code(Status.UNIMPLEMENTED)
    context.set_details("Method not implemented!")
    assert failure(NotImplementedError("x"), context) == (12, "Method not implemented!")
    assert failure(RuntimeError("boom"), _context())[0] == Status.UNKNOWN


def test_the_method_table_routes_every_rpc_with_its_kind() -> None:
    class Servicer:
        def __getattr__(self, name: str):
            return name

    table = method_table(Servicer(), Servicer())
    infer = table[b"/inference.GRPCInferenceService/ModelInfer"]
    assert infer.handler == "ModelInfer"
    assert not infer.client_streaming and not infer.server_streaming
    stream = table[b"/inference.GRPCInferenceService/ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming
    watch = table[b"/grpc.health.v1.Health/Watch"]
    assert watch.server_streaming and not watch.client_streaming
    assert b"/grpc.health.v1.Health/Check" in table
    assert len([p for p in table if p.startswith(b"/inference.")]) == 20


def test_an_rpc_the_servicer_lacks_answers_unimplemented() -> None:
    """As a generated servicer's base class answers it: the health service's Watch."""
    table = method_table(object(), object())
    watch = table[b"/grpc.health.v1.Health/Watch"]
    with pytest.raises(CallAborted) as err:
        watch.handler(watch.parse(b""), _context())
    assert err.value.status == Status.UNIMPLEMENTED
    assert err.value.details == "Method not implemented!"
