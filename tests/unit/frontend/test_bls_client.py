"""BLS on its own: the call chain rule, deadlines, request checks and the wire field.

No Redis here: the client's dispatcher is a fake that records what would be published.
The real path (worker, gateway, tritonclient) is tests/integration/serving/test_bls.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import redis

from conch.backends import BackendRequest, backend_class
from conch.backends.completion import complete
from conch.backends.python import pb_utils as pb
from conch.core import bls_call, call_context, tensors
from conch.core.errors import InvalidArgument, NotFound, Unavailable
from conch.core.model_spec import BlsRequest
from conch.core.repository import ModelRepository
from conch.frontend import bls
from conch.frontend.model_view import ModelView
from conch.settings import ModelControlMode, Settings
from conch.wire import broker
from conch.wire.messages import BadMessage, InferMessage, Reply

# -- the call chain -----------------------------------------------------------------------


def ctx(model: str, *chains: tuple[str, ...], deadline: float = 0.0, priority: int = 0):
    return call_context.CallContext(model, tuple(chains), deadline, priority)


def test_a_call_to_itself_names_the_cycle() -> None:
    err = bls.check_call(ctx("a", ()), "a")
    assert isinstance(err, InvalidArgument)
    assert "BLS call from model 'a' to model 'a' would wait on itself (a -> a)" in err.message


def test_a_call_back_up_the_chain_names_the_cycle() -> None:
    # a called b; b now calls a.
    err = bls.check_call(ctx("b", ("a",)), "a")
    assert err is not None
    assert "from model 'b' to model 'a'" in err.message and "(a -> b -> a)" in err.message
    err = bls.check_call(ctx("c", ("a", "b")), "b")
    assert err is not None and "(b -> c -> b)" in err.message


def test_a_call_down_a_fresh_path_is_allowed() -> None:
    assert bls.check_call(ctx("b", ("a",)), "c") is None
    assert bls.check_call(ctx("a", (), ()), "b") is None


def test_every_request_of_the_batch_waits_on_the_call() -> None:
    # b's batch holds a direct request and one that a called: a call to a must be refused,
    # since a's instance waits on this very execute.
    context = ctx("b", (), ("a",))
    assert context.waiting() == ["a", "b"]
    err = bls.check_call(context, "a")
    assert err is not None and "(a -> b -> a)" in err.message


def test_the_chain_depth_is_bounded() -> None:
    deep = tuple(f"m{i}" for i in range(bls_call.MAX_DEPTH - 2))
    assert bls.check_call(ctx("last", deep), "next") is None  # exactly MAX_DEPTH models
    err = bls.check_call(ctx("last", (*deep, "one_more")), "next")
    assert err is not None
    assert f"call chain of {bls_call.MAX_DEPTH + 1} models" in err.message
    assert f"at most {bls_call.MAX_DEPTH}" in err.message


def test_batch_context_takes_the_smallest_deadline_and_best_priority() -> None:
    reqs = [
        BackendRequest({}, [], deadline=0.0, chain=(), priority=8),
        BackendRequest({}, [], deadline=200.0, chain=("x",), priority=3),
        BackendRequest({}, [], deadline=100.0, chain=("y", "z"), priority=5),
    ]
    c = call_context.batch_context("m", reqs)
    assert c.deadline == 100.0 and c.priority == 3
    assert c.chains == ((), ("x",), ("y", "z"))
    assert c.waiting() == ["x", "y", "z", "m"]
    assert c.longest() == ["y", "z", "m"]
    assert call_context.batch_context("m", [BackendRequest({}, [])]).deadline == 0.0


# -- the wire field -----------------------------------------------------------------------


def _msg(**kw: Any) -> InferMessage:
    base = {
        "id": "i",
        "model": "m",
        "version": 1,
        "inputs": [],
        "outputs": [],
        "reply_to": None,
        "enqueued": 1.0,
        "deadline": 2.0,
    }
    return InferMessage(**{**base, **kw})


def _roundtrip(d: dict) -> InferMessage:
    return InferMessage.from_dict(msgpack.unpackb(msgpack.packb(d), raw=False))


def test_chain_travels_and_is_left_out_when_empty() -> None:
    assert "chain" not in _msg().to_dict()
    assert _roundtrip(_msg().to_dict()).chain == []
    assert _roundtrip(_msg(chain=["a", "b"]).to_dict()).chain == ["a", "b"]


@pytest.mark.parametrize("chain", ["a", [1], [""], ["x" * 256], ["a"] * 257, {"a": 1}])
def test_a_bad_chain_is_a_bad_message(chain: Any) -> None:
    d = _msg().to_dict()
    d["chain"] = chain
    with pytest.raises(BadMessage):
        InferMessage.from_dict(d)


def test_reply_errors_keep_codes_without_a_class() -> None:
    from conch.backends.python.backend import error_from_triton

    err = error_from_triton(pb.TritonError("nope", pb.TritonError.CANCELLED))
    back = Reply.unpack(Reply("r", error=err).pack()).error
    assert back is not None and back.code == "CANCELLED" and back.status == err.status


# -- the client, with a fake dispatcher ----------------------------------------------------

CONFIG = """
backend: "python"
max_batch_size: 4
input [
  {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }},
  {{ name: "T" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "H" data_type: TYPE_BF16 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }},
  {{ name: "TXT" data_type: TYPE_STRING dims: [ 1 ] }}
]
{extra}
"""
MODEL = """
class TritonPythonModel:
    def execute(self, requests):
        return []
"""


def _write(root: Path, name: str, extra: str = "", versions: tuple[int, ...] = (1,)) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(extra=extra)))
    for v in versions:
        (root / name / str(v)).mkdir()
        (root / name / str(v) / "model.py").write_text(MODEL)


class FakeDispatcher:
    def __init__(self, reply: Any = None) -> None:
        self.sent: list[tuple[InferMessage, int]] = []
        self.reply = reply

    def call(self, msg: InferMessage, *, max_queue_size: int = 0, version: int = 0) -> Reply:
        self.sent.append((msg, max_queue_size))
        if isinstance(self.reply, Exception):
            raise self.reply
        if callable(self.reply):
            return self.reply(msg)
        return self.reply or Reply(msg.id, outputs=[])


@pytest.fixture()
def client(tmp_path: Path) -> bls.BlsClient:
    root = tmp_path / "models"
    _write(root, "m", "version_policy: { all { } }", versions=(1, 2))
    _write(
        root,
        "bounded",
        "dynamic_batching { priority_levels: 2 default_priority_level: 2 "
        "default_queue_policy { max_queue_size: 7 } }",
    )
    settings = Settings(model_repository=root, redis_url="redis://unused")
    settings.request_timeout_s = 30.0
    repo = ModelRepository(root, complete=complete)
    c = bls.BlsClient(settings, repo, dispatcher=FakeDispatcher())  # type: ignore[arg-type]
    c.view.states = lambda max_age=1.0: {}  # type: ignore[method-assign]
    return c


def exec_on(
    client: bls.BlsClient, req: pb.InferenceRequest, decoupled: bool = False
) -> pb.InferenceResponse:
    """``req.exec()`` with ``client`` as the BLS port, as the Python backend makes it."""
    token = pb.BLS_PORT.set(client)
    try:
        return req.exec(decoupled)
    finally:
        pb.BLS_PORT.reset(token)


def request(model: str = "m", **kw: Any) -> pb.InferenceRequest:
    kw.setdefault("inputs", [pb.Tensor("X", np.ones((1, 2), np.float32))])
    kw.setdefault("requested_output_names", ["OUT"])
    return pb.InferenceRequest(model_name=model, **kw)


def test_prepare_builds_the_message_the_gateway_would(client: bls.BlsClient) -> None:
    before = time.time()
    caller = ctx("caller", ("outer",), deadline=before + 5, priority=0)
    text = np.array([["héllo".encode()]], dtype=object)
    msg, bound = client.prepare(
        pb.bls_request(
            request(
                inputs=[
                    pb.Tensor("X", np.ones((1, 2), np.float32)),
                    pb.Tensor("T", text),
                    pb.Tensor("H", np.array([[0x3F80]], np.uint16)),
                ],
                requested_output_names=[],
                request_id="rid",
                parameters={"k": "v", "timeout": 5},
            )
        ),
        False,
        caller,
    )
    assert msg.model == "m" and msg.version == -1  # the latest the worker serves
    assert [(n, dt, shape) for n, dt, shape, _ in msg.inputs] == [
        ("X", "FP32", (1, 2)),
        ("T", "BYTES", (1, 1)),
        ("H", "BF16", (1, 1)),
    ]
    assert tensors.to_numpy("BYTES", (1, 1), msg.inputs[1].raw)[0, 0] == "héllo".encode()
    assert msg.outputs == ["OUT", "TXT"]  # none asked for: all of them
    assert msg.chain == ["outer", "caller"]
    assert msg.deadline == before + 5
    assert msg.client_id == "rid" and msg.params == {"k": "v"}
    assert bound == 0 and msg.priority == 0


def test_a_named_version_is_kept(client: bls.BlsClient) -> None:
    msg, _ = client.prepare(pb.bls_request(request(model_version=1)), False, ctx("c", ()))
    assert msg.version == 1


def test_the_timeout_only_shortens_the_inherited_deadline(client: bls.BlsClient) -> None:
    now = time.time()
    caller = ctx("caller", (), deadline=now + 5)
    msg, _ = client.prepare(pb.bls_request(request(timeout=200_000)), False, caller)
    assert msg.deadline == pytest.approx(now + 0.2, abs=0.1)
    assert msg.timeout_us == 200_000
    msg, _ = client.prepare(pb.bls_request(request(timeout=60_000_000)), False, caller)
    assert msg.deadline == now + 5
    # No context (a thread the model started): the default request timeout.
    msg, _ = client.prepare(pb.bls_request(request()), False, None)
    assert msg.deadline == pytest.approx(time.time() + 30, abs=1)
    assert msg.chain == []


def test_a_passed_deadline_answers_at_once(client: bls.BlsClient) -> None:
    with pytest.raises(Unavailable, match="Request timeout expired for model 'm'"):
        client.prepare(
            pb.bls_request(request()), False, ctx("caller", (), deadline=time.time() - 0.01)
        )


def test_queue_policy_and_priority_of_the_target(client: bls.BlsClient) -> None:
    msg, bound = client.prepare(pb.bls_request(request("bounded")), False, ctx("c", ()))
    assert bound == 7 and msg.priority == broker.online_step(2)
    # A batch job's calls (offline work) stay at its priority.
    msg, _ = client.prepare(
        pb.bls_request(request("bounded")), False, ctx("c", (), priority=broker.PRIORITY_OFFLINE)
    )
    assert msg.priority == broker.PRIORITY_OFFLINE


@pytest.mark.parametrize(
    ("req", "decoupled", "error", "text"),
    [
        (request("nope"), False, InvalidArgument, "Request for unknown model: 'nope' is not found"),
        (request("../m"), False, InvalidArgument, "Request for unknown model: '../m'"),
        (
            request(inputs=[pb.Tensor("X", np.ones((1, 2)))]),
            False,
            InvalidArgument,
            "data-type is 'FP64', but model 'm' expects 'FP32'",
        ),
        (request(inputs=[]), False, InvalidArgument, "missing required input(s) ['X']"),
        (
            request(inputs=[pb.Tensor("X", np.ones((1, 3), np.float32))]),
            False,
            InvalidArgument,
            "unexpected shape for input 'X' for model 'm'",
        ),
        (
            request(inputs=[pb.Tensor("Y", np.ones((1, 2), np.float32))]),
            False,
            InvalidArgument,
            "unexpected inference input 'Y' for model 'm'",
        ),
        (
            request(requested_output_names=["NOPE"]),
            False,
            InvalidArgument,
            "unexpected inference output 'NOPE' for model 'm'",
        ),
        (
            request(inputs=[pb.Tensor("X", np.ones((1, 2), np.float32))] * 2),
            False,
            InvalidArgument,
            "already exists in request",
        ),
        (request(inputs=[np.ones(2)]), False, InvalidArgument, "pb_utils.Tensor"),
        (request(model_version=3), False, NotFound, "'m' version 3 is not served"),
        (request(parameters={"k": [1]}), False, InvalidArgument, "parameter 'k'"),
    ],
)
def test_bad_calls_are_refused_before_publishing(
    client: bls.BlsClient, req: pb.InferenceRequest, decoupled: bool, error: type, text: str
) -> None:
    with pytest.raises(error) as info:
        client.prepare(pb.bls_request(req), decoupled, ctx("caller", ()))
    assert text in info.value.message


def test_explicit_model_control_refuses_models_not_loaded(client: bls.BlsClient) -> None:
    client.settings.model_control_mode = ModelControlMode.EXPLICIT
    client.settings.load_models = ["m"]
    client.prepare(pb.bls_request(request("m")), False, None)  # loaded at start (--load-model)
    with pytest.raises(InvalidArgument, match="'bounded' has no available versions"):
        client.prepare(pb.bls_request(request("bounded")), False, None)
    client.view._loaded = {"bounded"}  # loaded through the API since
    client.prepare(pb.bls_request(request("bounded")), False, None)


def test_a_model_given_by_a_load_request_is_found(tmp_path: Path) -> None:
    _write(tmp_path / "elsewhere", "extra")
    repo = ModelRepository(
        tmp_path / "models",
        complete=complete,
        folder_override=lambda name: tmp_path / "elsewhere" / name if name == "extra" else None,
    )
    settings = Settings(model_repository=tmp_path / "models", redis_url="redis://unused")
    c = bls.BlsClient(settings, repo, dispatcher=FakeDispatcher())  # type: ignore[arg-type]
    c.view.states = lambda max_age=1.0: {}  # type: ignore[method-assign]
    msg, _ = c.prepare(pb.bls_request(request("extra")), False, None)
    assert msg.model == "extra"


def test_the_view_reads_a_changed_target_again_and_keeps_its_last_good_read(
    tmp_path: Path,
) -> None:
    root = tmp_path / "models"
    _write(root, "m")
    settings = Settings(model_repository=root, redis_url="redis://unused")
    view = ModelView(
        settings,
        redis.Redis.from_url(settings.redis_url),
        config_max_age_s=0.0,
        complete=complete,
    )
    assert view.serving("m").config.max_batch_size == 4
    config = root / "m" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 4", "max_batch_size: 2"))
    assert view.serving("m").config.max_batch_size == 2
    config.write_text("not a config {")
    assert view.serving("m").config.max_batch_size == 2  # the workers keep serving it too
    shutil.rmtree(root / "m")
    with pytest.raises(InvalidArgument, match="'m' is not found"):
        view.entry("m")


def test_errors_come_back_as_responses_naming_the_model(client: bls.BlsClient) -> None:
    token = call_context.CURRENT.set(ctx("m", ()))
    try:
        resp = exec_on(client, request())
    finally:
        call_context.CURRENT.reset(token)
    assert resp.has_error() and resp.error().code() == pb.TritonError.INVALID_ARG
    assert "(m -> m)" in resp.error().message()
    assert client.dispatcher.sent == []  # type: ignore[attr-defined]

    [resp] = list(exec_on(client, request("nope"), decoupled=True))
    assert resp.error().code() == pb.TritonError.INVALID_ARG
    assert "'nope'" in resp.error().message()

    client.dispatcher.reply = Unavailable("Request timeout expired for model 'm': no reply")  # type: ignore[attr-defined]
    resp = exec_on(client, request())
    assert resp.error().code() == pb.TritonError.UNAVAILABLE
    assert resp.error().message().startswith("Request timeout expired for model 'm'")

    # The callee's own error, which does not say which model it came from.
    client.dispatcher.reply = lambda msg: Reply(msg.id, error=NotFound("no such row"))  # type: ignore[attr-defined]
    resp = exec_on(client, request())
    assert resp.error().code() == pb.TritonError.NOT_FOUND
    assert resp.error().message() == "BLS request to model 'm' failed: no such row"


def test_outputs_come_back_as_numpy(client: bls.BlsClient) -> None:
    def reply(msg: InferMessage) -> Reply:
        out = np.array([[1.5, 2.5]], np.float32)
        txt = np.array([[b"\xffraw"]], dtype=object)
        return Reply(
            msg.id,
            outputs=[
                ("OUT", *(lambda dt, raw: (dt, out.shape, raw))(*tensors.from_numpy(out))),
                ("TXT", *(lambda dt, raw: (dt, txt.shape, raw))(*tensors.from_numpy(txt))),
            ],
        )

    client.dispatcher.reply = reply  # type: ignore[attr-defined]
    resp = exec_on(client, request(requested_output_names=["OUT", "TXT"]))
    assert not resp.has_error(), resp.error()
    out = pb.get_output_tensor_by_name(resp, "OUT").as_numpy()
    np.testing.assert_array_equal(out, [[1.5, 2.5]])
    out[0, 0] = 9  # writable, as a model expects
    txt = pb.get_output_tensor_by_name(resp, "TXT").as_numpy()
    assert txt.dtype == object and txt[0, 0] == b"\xffraw"


def test_is_model_ready_reads_the_registry(client: bls.BlsClient) -> None:
    states = {"m": {"versions": {"1": "READY", "2": "LOADING"}, "reason": None}}
    client.view.states = lambda max_age=1.0: states  # type: ignore[method-assign]
    assert client.is_ready("m", "1") is True
    assert client.is_ready("m", "") is False  # the latest, 2, is still loading
    assert client.is_ready("m", "7") is False
    assert client.is_ready("nope") is False
    states["m"]["versions"]["2"] = "READY"
    assert client.is_ready("m") is True


# -- pb_utils with an installed client ----------------------------------------------------


class SlowClient:
    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.threads: set[str] = set()

    def infer(self, request: BlsRequest, decoupled: bool) -> list[tuple[str, np.ndarray]]:
        self.seen.append(call_context.CURRENT.get())
        self.threads.add(threading.current_thread().name)
        time.sleep(0.3)
        return [("OUT", np.ones(1))]

    def is_ready(self, name: str, version: str) -> bool:
        return name == "up"


@pytest.fixture()
def installed() -> Any:
    """A port made current as the Python backend does around a model's methods."""
    fake = SlowClient()
    token = pb.BLS_PORT.set(fake)
    yield fake
    pb.BLS_PORT.reset(token)


def test_async_exec_calls_overlap_and_keep_the_callers_context(installed: SlowClient) -> None:
    context = ctx("caller", ("outer",), deadline=time.time() + 9)

    async def main() -> float:
        start = time.monotonic()
        responses = await asyncio.gather(
            pb.InferenceRequest(model_name="a").async_exec(),
            pb.InferenceRequest(model_name="b").async_exec(),
            pb.InferenceRequest(model_name="c").async_exec(),
        )
        assert all(not r.has_error() for r in responses)
        return time.monotonic() - start

    token = call_context.CURRENT.set(context)
    try:
        elapsed = asyncio.run(main())
    finally:
        call_context.CURRENT.reset(token)
    assert elapsed < 0.55, elapsed
    assert installed.seen == [context] * 3
    assert all(name.startswith("conch-bls") for name in installed.threads)
    assert pb.is_model_ready("up") and not pb.is_model_ready("down")


def test_a_client_that_raises_still_answers_a_response() -> None:
    class Broken:
        def infer(self, request: Any, decoupled: bool) -> Any:
            raise RuntimeError("boom")

    token = pb.BLS_PORT.set(Broken())
    try:
        resp = pb.InferenceRequest(model_name="x").exec()
    finally:
        pb.BLS_PORT.reset(token)
    assert resp.has_error() and resp.error().code() == pb.TritonError.INTERNAL
    assert "model 'x'" in resp.error().message() and "boom" in resp.error().message()


CONTEXT_MODEL = """
import asyncio
import shutil
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.InferenceRequest(model_name="from_init").exec()

    {kind}def execute(self, requests):
        call = pb_utils.InferenceRequest(model_name="inner")
        {wait}
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones((1, 2), np.float32))])
            for _ in requests
        ]
"""


@pytest.mark.parametrize(
    ("kind", "wait"), [("", "call.exec()"), ("async ", "await call.async_exec()")]
)
def test_the_python_backend_hands_its_batch_context_to_bls_calls(
    tmp_path: Path, kind: str, wait: str
) -> None:
    installed = SlowClient()  # the port the worker puts on the spec (ModelSpec.bls)
    root = tmp_path / "models"
    (root / "ctx" / "1").mkdir(parents=True)
    (root / "ctx" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    )
    (root / "ctx" / "1" / "model.py").write_text(CONTEXT_MODEL.format(kind=kind, wait=wait))
    entry = ModelRepository(root, complete=complete).read_model("ctx")
    assert entry.error is None, entry.error
    spec = dataclasses.replace(entry.spec(1), bls=installed)
    backend = backend_class("python")(spec, entry.instances()[0])
    backend.load()
    try:
        x = np.ones((1, 2), np.float32)
        results = backend.execute(
            [
                BackendRequest({"X": x}, ["OUT"], deadline=50.0, chain=("a",)),
                BackendRequest({"X": x}, ["OUT"], deadline=40.0, priority=2),
            ]
        )
    finally:
        backend.unload()
    assert all(isinstance(r, dict) for r in results), results
    from_init, from_execute = installed.seen
    assert from_init == call_context.CallContext("ctx")
    assert from_execute == call_context.CallContext("ctx", (("a",), ()), 40.0, 0)
    assert call_context.CURRENT.get() is None  # reset after execute
    assert pb._current_port() is None  # the port too, once the instance unloaded


THREAD_MODEL = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        def call():  # a thread the model starts itself, with no context of its own
            out.append(pb_utils.InferenceRequest(model_name="inner").exec())
        worker = threading.Thread(target=call)
        worker.start()
        worker.join()
        self.error = out[0].error().message() if out[0].has_error() else None
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones((1, 2), np.float32))])
            for _ in requests
        ]
"""


def test_a_thread_the_model_starts_reaches_the_workers_port_as_in_triton(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "thr" / "1").mkdir(parents=True)
    (root / "thr" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    )
    (root / "thr" / "1" / "model.py").write_text(THREAD_MODEL)
    entry = ModelRepository(root, complete=complete).read_model("thr")
    assert entry.error is None, entry.error
    port = SlowClient()
    backend = backend_class("python")(
        dataclasses.replace(entry.spec(1), bls=port), entry.instances()[0]
    )
    backend.load()
    try:
        [result] = backend.execute([BackendRequest({"X": np.ones((1, 2), np.float32)}, ["OUT"])])
        assert isinstance(result, dict), result
        assert backend.model.error is None
        assert port.seen == [None]  # reached, with no batch context to inherit
    finally:
        backend.unload()
    # Unloaded: a context-less call has no port to fall back on any more.
    resp = pb.InferenceRequest(model_name="inner").exec()
    assert resp.has_error() and "needs a conch worker" in resp.error().message()


FINALIZE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answer = pb_utils.InferenceRequest(model_name="inner").exec()
        assert answer.has_error(), "no port was handed: the call must fail"
        self.error = answer.error().message()
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones((1, 2), np.float32))])
            for _ in requests
        ]

    def finalize(self):
        pb_utils.InferenceRequest(model_name="from_finalize").exec()
"""


def test_only_the_port_on_the_spec_is_seen_and_finalize_sees_it_too(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "fin" / "1").mkdir(parents=True)
    (root / "fin" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    )
    (root / "fin" / "1" / "model.py").write_text(FINALIZE_MODEL)
    entry = ModelRepository(root, complete=complete).read_model("fin")
    assert entry.error is None, entry.error
    x = np.ones((1, 2), np.float32)

    portless = backend_class("python")(entry.spec(1), entry.instances()[0])
    portless.load()
    try:
        [result] = portless.execute([BackendRequest({"X": x}, ["OUT"])])
        assert isinstance(result, dict), result
        assert "needs a conch worker" in portless.model.error
    finally:
        portless.unload()

    port = SlowClient()
    spec = dataclasses.replace(entry.spec(1), bls=port)
    backend = backend_class("python")(spec, entry.instances()[0])
    backend.load()
    backend.unload()
    assert port.seen == [call_context.CallContext("fin")]
