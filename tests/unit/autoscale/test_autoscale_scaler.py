"""The autoscaler's decision: the shared formula, up at once, down only after the cooldown."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.autoscale.scaler import ScalePolicy, Scaler
from conch.settings import Settings, WorkerRange


def _scaler(minimum: int = 1, maximum: int = 4, *, target: float = 2, **kw: float) -> Scaler:
    return Scaler(ScalePolicy(minimum, maximum, target, **kw))


def _run(scaler: Scaler, timeline: list[tuple[float, int]]) -> list[int]:
    """The decision at each (time, owed) poll."""
    return [scaler.decide(owed, t) for t, owed in timeline]


def test_the_first_decision_is_the_formula_and_never_below_min() -> None:
    assert _scaler().decide(0, 0.0) == 1
    assert _scaler(minimum=0).decide(0, 0.0) == 0
    assert _scaler(minimum=2).decide(0, 0.0) == 2


def test_scale_up_is_immediate_and_capped_at_max() -> None:
    s = _scaler(cooldown_s=10)
    assert _run(s, [(0, 0), (1, 3), (2, 7), (3, 100)]) == [1, 2, 4, 4]


def test_scale_down_waits_for_the_cooldown_after_the_last_poll_that_wanted_more() -> None:
    s = _scaler(cooldown_s=10)
    # 4 wanted at t=0 and t=5 (the second restarts the clock), then nothing owed.
    got = _run(s, [(0, 8), (5, 8), (6, 0), (14.9, 0), (15.0, 0), (16, 0)])
    assert got == [4, 4, 4, 4, 1, 1]


def test_down_in_steps_to_the_most_wanted_within_the_window() -> None:
    s = _scaler(cooldown_s=10)
    # 4 at t=0, 3 at t=4, 2 at t=8, then idle: down to 3 at t=10, 2 at 14, 1 at 18.
    got = _run(s, [(0, 8), (4, 6), (8, 4), (9, 0), (10, 0), (13.9, 0), (14, 0), (18, 0)])
    assert got == [4, 4, 4, 4, 3, 3, 2, 1]


def test_a_burst_inside_the_cooldown_holds_the_count() -> None:
    s = _scaler(cooldown_s=10)
    got = _run(s, [(0, 8), (9, 0), (9.5, 8), (15, 0), (19.4, 0), (19.5, 0)])
    assert got == [4, 4, 4, 4, 4, 1]


def test_to_zero_after_the_cooldown_and_activation_keeps_small_work_at_zero() -> None:
    s = _scaler(minimum=0, cooldown_s=5, activation=2)
    got = _run(s, [(0, 0), (1, 2), (2, 3), (3, 0), (6.9, 0), (7, 0)])
    assert got == [0, 0, 2, 2, 2, 0]
    # Activation works both ways, as KEDA's: at or under it the group goes to zero.
    s = _scaler(minimum=0, cooldown_s=0, activation=2)
    assert _run(s, [(0, 3), (1, 2), (2, 0)]) == [2, 0, 0]


def test_no_cooldown_follows_the_formula() -> None:
    s = _scaler(cooldown_s=0)
    assert _run(s, [(0, 8), (1, 0), (2, 5), (3, 1)]) == [4, 1, 3, 1]


def test_policy_from_settings(tmp_path: Path) -> None:
    s = Settings(
        model_repository=tmp_path,
        workers=WorkerRange(0, 3),
        target_work_per_worker=2.5,
        activation_work=4,
        scale_down_cooldown_secs=7,
    )
    assert ScalePolicy.from_settings(s) == ScalePolicy(0, 3, 2.5, 4, 7)
    with pytest.raises(ValueError, match="--workers"):
        ScalePolicy.from_settings(Settings(model_repository=tmp_path))


@pytest.mark.parametrize(
    ("text", "want"),
    [("1:4", WorkerRange(1, 4)), ("0:2", WorkerRange(0, 2)), ("3", WorkerRange(3, 3))],
)
def test_worker_range_parses_min_max(text: str, want: WorkerRange) -> None:
    assert WorkerRange.parse(text) == want
    assert WorkerRange.parse(str(want)) == want


@pytest.mark.parametrize("text", ["", "a:b", "2:1", "-1:2", "0:0", "1:2:3", "0"])
def test_worker_range_refuses_what_cannot_run(text: str) -> None:
    with pytest.raises(ValueError, match="--workers"):
        WorkerRange.parse(text)
