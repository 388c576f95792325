"""The data plane and a decoupled model: refused where one answer is all an endpoint
sends (Triton's words), never bundled, and streamed by ``infer_stream``. The model view
and the dispatcher are stand-ins; the data plane, the repository entry and the message
builder are the real ones."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conch.backends.completion import complete
from conch.core.errors import Internal, Unsupported
from conch.core.inference import InferRequest, InputTensor, RequestedOutput
from conch.core.repository import ModelRepository
from conch.frontend.dataplane import DataPlane
from conch.settings import Settings
from conch.wire.messages import Reply

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "Z" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { }
"""


class Replies:
    """A stand-in ``ResponseStream``: the replies given, in order."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies, self.cancelled = iter(replies), False
        self.msg: Any = None

    def __iter__(self) -> Replies:
        return self

    def __next__(self) -> Reply:
        reply = next(self.replies)
        if reply.error is not None:
            raise reply.error
        return reply

    def cancel(self) -> None:
        self.cancelled = True


class Dispatcher:
    def __init__(self, replies: list[Reply]) -> None:
        self.client = SimpleNamespace(register_script=lambda script: None)
        self.replies = Replies(replies)
        self.streamed: list[Any] = []

    def stream(self, msg: Any, **kw: Any) -> Replies:
        self.streamed.append((msg, kw))
        self.replies.msg = msg
        return self.replies


def plane_for(tmp_path: Path, replies: list[Reply] = ()) -> DataPlane:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "m" / "1" / "model.py").write_text("class TritonPythonModel: pass\n")
    entry = ModelRepository(tmp_path, complete=complete).read_model("m")
    assert entry.error is None, entry.error
    entry.config.model_transaction_policy.decoupled = True  # as the worker side will load it
    view = SimpleNamespace(
        serving=lambda name: entry, check_available=lambda name: None, output_types=lambda e: {}
    )
    return DataPlane(Settings(), view, Dispatcher(list(replies)))  # type: ignore[arg-type]


def req(outputs: list[str] | None = None) -> InferRequest:
    return InferRequest(
        id="rid",
        inputs=[InputTensor("X", "FP32", (1, 1), b"\0\0\0\0")],
        outputs=None if outputs is None else [RequestedOutput(n, True, 0) for n in outputs],
        binary_data_output=True,
        parameters={},
    )


def out(name: str, k: int) -> tuple[str, str, tuple[int, ...], bytes]:
    return (name, "FP32", (1, 1), bytes([k, 0, 0, 0]))


@pytest.mark.parametrize("endpoint", ["HTTP end point", "ModelInfer RPC"])
def test_an_endpoint_that_answers_once_refuses_it_in_tritons_words(tmp_path, endpoint) -> None:
    plane = plane_for(tmp_path)
    with pytest.raises(Unsupported) as err:
        plane.target("m", "", endpoint=endpoint)
    assert err.value.message == (
        f"{endpoint} doesn't support models with decoupled transaction policy"
    )
    assert err.value.status == 501  # Triton's HTTP status for UNSUPPORTED
    to = plane.target("m")  # a stream's call takes it
    with pytest.raises(Unsupported):
        plane.infer(to, req())


def test_it_is_never_bundled(tmp_path) -> None:
    plane = plane_for(tmp_path)
    to = plane.target("m")
    assert plane.settings.bundle_requests and to.entry.config.HasField("dynamic_batching")
    msg = SimpleNamespace(job_ttl=0, priority=0, inputs=req().wire_inputs())
    assert plane._bundling(to.entry.config, msg) is None  # type: ignore[arg-type]
    to.entry.config.model_transaction_policy.decoupled = False
    assert plane._bundling(to.entry.config, msg) is not None


def test_its_responses_stream_as_outcomes(tmp_path) -> None:
    replies = [
        Reply("", outputs=[out("Z", 0), out("Y", 0)], version=1, final=False, seq=0),
        Reply("", outputs=[out("Y", 1)], version=1, final=False, seq=1),  # Z left out
        Reply("", outputs=[], version=1, final=True, seq=2),  # the model only says it is done
    ]
    plane = plane_for(tmp_path, replies)
    stream = plane.infer_stream(plane.target("m"), req(["Y", "Z"]))
    [(msg, kw)] = plane.dispatcher.streamed  # type: ignore[attr-defined]
    assert msg.model == "m" and kw["route"] is None
    got = list(stream)
    assert [o.final for o in got] == [False, False, True]
    assert [[t.name for t in o.outputs] for o in got] == [["Z", "Y"], ["Y"], []]
    assert [[w.name for w in o.request.outputs] for o in got] == [["Y", "Z"], ["Y"], []]
    assert [o.flag_only for o in got] == [False, False, True]
    assert plane.dispatcher.replies.cancelled  # type: ignore[attr-defined]


def test_an_error_ends_the_stream_and_forgets_it(tmp_path) -> None:
    replies = [
        Reply("", outputs=[out("Y", 0)], version=1, final=False, seq=0),
        Reply("", error=Internal("the model failed"), seq=1),
    ]
    plane = plane_for(tmp_path, replies)
    stream = plane.infer_stream(plane.target("m"), req())
    assert next(stream).outputs[0].name == "Y"
    with pytest.raises(Internal, match="the model failed"):
        next(stream)
    assert plane.dispatcher.replies.cancelled  # type: ignore[attr-defined]
