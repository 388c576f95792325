"""A bundle's message read back, and what is refused in one: never more than its bound,
never fewer than one request, never anything but payload maps."""

from __future__ import annotations

import base64

import msgpack
import orjson
import pytest

from conch.wire import broker
from conch.wire.messages import BadMessage

QUEUE = broker.queue_name("m")


def test_a_bundle_reads_back_as_its_payloads_in_order_under_one_tag() -> None:
    raw = broker.bundle_envelope(
        [{"id": "a"}, {"id": "b"}], task_id="t1", queue=QUEUE, priority=3, reply_to="r"
    )
    got = broker.decode(raw)
    assert (got.tag, got.bundle, got.redelivered) == ("t1", True, False)
    assert [p["id"] for p in got.payloads] == ["a", "b"]
    with pytest.raises(BadMessage, match="bundle"):
        got.payload  # noqa: B018 (a bundle where one request is expected)
    one = broker.decode(
        broker.envelope({"id": "c"}, task_id="c", queue=QUEUE, priority=0, reply_to=None)
    )
    assert (one.bundle, one.payload) == (False, {"id": "c"})


def _with_argument(argument: object) -> bytes:
    """A bundle's envelope whose argument is ``argument``, as a peer could write it."""
    msg = orjson.loads(
        broker.bundle_envelope([{}], task_id="t", queue=QUEUE, priority=0, reply_to=None)
    )
    msg["body"] = base64.b64encode(msgpack.packb([[argument], {}, {}])).decode()
    return orjson.dumps(msg)


@pytest.mark.parametrize(
    "argument",
    [[], [{}] * (broker.BUNDLE_MAX_REQUESTS + 1), [{}, 3], {"id": "a"}, "x"],
    ids=["empty", "too-many", "not-a-map", "not-a-list", "a-string"],
)
def test_a_malformed_bundle_is_a_bad_message(argument: object) -> None:
    with pytest.raises(BadMessage):
        broker.decode(_with_argument(argument))


def test_the_largest_bundle_reads_back() -> None:
    got = broker.decode(_with_argument([{}] * broker.BUNDLE_MAX_REQUESTS))
    assert len(got.payloads) == broker.BUNDLE_MAX_REQUESTS
