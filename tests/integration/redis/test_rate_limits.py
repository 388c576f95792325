"""The fleet's rate-limit resources on a real Redis (``conch.wire.rate_limits``): copies
counted across limiters, all-or-none acquires, per-host and global pools, and a dead
holder's copies freed when its lease ends."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import redis

from conch.wire.rate_limits import FleetLimiter, ResourceNeed, Stopped

from harness import fresh_db


@pytest.fixture()
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 13)


def limiter(db: str, capacity: int = 1, host: str = "h1", lease_s: float = 10.0) -> FleetLimiter:
    return FleetLimiter(
        redis.Redis.from_url(db), lambda need, device: capacity, host=host, lease_s=lease_s
    )


def test_copies_are_counted_across_limiters(db: str) -> None:
    a, b = limiter(db, capacity=2), limiter(db, capacity=2)
    need = [ResourceNeed("R", 1, shared=True)]
    first, second = a.try_acquire(need), b.try_acquire(need)
    assert first is not None and second is not None
    assert a.try_acquire(need) is None  # both copies held
    b.release(second)
    assert a.try_acquire(need) is not None


def test_an_acquire_takes_every_pool_or_none(db: str) -> None:
    a, b = limiter(db), limiter(db)
    r1, r2 = ResourceNeed("R1", 1, shared=True), ResourceNeed("R2", 1, shared=True)
    held = a.try_acquire([r2])
    assert held is not None
    assert b.try_acquire([r1, r2]) is None
    assert b.try_acquire([r1]) is not None  # R1 was not taken by the failed acquire


def test_pools_are_per_host_unless_global(db: str) -> None:
    here, there = limiter(db, host="h1"), limiter(db, host="h2")
    local = [ResourceNeed("GPU_MEM", 1)]
    assert here.try_acquire(local) is not None
    assert there.try_acquire(local) is not None  # another host's pool
    assert here.try_acquire(local, device=1) is not None  # another device's pool
    assert here.try_acquire(local) is None
    shared = [ResourceNeed("LICENSE", 1, shared=True)]
    assert here.try_acquire(shared) is not None
    assert there.try_acquire(shared) is None


def test_a_waiting_acquire_gets_the_copies_once_released(db: str) -> None:
    a, b = limiter(db), limiter(db)
    need = [ResourceNeed("R", 1, shared=True)]
    held = a.try_acquire(need)
    assert held is not None
    threading.Timer(0.3, a.release, args=(held,)).start()
    started = time.monotonic()
    assert b.acquire(need) is not None
    assert 0.25 < time.monotonic() - started < 5


def test_a_stop_ends_a_wait_and_the_block_never_runs(db: str) -> None:
    """A stopping worker must not wait for copies another holds, nor run without them."""
    a, b = limiter(db), limiter(db)
    need = [ResourceNeed("R", 1, shared=True)]
    assert a.try_acquire(need) is not None
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    ran = False
    started = time.monotonic()
    with pytest.raises(Stopped), b.holding(need, stop=stop):
        ran = True
    assert not ran
    assert time.monotonic() - started < 5


def test_leases_are_renewed_while_held(db: str) -> None:
    a, b = limiter(db, lease_s=0.6), limiter(db, lease_s=0.6)
    need = [ResourceNeed("R", 1, shared=True)]
    assert a.try_acquire(need) is not None
    time.sleep(1.5)  # past two leases: only renewal keeps it
    assert b.try_acquire(need) is None


def test_a_sigkilled_holders_copies_are_freed_when_its_lease_ends(db: str) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time, redis
                from conch.wire.rate_limits import FleetLimiter, ResourceNeed
                lim = FleetLimiter(redis.Redis.from_url({db!r}), lambda n, d: 1, lease_s=1.0)
                assert lim.try_acquire([ResourceNeed("R", 1, shared=True)]) is not None
                print("held", flush=True)
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        other = limiter(db)
        need = [ResourceNeed("R", 1, shared=True)]
        time.sleep(1.5)  # its renewals keep it held past its first lease
        assert other.try_acquire(need) is None
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        started = time.monotonic()
        assert other.acquire(need) is not None
        assert time.monotonic() - started < 3  # within a lease of its last renewal
    finally:
        holder.kill()
        holder.wait()
