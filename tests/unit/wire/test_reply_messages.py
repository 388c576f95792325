"""A reply on the wire: one final response, or one of a decoupled model's many."""

from __future__ import annotations

import msgpack
import pytest

from conch.core.errors import Internal
from conch.wire.messages import MAX_COLLECTED, BadMessage, InferMessage, Reply, reply_packer
from conch.wire.stream_log import HEAD, Position, is_stream_id


def test_a_plain_reply_is_final_and_carries_no_stream_fields() -> None:
    packed = Reply("r1", outputs=[("Y", "FP32", (1,), b"\0\0\0\0")], version=2).pack()
    assert {"fin", "seq", "at"}.isdisjoint(msgpack.unpackb(packed))
    back = Reply.unpack(packed)
    assert back.final and back.seq == 0 and back.version == 2
    assert back.outputs == [("Y", "FP32", (1,), b"\0\0\0\0")]


def test_a_decoupled_models_responses_keep_their_place_and_flag() -> None:
    middle = Reply.unpack(Reply("r1", outputs=[], final=False, seq=3).pack())
    assert (middle.final, middle.seq, middle.outputs) == (False, 3, [])
    last = Reply.unpack(Reply("r1", outputs=[], seq=4).pack())  # an empty final response
    assert (last.final, last.seq, last.outputs) == (True, 4, [])
    failed = Reply.unpack(Reply("r1", error=Internal("boom"), final=False, seq=5).pack())
    assert failed.seq == 5 and isinstance(failed.error, Internal)


def test_a_negative_seq_is_a_bad_message() -> None:
    with pytest.raises(BadMessage):
        Reply.unpack(msgpack.packb({"id": "r1", "t": {}, "out": [], "seq": -1}))


def test_a_reply_keeps_its_run_and_a_bad_run_is_a_bad_message() -> None:
    again = Reply.unpack(Reply("r1", outputs=[], final=False, seq=2, attempt=3).pack())
    assert (again.attempt, again.seq, again.restarted) == (3, 2, False)
    failed = Reply.unpack(Reply("r1", error=Internal("boom"), attempt=2).pack())
    assert failed.attempt == 2
    for bad in (0, -1, 2**31, "2"):
        with pytest.raises(BadMessage):
            Reply.unpack(msgpack.packb({"id": "r1", "t": {}, "out": [], "at": bad}))


def _message(**fields) -> dict:
    msg = InferMessage("a" * 32, "m", 1, [], [], None, 1.0, 0.0, **fields)
    return msg.to_dict()


def test_a_watched_kept_message_round_trips_and_its_keep_is_bounded() -> None:
    plain = _message()
    assert {"w", "keep"}.isdisjoint(plain)
    back = InferMessage.from_dict(_message(watched=True, keep_s=300))
    assert (back.watched, back.keep_s) == (True, 300)
    for bad in (-1, 7 * 24 * 3600 + 1, 1.5):
        body = plain | {"keep": bad}
        with pytest.raises(BadMessage):
            InferMessage.from_dict(body)
    assert InferMessage.from_dict(plain | {"w": 1}).watched is False  # only true is true


def test_a_stream_position_is_parsed_strictly() -> None:
    assert Position.parse("2-15") == Position(2, 15) and str(Position(2, 15)) == "2-15"
    assert Position(1, 0) > HEAD and Position(2, 0) > Position(1, 99)
    for bad in ("", "1", "a-1", "1-1-1", "-1-2", "1-" + "9" * 20, "1 -2"):
        with pytest.raises(ValueError):
            Position.parse(bad)
    assert is_stream_id("0123456789abcdef" * 2)
    assert not is_stream_id("0123456789ABCDEF" * 2) and not is_stream_id("../" + "a" * 29)


def test_a_collected_reply_holds_every_response_and_is_bounded() -> None:
    y = ("Y", "FP32", (1,), b"\0\0\0\0")
    back = Reply.unpack(Reply("r1", responses=[[y], [], [y, y]], version=3).pack())
    assert back.responses == [[y], [], [y, y]] and back.outputs is None
    too_many = {"id": "r1", "t": {}, "rs": [[]] * (MAX_COLLECTED + 1)}
    with pytest.raises(BadMessage):
        Reply.unpack(msgpack.packb(too_many))
    assert InferMessage.from_dict(_message(collect=True)).collect is True


def test_replies_packed_with_one_packer_are_each_packed_whole() -> None:
    packer = reply_packer()
    view = memoryview(b"\0\0\0\0\1\0\0\0").cast("B")[4:]  # a stacked batch's rows
    replies = [
        Reply("r1", outputs=[("Y", "FP32", (1,), view)], timing={"queue": 1}, batch_size=2),
        Reply("r2", error=Internal("boom")),
        Reply("r3", responses=[[("Y", "FP32", (1,), b"\0\0\0\0")], []], final=False, seq=2),
    ]
    for reply in replies:
        assert reply.pack(packer) == reply.pack()
    with pytest.raises(TypeError):
        Reply("r4", outputs=[("Y", "FP32", (1,), object())]).pack(packer)
    assert Reply.unpack(replies[0].pack(packer)).outputs == [("Y", "FP32", (1,), b"\1\0\0\0")]
