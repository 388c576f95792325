"""The autoscaler's worker pool, on real child processes: started, retired by SIGTERM
(newest first), killed past their grace, replaced after a backoff when they die young."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from conch.autoscale.pool import WorkerPool
from conch.devtools.processes import wait_until

# A stand-in worker: says it is up; on SIGTERM says so and exits (unless stubborn);
# "crash" exits at once with status 3.
CHILD = """
import os, pathlib, signal, sys, time
out, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
def term(*_):
    if mode != "stubborn":
        (out / f"{os.getpid()}.term").write_text("")
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
(out / f"{os.getpid()}.up").write_text("")
if mode == "crash":
    sys.exit(3)
while True:
    time.sleep(0.02)
"""


def _pool(tmp_path: Path, mode: str = "polite", **kw) -> WorkerPool:
    return WorkerPool([sys.executable, "-c", CHILD, str(tmp_path), mode], **kw)


def _until(pred, timeout: float = 10) -> None:
    assert wait_until(pred, timeout, every=0.02), "timed out"


def _marked(tmp_path: Path, pid: int, mark: str) -> bool:
    return (tmp_path / f"{pid}.{mark}").exists()


def test_grows_and_retires_the_newest_by_sigterm(tmp_path: Path) -> None:
    pool = _pool(tmp_path, grace_s=30)
    try:
        pool.resize(3)
        first, second, third = pool.pids
        _until(lambda: all(_marked(tmp_path, p, "up") for p in (first, second, third)))
        pool.resize(1)
        assert pool.pids == [first] and sorted(pool.retiring_pids) == sorted([second, third])
        _until(lambda: _marked(tmp_path, second, "term") and _marked(tmp_path, third, "term"))

        def reaped() -> bool:
            pool.reap()
            return not pool.retiring_pids

        _until(reaped)
        assert pool.size == 1 and not _marked(tmp_path, first, "term")
    finally:
        pool.stop()
    assert _marked(tmp_path, first, "term") and pool.size == 0


def test_a_worker_past_its_grace_is_killed(tmp_path: Path) -> None:
    pool = _pool(tmp_path, "stubborn", grace_s=0.3)
    pool.resize(1)
    (pid,) = pool.pids
    _until(lambda: _marked(tmp_path, pid, "up"))
    pool.resize(0)
    pool.reap()
    assert pool.retiring_pids == [pid]  # SIGTERM ignored: still running
    time.sleep(0.4)
    pool.reap()  # past its grace: killed

    def gone() -> bool:
        pool.reap()
        return not pool.retiring_pids

    _until(gone)


def test_stop_waits_out_the_grace_then_kills(tmp_path: Path) -> None:
    pool = _pool(tmp_path, "stubborn", grace_s=0.5)
    pool.resize(2)
    _until(lambda: all(_marked(tmp_path, p, "up") for p in pool.pids))
    started = time.monotonic()
    pool.stop()
    assert 0.4 < time.monotonic() - started < 5
    assert pool.size == 0 and not pool.retiring_pids


def test_workers_that_die_young_are_replaced_after_a_growing_backoff(tmp_path: Path) -> None:
    now = [100.0]
    pool = _pool(tmp_path, "crash", grace_s=5, clock=lambda: now[0])

    def crash_once() -> None:
        pool.resize(1)
        assert pool.size == 1

        def reaped() -> bool:
            pool.reap()
            return pool.size == 0

        _until(reaped)

    crash_once()
    pool.resize(1)
    assert pool.size == 0  # held back 1 s
    now[0] += 1.0
    crash_once()  # started again, died again: now held back 2 s
    now[0] += 1.5
    pool.resize(1)
    assert pool.size == 0
    now[0] += 0.5
    crash_once()
    pool.stop()


@pytest.mark.parametrize("count", [0, 2])
def test_resize_to_the_same_size_changes_nothing(tmp_path: Path, count: int) -> None:
    pool = _pool(tmp_path, grace_s=5)
    try:
        pool.resize(count)
        pids = pool.pids
        pool.resize(count)
        assert pool.pids == pids and not pool.retiring_pids
    finally:
        pool.stop()
