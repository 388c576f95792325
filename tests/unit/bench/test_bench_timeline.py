"""bench/timeline.py's merging: each process's stamps become one request's timeline."""

from __future__ import annotations

import pytest

from conch.core.timeline import Stamp

from unit.bench._bench import bench_module

GATEWAY, WORKER, CLIENT = 100, 200, 1


@pytest.fixture(scope="module")
def tl():
    return bench_module("timeline")


def _one_request(tl, start: int, *, step: int = 10) -> tuple[list[Stamp], object]:
    """Every chain point of one request, ``step`` ns apart from ``start``: the gateway's
    points on two greenlets (the reply's route on the listener's), the worker's on one
    thread; with the side points."""
    stamps = []
    at = start
    for point in tl.CHAIN[1:-1]:
        at += step
        pid = WORKER if point.name.startswith("worker.") else GATEWAY
        thread = 2 if point.name in ("reply.popped", "reply.routed") else 1
        stamps.append(Stamp(pid, at, thread, point.name))
    by_name = {s.point: s for s in stamps}
    stamps.append(Stamp(GATEWAY, by_name["publish.sent"].ns + 5, 1, "publish.acked"))
    stamps.append(Stamp(GATEWAY, by_name["worker.woke"].ns + 1, 1, "reply.waiting"))
    stamps.append(Stamp(WORKER, by_name["reply.popped"].ns + 3, 7, "worker.replied"))
    window = tl.Window(start, at + step)
    return stamps, window


def test_each_stamp_goes_to_the_request_whose_window_holds_it(tl) -> None:
    first, w1 = _one_request(tl, 1_000)
    second, w2 = _one_request(tl, 10_000, step=20)
    noise = [Stamp(WORKER, 5_000, 1, "worker.woke")]  # an idle poll between the two
    followed = tl.follow(second + noise + first, [w1, w2], CLIENT)
    assert followed.incomplete == 0
    assert [r["client.send"].ns for r in followed.requests] == [1_000, 10_000]
    assert followed.requests[0]["worker.woke"] in first
    assert followed.requests[1]["worker.woke"] in second


def test_a_point_before_the_one_it_follows_is_passed_over(tl) -> None:
    stamps, window = _one_request(tl, 1_000)
    popped = next(s for s in stamps if s.point == "worker.popped")
    # A timed-out BLPOP stamps worker.woke again after the real wake: the first one at or
    # after the publish is the one taken, the late one ignored.
    early = Stamp(WORKER, 1_001, 1, "worker.woke")  # before the publish was sent
    followed = tl.follow([*stamps, early], [window], CLIENT)
    got = followed.requests[0]
    assert got["worker.woke"].ns > got["publish.sent"].ns
    assert got["worker.popped"] == popped


def test_a_request_missing_a_point_is_left_out_and_counted(tl) -> None:
    stamps, window = _one_request(tl, 1_000)
    whole, w2 = _one_request(tl, 10_000)
    cut = [s for s in stamps if s.point != "reply.routed"]
    followed = tl.follow(cut + whole, [window, w2], CLIENT)
    assert followed.incomplete == 1
    assert len(followed.requests) == 1
    assert followed.requests[0]["client.send"].ns == 10_000


def test_hops_are_consecutive_points_with_their_medians_and_hand_offs(tl) -> None:
    a, w1 = _one_request(tl, 1_000, step=10)
    b, w2 = _one_request(tl, 10_000, step=30)
    c, w3 = _one_request(tl, 20_000, step=20)
    followed = tl.follow(a + b + c, [w1, w2, w3], CLIENT)
    chain = tl.hops(followed)
    assert len(chain) == len(tl.CHAIN) - 1
    assert all(h.median_us == pytest.approx(0.020) for h in chain)
    kinds = {(h.start, h.end): h.handoff for h in chain}
    assert kinds[("client.send", "gateway.read")] == "process"
    assert kinds[("publish.sent", "worker.woke")] == "process"
    assert kinds[("worker.popped", "worker.admitted")] == ""
    assert kinds[("reply.routed", "reply.woke")] == "thread"  # listener → request greenlet
    # The hops add up to the client's round trip exactly.
    assert sum(h.median_us for h in chain) == pytest.approx(tl.round_trip_us(followed))


def test_side_waits_run_from_their_start_to_their_end(tl) -> None:
    stamps, window = _one_request(tl, 1_000)
    followed = tl.follow(stamps, [window], CLIENT)
    side = {(h.start, h.end): h for h in tl.side_waits(followed)}
    assert side[("publish.sent", "publish.acked")].median_us == pytest.approx(0.005)
    assert side[("worker.replying", "worker.replied")].handoff == "thread"
    waiting = side[("reply.waiting", "reply.woke")]
    assert waiting.median_us > 0


def test_the_table_names_every_hop_and_the_floor(tl) -> None:
    stamps, window = _one_request(tl, 1_000)
    followed = tl.follow(stamps, [window], CLIENT)
    text = tl.format_table(tl.hops(followed), tl.side_waits(followed), 0.18, 360.0)
    assert "reply.routed → reply.woke | thread" in text
    assert "sum of the medians" in text and "hops' floor" in text
    assert len(text.splitlines()) == 2 + (len(tl.CHAIN) - 1) + 3 + len(tl.SIDE)
