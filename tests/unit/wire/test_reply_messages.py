"""A reply on the wire: one final response, or one of a decoupled model's many."""

from __future__ import annotations

import msgpack
import pytest

from conch.core.errors import Internal
from conch.wire.messages import BadMessage, Reply


def test_a_plain_reply_is_final_and_carries_no_stream_fields() -> None:
    packed = Reply("r1", outputs=[("Y", "FP32", (1,), b"\0\0\0\0")], version=2).pack()
    assert {"fin", "seq"}.isdisjoint(msgpack.unpackb(packed))
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
