"""``pb_utils``'s side of BLS calls to decoupled models: ``exec(decoupled=True)`` and
``async_exec(decoupled=True)`` turn the BLS port's ``stream`` into Triton's
``ResponseIterator``, with a fake port standing in for ``conch.frontend.bls``.

Checked: the responses in order with the final one last (empty when the model sent the
final flag alone); exec returning once the first response came; an error that ends the
call as the last response, carrying the called model's message and code unchanged; a
call refused before it starts; iterating again after the end; ``cancel()`` and an
iterator dropped early cancelling the call, and one read to its end not cancelling it.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from conch.backends.python import pb_utils as pb
from conch.core.errors import Cancelled, ConchError, InvalidArgument, NotFound
from conch.core.model_spec import BlsRequest, BlsResponse


class FakeResponses:
    """The port's ``BlsResponses``: ``items`` handed out in order (an exception is raised),
    each after ``pause`` seconds."""

    def __init__(self, items: list[BlsResponse | ConchError], pause: float = 0.0) -> None:
        self.items = list(items)
        self.pause = pause
        self.taken = 0
        self.cancels = 0

    def __iter__(self) -> Iterator[BlsResponse]:
        return self

    def __next__(self) -> BlsResponse:
        if self.cancels:
            raise Cancelled("request to model 'm' cancelled by its BLS caller")
        if not self.items:
            raise StopIteration
        time.sleep(self.pause)
        item = self.items.pop(0)
        self.taken += 1
        if isinstance(item, ConchError):
            raise item
        return item

    def cancel(self) -> None:
        self.cancels += 1


class FakePort:
    def __init__(self, responses: FakeResponses | ConchError) -> None:
        self.responses = responses
        self.requests: list[BlsRequest] = []

    def stream(self, request: BlsRequest) -> FakeResponses:
        self.requests.append(request)
        if isinstance(self.responses, ConchError):
            raise self.responses
        return self.responses


def out(k: int, final: bool = False) -> BlsResponse:
    return BlsResponse([("OUT", np.array([k], np.int32))], final=final)


@pytest.fixture()
def port() -> Iterator[list[FakePort]]:
    """Install a port made later by the test (``port.append(FakePort(...))``)."""
    holder: list[FakePort] = []

    class Current:
        def stream(self, request: BlsRequest) -> Any:
            return holder[0].stream(request)

    token = pb.BLS_PORT.set(Current())
    yield holder
    pb.BLS_PORT.reset(token)


def request() -> pb.InferenceRequest:
    return pb.InferenceRequest(
        model_name="m",
        inputs=[pb.Tensor("IN", np.array([3], np.int32))],
        requested_output_names=["OUT"],
    )


def values(responses: pb.ResponseIterator) -> list[Any]:
    got = []
    for r in responses:
        if r.has_error():
            got.append((r.error().code(), r.error().message()))
        elif r.output_tensors():
            got.append(int(pb.get_output_tensor_by_name(r, "OUT").as_numpy()[0]))
        else:
            got.append("empty")
    return got


def test_responses_come_in_order_with_the_empty_final_one_last(port: list[FakePort]) -> None:
    feed = FakeResponses([out(0), out(1), out(2), BlsResponse([], final=True)])
    port.append(FakePort(feed))
    responses = request().exec(decoupled=True)
    assert isinstance(responses, pb.ResponseIterator)
    assert feed.taken == 1  # exec returned once the first response came, as Triton's does
    assert values(responses) == [0, 1, 2, "empty"]
    assert port[0].requests[0].model_name == "m"
    # Triton's iterator starts over once it has ended; the call is not made again.
    assert values(responses) == [0, 1, 2, "empty"]
    assert feed.taken == 4 and feed.cancels == 0


def test_a_final_response_with_outputs_ends_it_without_an_empty_one(
    port: list[FakePort],
) -> None:
    port.append(FakePort(FakeResponses([out(7, final=True)])))
    assert values(request().exec(decoupled=True)) == [7]


def test_the_error_that_ends_a_call_is_its_last_response_as_the_model_sent_it(
    port: list[FakePort],
) -> None:
    feed = FakeResponses([out(1), InvalidArgument("counter refuses"), out(2)])
    port.append(FakePort(feed))
    got = values(request().exec(decoupled=True))
    assert got == [1, (pb.TritonError.INVALID_ARG, "counter refuses")]
    assert feed.cancels == 0  # the stream ended itself


def test_a_refused_call_is_one_error_response_naming_the_model(port: list[FakePort]) -> None:
    port.append(FakePort(NotFound("no such row")))
    got = values(request().exec(decoupled=True))
    assert got == [(pb.TritonError.NOT_FOUND, "BLS request to model 'm' failed: no such row")]


def test_a_port_without_streams_still_answers_a_response() -> None:
    class Old:
        def infer(self, request: Any, decoupled: bool) -> Any:
            return [("OUT", np.ones(1))]

    token = pb.BLS_PORT.set(Old())
    try:
        [resp] = list(request().exec(decoupled=True))
    finally:
        pb.BLS_PORT.reset(token)
    assert resp.error().code() == pb.TritonError.INTERNAL
    assert "model 'm'" in resp.error().message()


def test_no_worker_is_one_error_response() -> None:
    token = pb.BLS_PORT.set(None)
    try:
        [resp] = list(request().exec(decoupled=True))
    finally:
        pb.BLS_PORT.reset(token)
    assert resp.error().code() == pb.TritonError.UNAVAILABLE


def test_cancel_ends_the_call_with_a_cancelled_response(port: list[FakePort]) -> None:
    feed = FakeResponses([out(0), out(1), out(2), BlsResponse([], final=True)])
    port.append(FakePort(feed))
    responses = request().exec(decoupled=True)
    first = next(responses)
    assert not first.has_error()
    responses.cancel()
    responses.cancel()  # once is enough
    assert feed.cancels == 1
    [last] = list(responses)
    assert last.error().code() == pb.TritonError.CANCELLED
    assert list(responses) == [first, last]  # ended: a new pass starts over


def test_an_iterator_dropped_early_cancels_the_call(port: list[FakePort]) -> None:
    feed = FakeResponses([out(0), out(1), out(2), BlsResponse([], final=True)])
    port.append(FakePort(feed))
    for k, _ in enumerate(request().exec(decoupled=True)):
        if k == 1:
            break
    gc.collect()  # CPython drops it at once; other interpreters when they collect
    assert feed.cancels == 1 and feed.taken == 2


def test_an_iterator_read_to_its_end_cancels_nothing(port: list[FakePort]) -> None:
    feed = FakeResponses([out(0), BlsResponse([], final=True)])
    port.append(FakePort(feed))
    responses = request().exec(decoupled=True)
    assert values(responses) == [0, "empty"]
    responses.cancel()
    del responses
    gc.collect()
    assert feed.cancels == 0


def test_async_exec_gives_the_iterator_once_the_first_response_came(
    port: list[FakePort],
) -> None:
    feed = FakeResponses([out(5), BlsResponse([], final=True)], pause=0.2)
    port.append(FakePort(feed))
    seen: dict[str, Any] = {}

    async def main() -> list[Any]:
        responses = await request().async_exec(decoupled=True)
        seen["taken"] = feed.taken
        return values(responses)

    assert asyncio.run(main()) == [5, "empty"]
    assert seen["taken"] == 1


def test_exec_without_decoupled_is_unchanged(port: list[FakePort]) -> None:
    class Plain:
        def infer(self, request: BlsRequest, decoupled: bool) -> Any:
            assert decoupled is False
            return [("OUT", np.array([2.5]))]

    token = pb.BLS_PORT.set(Plain())
    try:
        resp = request().exec()
    finally:
        pb.BLS_PORT.reset(token)
    assert isinstance(resp, pb.InferenceResponse)
    assert pb.get_output_tensor_by_name(resp, "OUT").as_numpy().tolist() == [2.5]
