"""Pure logic of batch cutting and Triton's queue policy."""

from __future__ import annotations

import pytest

from conch.core.batch_policy import BatchPolicy
from conch.core.model_config import parse_config
from conch.frontend.admission import admit
from conch.worker.batcher import Sequencer


def cfg(text: str):
    return parse_config(text, model="m", source="test")


@pytest.mark.parametrize(
    ("policy", "rows", "expected"),
    [
        (BatchPolicy(8, 0.0), [1, 1, 1], 3),
        (BatchPolicy(8, 0.0), [4, 4, 1], 2),  # never past max_batch_size
        (BatchPolicy(8, 0.0), [9], 1),  # a lone request is never split
        (BatchPolicy(16, 0.0, (4, 8)), [1] * 6, 4),  # largest preferred size reachable
        (BatchPolicy(16, 0.0, (4, 8)), [1] * 9, 8),
        (BatchPolicy(16, 0.0, (4,)), [3, 3], 2),  # no prefix makes 4: take what fits
        (BatchPolicy(1, 0.0), [1, 1], 1),
    ],
)
def test_cut(policy: BatchPolicy, rows: list[int], expected: int) -> None:
    assert policy.cut(rows) == expected


def test_policy_from_config() -> None:
    p = BatchPolicy.from_config(
        cfg(
            "max_batch_size: 32 dynamic_batching { max_queue_delay_microseconds: 2500 preferred_batch_size: [8, 64, 4] }"
        )
    )
    assert p == BatchPolicy(32, 0.0025, (4, 8))
    assert BatchPolicy.from_config(cfg("max_batch_size: 32")) == BatchPolicy(1, 0.0)
    assert p.ready(32) and p.ready(8) and not p.ready(5)


def test_requests_count_their_batch_dimension_without_a_dynamic_batcher() -> None:
    """A model that batches but names no scheduler runs each request alone, and each
    still counts its batch's rows (Triton's inference_count); one that does not batch
    counts each request as one."""
    alone = BatchPolicy.from_config(cfg("max_batch_size: 8"))
    assert alone.max_batch_size == 1 and alone.batch_dimension
    assert not BatchPolicy.from_config(cfg("max_batch_size: 0")).batch_dimension


def test_admit_priorities_and_policies() -> None:
    c = cfg(
        "max_batch_size: 8 dynamic_batching { priority_levels: 3 default_priority_level: 2 "
        "default_queue_policy { max_queue_size: 5 default_timeout_microseconds: 1000 allow_timeout_override: true } "
        "priority_queue_policy { key: 1 value: { timeout_action: DELAY default_timeout_microseconds: 9000 } } }"
    )
    high = admit(c, 1, None)
    assert high.step == 0 and high.delay_on_timeout and high.queue_timeout_s == pytest.approx(0.009)
    default = admit(c, 0, None)
    assert default.step == 1 and default.max_queue_size == 5 and not default.delay_on_timeout
    assert admit(c, 7, None).step == 1  # past the last level: the default, as Triton does
    assert admit(c, 3, None).step == 2
    # A request may shorten its queue timeout, not lengthen it.
    assert admit(c, 2, 500).queue_timeout_s == pytest.approx(0.0005)
    assert admit(c, 2, 5_000_000).queue_timeout_s == pytest.approx(0.001)
    assert admit(c, 1, 500).queue_timeout_s == pytest.approx(0.009)  # level 1 allows no override


def test_admit_without_dynamic_batching() -> None:
    a = admit(cfg("max_batch_size: 8"), 1, 100)
    assert (a.step, a.max_queue_size, a.queue_timeout_s) == (0, 0, 0.0)


def test_sequencer_releases_in_ticket_order() -> None:
    seq = Sequencer()
    with seq.lock:
        first = seq.issue(3)
    assert first == 0
    seq.finish(2)
    seq.finish(0)
    seq.wait_turn(1)  # 0 is out, 1 is next: no wait
    seq.finish(1)
    with seq.lock:
        assert seq.issue(1) == 3
    seq.wait_turn(3)
