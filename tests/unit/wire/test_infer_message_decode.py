"""A request's message read back from the broker: each field as msgpack gives it takes
the quick test, and anything else the full check, which refuses what is not ours."""

from __future__ import annotations

import msgpack
import pytest

from conch.wire.messages import BadMessage, InferMessage, WireTensor, read_tensor


def _full() -> InferMessage:
    return InferMessage(
        id="a" * 32,
        model="m",
        version=3,
        inputs=[WireTensor("X", "FP32", (2, 1), b"\0" * 8), WireTensor("S", "BYTES", (), b"")],
        outputs=["Y", "Z"],
        reply_to="conch.reply.g1",
        enqueued=10.5,
        deadline=20.5,
        priority=2,
        params={"p": 1},
        queue_deadline=15.0,
        delay_on_timeout=True,
        delayed=True,
        client_id="c1",
        timeout_us=7,
        priority_level=4,
        chain=["outer"],
        job_ttl=60,
        sequence=(9, True, False),
        watched=True,
        keep_s=30,
        collect=True,
        traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
    )


def _wire(body: dict) -> dict:
    return msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)


def test_every_field_round_trips_through_msgpack() -> None:
    assert InferMessage.from_dict(_wire(_full().to_dict())) == _full()


def test_fields_of_other_accepted_types_are_read_as_before() -> None:
    body = _full().to_dict() | {"enqueued": 10, "deadline": 20, "qd": 15}
    body["inputs"] = [tuple(t) for t in _full().inputs]  # tuples, as to_dict's callers give
    body["outputs"] = ("Y", "Z")
    msg = InferMessage.from_dict(body)
    assert (msg.enqueued, msg.deadline, msg.queue_deadline) == (10.0, 20.0, 15.0)
    assert type(msg.enqueued) is float and msg.outputs == ["Y", "Z"]
    assert msg.inputs == _full().inputs
    assert read_tensor(("X", "FP32", (2, 1), b"\0" * 8)).shape == (2, 1)


@pytest.mark.parametrize(
    "field, value",
    [
        ("id", 5),
        ("model", b"m"),
        ("version", True),
        ("version", "3"),
        ("enqueued", "now"),
        ("enqueued", True),
        ("deadline", None),
        ("priority", 1.0),
        ("qd", "x"),
        ("cid", 1),
        ("tmo", False),
        ("lvl", "1"),
        ("job", 1.5),
        ("keep", -1),
        ("keep", 1.0),
        ("outputs", ["Y", 1]),
        ("outputs", "Y"),
        ("inputs", {"X": 1}),
        ("reply_to", "elsewhere"),
        ("chain", [""]),
        ("seq", [1, True]),
        ("tp", "not-a-traceparent"),
        ("params", [1]),
    ],
)
def test_a_field_of_the_wrong_type_is_a_bad_message(field: str, value: object) -> None:
    body = _wire(_full().to_dict()) | {field: value}
    with pytest.raises(BadMessage):
        InferMessage.from_dict(body)


@pytest.mark.parametrize(
    "shape",
    [[-1], [1, True], [1.0], "12", [1] * 17, None],
)
def test_a_tensor_of_a_bad_shape_is_a_bad_message(shape: object) -> None:
    body = _wire(_full().to_dict())
    body["inputs"][0][2] = shape
    with pytest.raises(BadMessage):
        InferMessage.from_dict(body)


def test_a_missing_field_is_named() -> None:
    body = _wire(_full().to_dict())
    del body["enqueued"]
    with pytest.raises(BadMessage, match="enqueued"):
        InferMessage.from_dict(body)
