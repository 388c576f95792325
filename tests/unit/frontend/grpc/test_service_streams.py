"""``ModelStreamInfer``'s hold on a stream: at most as many requests read and not yet
answered on the wire as the service has stream threads. The data plane here is a
stand-in that holds every infer call until released; the service, its lanes and the
call context are the real ones."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from conch.core.errors import Unavailable
from conch.core.restricted_apis import RestrictedApis
from conch.frontend.grpc.call_context import CallContext
from conch.frontend.grpc.protos import triton_messages
from conch.frontend.grpc.service import InferenceService

pb = triton_messages()
WAIT_S = 5.0


class HeldPlane:
    """Answers each infer call (UNAVAILABLE, as a stream error) once ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def target(self, model: str, version: str) -> str:
        return model

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
