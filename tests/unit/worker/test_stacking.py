"""The runner's stacked path (``conch.worker.stacking``) answers as the per-request path
does: the same outputs, errors, batch sizes and statistics, and it steps aside for
batches it cannot stack."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conch.backends import Backend, BackendRequest, BackendResult, TensorBackend
from conch.core.errors import InvalidArgument
from conch.core.model_config import parse_config
from conch.core.model_spec import InstanceSpec, ModelSpec
from conch.wire import statistics
from conch.wire.messages import InferMessage, Reply, WireTensor
from conch.worker import stacking
from conch.worker.admission import Item
from conch.worker.loop_parts import QueueParts
from conch.worker.runner import Runner

CONFIG = (
    "max_batch_size: 16 dynamic_batching { }\n"
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },\n'
    '         { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
)


class Affine(TensorBackend):
    """Y = 2X + 1, and N: each row's length as int64 (the config says INT32)."""

    executes = 0  # batches that came through the per-request path
    fail: Exception | None = None
    leave_out: str = ""

    def load(self) -> None:
        pass

    def execute(self, requests):
        self.executes += 1
        return super().execute(requests)

    def run(self, inputs, outputs):
        if self.fail is not None:
            raise self.fail
        x = inputs["X"]
        out = {"Y": x * 2 + 1, "N": np.full((x.shape[0], 1), x.shape[1], dtype=np.int64)}
        return {k: v for k, v in out.items() if k != self.leave_out}


class PerRequest(Backend):
    """The same model behind the per-request path (``TensorBackend.execute``)."""

    def __init__(self, inner: TensorBackend) -> None:
        super().__init__(inner.spec, inner.instance)
        self.inner = inner

    def load(self) -> None:
        pass

    def execute(self, requests: list[BackendRequest]) -> list[BackendResult]:
        return self.inner.execute(requests)


def backend(config: str = CONFIG, cls: type[TensorBackend] = Affine) -> TensorBackend:
    spec = ModelSpec("m", 1, Path("/nonexistent"), parse_config(config, model="m", source="t"))
    return cls(spec, InstanceSpec("m_0", "CPU"))


def runner(b: Backend) -> Runner:
    nothing = SimpleNamespace()
    parts = QueueParts(
        client=nothing,
        model="m",
        backends={1: b},
        name="test",
        drain=nothing,
        sink=SimpleNamespace(client=None),
        link=nothing,
        inflight=nothing,
        stopping=nothing,
    )
    return Runner(parts, prefetched=lambda _popped: None)


def item(k: int, *inputs: WireTensor, outputs=("Y", "N")) -> Item:
    now = time.time()
    msg = InferMessage(
        id=f"r{k}",
        model="m",
        version=-1,
        inputs=list(inputs),
        outputs=list(outputs),
        reply_to=None,
        enqueued=now,
        deadline=now + 60,
    )
    rows = inputs[0].shape[0] if inputs and inputs[0].shape else 1
    return Item(f"t{k}", msg, rows, 1)


def fp32(k: int, rows: int, width: int = 3) -> WireTensor:
    arr = np.arange(rows * width, dtype=np.float32).reshape(rows, width) + 100 * k
    return WireTensor("X", "FP32", arr.shape, arr.tobytes())


def both(b: TensorBackend, batch: list[Item]):
    """The batch's result through the stacked path, then through the per-request path."""
    stacked = runner(b).run(batch)
    assert b.executes == 0
    return stacked, runner(PerRequest(b)).run(batch)


def same_replies(a: dict[str, Reply], b: dict[str, Reply]) -> None:
    assert a.keys() == b.keys()
    for tag in a:
        x, y = a[tag], b[tag]
        assert (x.error is None) == (y.error is None), tag
        if x.error is not None:
            assert (type(x.error), x.error.message) == (type(y.error), y.error.message)
            continue
        assert [(n, dt, tuple(s), bytes(raw)) for n, dt, s, raw in x.outputs] == [
            (n, dt, tuple(s), bytes(raw)) for n, dt, s, raw in y.outputs
        ]
        assert (x.batch_size, x.version) == (y.batch_size, y.version)


def test_requests_of_different_rows_answer_as_the_per_request_path():
    b = backend()
    batch = [item(0, fp32(0, 1)), item(1, fp32(1, 3)), item(2, fp32(2, 2), outputs=("N",))]
    stacked, each = both(b, batch)
    same_replies(stacked.replies, each.replies)
    first = stacked.replies["t1"].outputs
    assert [(n, dt, s) for n, dt, s, _ in first] == [("Y", "FP32", (3, 3)), ("N", "INT32", (3, 1))]
    expected = np.arange(9, dtype=np.float32).reshape(3, 3) + 100
    assert bytes(first[0].raw) == (expected * 2 + 1).tobytes()
    assert stacked.replies["t0"].batch_size == 6
    run = stacked.runs[0]
    assert (run.batch_size, run.success, run.rows) == (6, 3, 6)
    assert min(run.input_ns, run.infer_ns, run.output_ns) >= 0


def test_empty_requests_stack_and_split_as_the_per_request_path():
    """Requests of no elements (a 0 in their shape, as L0_infer_zero sends) stack into one
    empty array and each gets its own empty rows back."""
    b = backend()
    batch = [item(0, fp32(0, 1, width=0)), item(1, fp32(1, 2, width=0))]
    stacked, each = both(b, batch)
    same_replies(stacked.replies, each.replies)
    assert [(n, dt, s, bytes(raw)) for n, dt, s, raw in stacked.replies["t1"].outputs] == [
        ("Y", "FP32", (2, 0), b""),
        ("N", "INT32", (2, 1), b"\0" * 8),
    ]


def test_a_bad_input_in_the_middle_is_answered_alone():
    b = backend()
    short = WireTensor("X", "FP32", (2, 3), b"\0" * 20)
    batch = [item(0, fp32(0, 2)), item(1, short), item(2, fp32(2, 1))]
    stacked, each = both(b, batch)
    same_replies(stacked.replies, each.replies)
    assert isinstance(stacked.replies["t1"].error, InvalidArgument)
    assert stacked.replies["t0"].error is None and stacked.replies["t2"].error is None
    assert stacked.replies["t0"].batch_size == 3
    run = stacked.runs[0]
    assert (run.success, run.failures) == (2, {statistics.OTHER: 1})


def test_a_failing_model_or_a_missing_output_answers_every_request_alike():
    for setting in (
        {"fail": RuntimeError("boom")},
        {"fail": InvalidArgument("no")},
        {"leave_out": "N"},
    ):
        b = backend()
        for attr, value in setting.items():
            setattr(b, attr, value)
        stacked, each = both(b, [item(0, fp32(0, 1)), item(1, fp32(1, 2))])
        same_replies(stacked.replies, each.replies)
        assert all(r.error is not None for r in stacked.replies.values())


@pytest.mark.parametrize(
    "batch",
    [
        # BYTES: its rows have no fixed size
        [item(0, WireTensor("X", "BYTES", (1, 1), b"\x01\0\0\0a")), item(1, fp32(1, 1))],
        # inner shapes that differ: grouped by TensorBackend.execute
        [item(0, fp32(0, 1, width=3)), item(1, fp32(1, 1, width=4))],
    ],
)
def test_what_cannot_be_stacked_takes_the_per_request_path(batch):
    assert stacking.stack(batch) is None
    b = backend()
    result = runner(b).run(batch)
    assert b.executes == 1
    assert set(result.replies) == {"t0", "t1"}


def test_a_model_without_batching_takes_the_per_request_path():
    b = backend(CONFIG.replace("max_batch_size: 16 dynamic_batching { }", "max_batch_size: 0"))
    result = runner(b).run([item(0, WireTensor("X", "FP32", (3,), b"\0" * 12))])
    assert b.executes == 1
    assert "t0" in result.replies


def test_split_cuts_each_output_by_rows_once():
    batch = [item(0, fp32(0, 2)), item(1, fp32(1, 1))]
    stack = stacking.stack(batch)
    assert stack is not None and stack.rows == [2, 1] and stack.inputs["X"].shape == (3, 3)
    words = np.array([[b"ab"], [b"c"], [b""]], dtype=object)
    parts = stacking.split({"Y": words, "N": np.zeros((2, 1))}, stack, {"N": "INT32"})
    assert [(dt, s, bytes(raw)) for _, dt, s, raw in parts["Y"]] == [
        ("BYTES", (2, 1), b"\2\0\0\0ab\1\0\0\0c"),
        ("BYTES", (1, 1), b"\0\0\0\0"),
    ]
    assert isinstance(parts["N"], InvalidArgument)  # float -> INT32 is refused, and 2 rows of 3


# -- request_inputs: a per-request backend's arrays, read as a batch ----------------------


def test_each_requests_inputs_are_writable_views_of_one_buffer_in_its_order() -> None:
    words = WireTensor("S", "BYTES", (2,), b"\2\0\0\0hi\1\0\0\0x")
    batch = [item(0, words, fp32(0, 2)), item(1, fp32(1, 1), words), item(2, fp32(2, 0))]
    got = stacking.request_inputs(batch)
    assert [list(arrays) for arrays in got] == [["S", "X"], ["X", "S"], ["X"]]
    for k, arrays in enumerate(got):
        x = arrays["X"]
        expected = np.frombuffer(batch[k].msg.inputs[0 if k else 1].raw, np.float32)
        assert x.flags.writeable and x.dtype == np.float32
        np.testing.assert_array_equal(x.reshape(-1), expected)
    assert got[0]["X"].base is got[1]["X"].base  # one buffer for the batch's X
    assert got[2]["X"].shape == (0, 3)  # an empty tensor is an empty view
    assert got[0]["S"].tolist() == [b"hi", b"x"]
    got[0]["X"][:] = -1  # a model that writes its input touches only its own
    np.testing.assert_array_equal(got[1]["X"], np.arange(3, dtype=np.float32)[None] + 100)


def test_a_request_whose_bytes_do_not_fit_gets_its_error_and_the_others_their_arrays() -> None:
    short = WireTensor("X", "FP32", (2, 3), b"\0" * 20)
    got = stacking.request_inputs([item(0, fp32(0, 1)), item(1, short), item(2, fp32(2, 1))])
    assert isinstance(got[1], InvalidArgument) and "expected 24 bytes" in got[1].message
    assert got[0]["X"][0, 0] == 0 and got[2]["X"][0, 0] == 200


def test_inputs_of_other_datatypes_keep_their_own_buffers() -> None:
    half = WireTensor("X", "BF16", (1, 2), np.array([[1, 2]], np.uint16).tobytes())
    got = stacking.request_inputs([item(0, fp32(0, 1)), item(1, half)])
    assert got[0]["X"].dtype == np.float32
    assert got[1]["X"].dtype == np.uint16 and got[1]["X"].tolist() == [[1, 2]]
