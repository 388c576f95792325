"""The h2 transport's threads, on real threads: ``spawn`` reuses a thread that waits,
each function in a context of its own, and ``Slots`` bounds its holders, first come
first served."""

from __future__ import annotations

import contextvars
import threading

from conch.frontend.grpc import h2_threads
from conch.frontend.grpc.h2_threads import Slots, spawn

WAIT_S = 5.0
MARK: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="")


def test_a_thread_that_waits_is_reused_with_a_clean_context(monkeypatch) -> None:
    started: list[object] = []
    start = h2_threads._thread.start_new_thread
    monkeypatch.setattr(
        h2_threads._thread, "start_new_thread", lambda f, a: (started.append(f), start(f, a))[1]
    )
    seen: list[str] = []
    done = threading.Event()

    def call(n: int) -> None:
        seen.append(MARK.get())
        MARK.set(f"call {n}")
        done.set()

    for n in range(20):
        done.clear()
        spawn(call, n)
        assert done.wait(WAIT_S)
        while not h2_threads._idle:  # its thread waits again
            done.wait(0.005)
    assert len(started) <= 1  # one thread at most, the rest reused
    assert seen == [""] * 20  # what a call set is not seen by the next


def test_a_failing_function_leaves_its_thread_serving() -> None:
    done = threading.Event()

    def fails() -> None:
        raise RuntimeError("boom")

    spawn(fails)
    spawn(done.set)
    assert done.wait(WAIT_S)


def test_slots_bound_their_holders_and_hand_over_in_order() -> None:
    slots = Slots(1)
    order: list[str] = []
    release = threading.Event()
    waiting = threading.Semaphore(0)

    def hold(name: str) -> None:
        with slots:
            order.append(name)
            if name == "first":
                release.wait(WAIT_S)

    first = threading.Thread(target=hold, args=("first",))
    first.start()
    while not order:
        release.wait(0.01)
    others = []
    for name in ("second", "third"):
        thread = threading.Thread(target=lambda n=name: (waiting.release(), hold(n)))
        thread.start()
        assert waiting.acquire(timeout=WAIT_S)
        while len(slots._waiting) < len(others) + 1:  # it queued behind the holder
            release.wait(0.01)
        others.append(thread)
    assert order == ["first"]
    release.set()
    for thread in (first, *others):
        thread.join(WAIT_S)
    assert order == ["first", "second", "third"]
    with slots:  # every slot came back
        pass
    assert slots._free == 1
