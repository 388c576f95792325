"""``ModelStreamInfer``'s hold on a stream: at most as many requests read and not yet
answered on the wire as the service has stream threads, a decoupled model's many
responses each sent as it comes, with Triton's final flag. The data planes here are
stand-ins that hold every infer call until released, or stream what a test gives; the
service, its lanes and the call context are the real ones."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any

from conch.core.errors import Internal, Unavailable
from conch.core.inference import InferRequest, OutputTensor
from conch.core.restricted_apis import RestrictedApis
from conch.frontend.dataplane import InferOutcome
from conch.frontend.grpc.call_context import CallContext
from conch.frontend.grpc.protos import triton_messages
from conch.frontend.grpc.service import InferenceService

pb = triton_messages()
WAIT_S = 5.0


class HeldPlane:
    """Answers each infer call (UNAVAILABLE, as a stream error) once ``release`` is set."""

    shared_memory = None  # no regions: the codec refuses them

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def target(self, model: str, version: str) -> Any:
        return SimpleNamespace(name=model, decoupled=False)

    def infer(self, to: str, request: Any, **_: Any) -> Any:
        self.calls += 1
        self.release.wait(WAIT_S)
        raise Unavailable("released")


def test_a_stream_reads_no_more_than_it_can_answer() -> None:
    plane = HeldPlane()
    service = InferenceService(plane, RestrictedApis(), 2, None)  # type: ignore[arg-type]
    pulled: list[int] = []

    def requests() -> Iterator[Any]:
        for n in range(10):
            pulled.append(n)
            yield pb.ModelInferRequest(model_name="m", id=str(n))

    answers = service.ModelStreamInfer(requests(), CallContext([], None, frozenset()))
    first: list[Any] = []
    taker = threading.Thread(target=lambda: first.append(next(answers)), daemon=True)
    taker.start()
    taker.join(0.5)  # the stream is under way, and held
    assert len(pulled) == 2 and plane.calls == 2
    plane.release.set()
    taker.join(WAIT_S)
    rest = list(answers)
    ids = sorted(int(a.infer_response.id) for a in [*first, *rest])
    assert ids == list(range(10))
    assert all(a.error_message == "released" for a in [*first, *rest])


# -- decoupled models ------------------------------------------------------------------------


def outcome(request: InferRequest, k: int, *, final: bool = False, empty: bool = False) -> Any:
    outputs = [] if empty else [OutputTensor("Y", "INT32", (1,), k.to_bytes(4, "little"))]
    return InferOutcome("m", 1, request, outputs, None, False, final)


class Responses:
    """What ``infer_stream`` returns: the outcomes given, then what ``end`` raises."""

    def __init__(self, outcomes: Iterable[Any], end: Exception | None = None) -> None:
        self.outcomes, self.end, self.closed = iter(outcomes), end, False

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.outcomes)
        except StopIteration:
            if self.end is not None:
                raise self.end from None
            raise

    def close(self) -> None:
        self.closed = True


class StreamingPlane:
    """A decoupled model: each request's responses are ``script(request)``."""

    shared_memory = None  # no regions: the codec refuses them

    def __init__(self, script: Any) -> None:
        self.script = script
        self.streams: list[Responses] = []
        self.calls = 0

    def target(self, model: str, version: str) -> Any:
        return SimpleNamespace(name=model, decoupled=True)

    def infer_stream(self, to: Any, request: InferRequest, **_: Any) -> Responses:
        self.calls += 1
        stream = self.script(request)
        self.streams.append(stream)
        return stream


def _stream(plane: Any, requests: Iterable[Any], threads: int = 4) -> Iterator[Any]:
    service = InferenceService(plane, RestrictedApis(), threads, None)  # type: ignore[arg-type]
    return service.ModelStreamInfer(iter(requests), CallContext([], None, frozenset()))


def _final(answer: Any) -> bool | None:
    params = answer.infer_response.parameters
    return params["triton_final_response"].bool_param if "triton_final_response" in params else None


def _empty_final_request(id: str, on: bool) -> Any:
    request = pb.ModelInferRequest(model_name="m", id=id)
    request.parameters["triton_enable_empty_final_response"].bool_param = on
    return request


def test_each_response_goes_as_it_comes_with_the_final_flag() -> None:
    plane = StreamingPlane(
        lambda r: Responses([outcome(r, 0), outcome(r, 1), outcome(r, 2, final=True)])
    )
    answers = list(_stream(plane, [pb.ModelInferRequest(model_name="m", id="a")]))
    assert [a.infer_response.id for a in answers] == ["a", "a", "a"]
    assert [_final(a) for a in answers] == [False, False, True]
    assert [a.infer_response.raw_output_contents[0][0] for a in answers] == [0, 1, 2]
    assert all(s.closed for s in plane.streams)


def test_an_empty_final_response_is_sent_only_when_asked() -> None:
    plane = StreamingPlane(
        lambda r: Responses([outcome(r, 0), outcome(r, 1, final=True, empty=True)])
    )
    answers = list(_stream(plane, [_empty_final_request("quiet", False)]))
    assert [_final(a) for a in answers] == [False]  # the flag alone is not a response
    answers = list(_stream(plane, [_empty_final_request("asked", True)]))
    assert [_final(a) for a in answers] == [False, True]
    empty = answers[1].infer_response
    assert (empty.id, empty.model_name, list(empty.outputs)) == ("asked", "m", [])
    assert answers[1].error_message == ""


def test_a_request_with_no_response_still_ends() -> None:
    """A decoupled model may answer a request with nothing but its final flag: no
    answer goes on the wire, and the stream still ends (its room is given back)."""
    plane = StreamingPlane(lambda r: Responses([outcome(r, 0, final=True, empty=True)]))
    requests = [pb.ModelInferRequest(model_name="m", id=str(n)) for n in range(5)]
    assert list(_stream(plane, requests, threads=1)) == []
    assert plane.calls == 5


def test_an_error_mid_stream_is_a_final_answer_with_the_requests_id() -> None:
    plane = StreamingPlane(lambda r: Responses([outcome(r, 0)], Internal("the model failed")))
    answers = list(_stream(plane, [pb.ModelInferRequest(model_name="m", id="e")]))
    assert [(a.infer_response.id, a.error_message, _final(a)) for a in answers] == [
        ("e", "", False),
        ("e", "the model failed", True),
    ]


def test_a_stream_of_many_responses_per_request_reads_no_more_than_it_can_answer() -> None:
    """Two stream threads: two requests are read while each sends responses and holds
    its final one; the third is read only once one of them has ended on the wire."""
    release = threading.Event()

    def script(r: InferRequest) -> Responses:
        def outcomes() -> Iterator[Any]:
            yield outcome(r, 0)
            yield outcome(r, 1)
            release.wait(WAIT_S)
            yield outcome(r, 2, final=True)

        return Responses(outcomes())

    plane = StreamingPlane(script)
    pulled: list[int] = []

    def requests() -> Iterator[Any]:
        for n in range(6):
            pulled.append(n)
            yield pb.ModelInferRequest(model_name="m", id=str(n))

    answers = _stream(plane, requests(), threads=2)
    early = [next(answers) for _ in range(4)]  # two requests' first two responses each
    assert sorted(a.infer_response.id for a in early) == ["0", "0", "1", "1"]
    assert len(pulled) == 2 and plane.calls == 2
    release.set()
    rest = list(answers)
    got = [*early, *rest]
    assert len(got) == 18
    by_id: dict[str, list[bool | None]] = {}
    for a in got:
        by_id.setdefault(a.infer_response.id, []).append(_final(a))
    assert by_id == {str(n): [False, False, True] for n in range(6)}


def test_a_model_that_is_not_decoupled_answers_once_and_final() -> None:
    class OncePlane:
        shared_memory = None

        def target(self, model: str, version: str) -> Any:
            return SimpleNamespace(name=model, decoupled=False)

        def infer(self, to: Any, request: InferRequest, **_: Any) -> Any:
            return outcome(request, 7, final=True)

    answers = list(_stream(OncePlane(), [pb.ModelInferRequest(model_name="m", id="x")]))
    assert [(a.infer_response.id, _final(a)) for a in answers] == [("x", True)]
