"""The scaling formula and the KEDA URL of the work-owed signal (``conch.wire.work_owed``)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from conch.wire.broker import PRIORITY_ASYNC, PRIORITY_OFFLINE, PRIORITY_STEPS
from conch.wire.work_owed import (
    JOBS_PARAM,
    QUEUE_DEPTH_PATH,
    JobsWork,
    ModelWork,
    desired_workers,
    queue_depth_url,
    summary,
)


@pytest.mark.parametrize(
    ("owed", "target", "minimum", "maximum", "activation", "want"),
    [
        (0, 5, 0, 10, 0, 0),  # idle group at zero
        (1, 5, 0, 10, 0, 1),  # any work wakes one
        (5, 5, 0, 10, 0, 1),
        (6, 5, 0, 10, 0, 2),  # ceil(6 / 5)
        (100, 5, 0, 10, 0, 10),  # capped at the maximum
        (3, 5, 0, 10, 3, 0),  # at the activation threshold: still zero
        (4, 5, 0, 10, 3, 1),  # past it: at least one
        (0, 5, 2, 10, 0, 2),  # never below the minimum
        (3, 5, 2, 10, 5, 2),  # activation means nothing with a minimum
        (3, 0.3, 0, 100, 0, 10),  # the target as written: 3 / 0.3 is 10, not 11
        (3, 0.1, 0, 100, 0, 30),
        (7, 2.5, 1, 100, 0, 3),
        (1, 5, 0, 0, 0, 0),  # a group held at zero
    ],
)
def test_desired_workers_is_ceil_of_owed_over_target_within_bounds(
    owed: int, target: float, minimum: int, maximum: int, activation: int, want: int
) -> None:
    assert desired_workers(owed, target, minimum, maximum, activation) == want


@pytest.mark.parametrize(
    ("target", "minimum", "maximum"), [(0, 0, 1), (-1, 0, 1), (1, 2, 1), (1, -1, 1)]
)
def test_desired_workers_refuses_a_target_or_bounds_that_mean_nothing(
    target: float, minimum: int, maximum: int
) -> None:
    with pytest.raises(ValueError):
        desired_workers(1, target, minimum, maximum)


def test_queue_depth_url_names_every_model_encoded() -> None:
    url = queue_depth_url("http://gw:8002/", ["a", "b c", "x&y=z", "é/ü"])
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == "http://gw:8002" + QUEUE_DEPTH_PATH
    assert parse_qs(parts.query) == {"model": ["a", "b c", "x&y=z", "é/ü"]}
    assert " " not in url and "&y" not in url
    assert queue_depth_url("http://gw:8002", []) == "http://gw:8002/queue-depth"


def test_queue_depth_url_of_the_jobs_group_asks_for_the_jobs_queue_once() -> None:
    url = queue_depth_url("http://gw:8002", ["a", "b c"], jobs=True)
    assert parse_qs(urlsplit(url).query) == {"model": ["a", "b c"], JOBS_PARAM: ["1"]}
    assert queue_depth_url("http://gw:8002", [], jobs=True) == "http://gw:8002/queue-depth?jobs=1"
    assert JOBS_PARAM not in queue_depth_url("http://gw:8002", ["a"])


def test_summary_with_the_jobs_queue_adds_its_entry_and_counts_it_in_the_totals() -> None:
    w = ModelWork("m", 5, 2, (5, *[0] * 9))
    jobs = JobsWork(waiting=3, in_flight=1)
    assert jobs.owed == 4
    out = summary({"m": w}, jobs)
    assert out["jobs"] == {"owed": 4, "waiting": 3, "in_flight": 1}
    assert (out["owed"], out["waiting"], out["in_flight"]) == (11, 8, 3)
    assert out["models"] == summary({"m": w})["models"]
    assert "jobs" not in summary({"m": w})
    assert summary({}, JobsWork(0, 2))["owed"] == 2  # jobs alone


def test_model_work_owes_waiting_plus_in_flight_and_splits_the_waiting_by_class() -> None:
    steps = [0] * len(PRIORITY_STEPS)
    steps[0], steps[3], steps[PRIORITY_ASYNC], steps[PRIORITY_OFFLINE] = 2, 1, 4, 8
    w = ModelWork("m", sum(steps), 3, tuple(steps), held=(2, 1, 0))
    assert w.owed == 18
    assert w.by_class() == {"online": 3, "async": 4, "offline": 8}
    other = ModelWork("n", 0, 0)
    assert other.by_class() == {"online": 0, "async": 0, "offline": 0}
    assert summary({"m": w, "n": other}) == {
        "owed": 18,
        "waiting": 15,
        "in_flight": 3,
        "models": {
            "m": {
                "owed": 18,
                "waiting": 15,
                "in_flight": 3,
                "waiting_by_class": {"online": 3, "async": 4, "offline": 8},
                "in_flight_by_class": {"online": 2, "async": 1, "offline": 0},
            },
            "n": {
                "owed": 0,
                "waiting": 0,
                "in_flight": 0,
                "waiting_by_class": {"online": 0, "async": 0, "offline": 0},
                "in_flight_by_class": {"online": 0, "async": 0, "offline": 0},
            },
        },
    }
