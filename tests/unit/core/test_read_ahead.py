"""ReadAhead: a copy read again ahead of its age, so that no caller waits for it."""

from __future__ import annotations

import threading
import time

import pytest

from conch.core.read_ahead import ReadAhead


class Source:
    """A value kept elsewhere, each read counted by the thread that made it."""

    def __init__(self) -> None:
        self.value = 1
        self.readers: list[str] = []
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()

    def read(self) -> int:
        value = self.value  # what the read finds, however long its answer takes to come
        self.gate.wait(5)
        self.readers.append(threading.current_thread().name)
        if self.fail:
            raise ConnectionError("gone")
        return value


def settle(copy: ReadAhead[int]) -> None:
    deadline = time.monotonic() + 5
    while copy._reading and time.monotonic() < deadline:
        time.sleep(0.001)


def test_a_copy_half_its_age_is_read_again_behind_the_caller() -> None:
    source = Source()
    copy = ReadAhead(source.read, 0, 0.2, name="behind")
    assert copy.get() == 1 and source.readers == ["MainThread"]  # never read: inline
    source.value = 2
    assert copy.get() == 1 and len(source.readers) == 1  # fresh: not read at all
    time.sleep(0.12)  # past half its age
    source.gate.clear()  # the read behind takes its time
    assert copy.get() == 1  # the caller does not wait for it
    assert copy.get() == 1
    source.gate.set()
    settle(copy)
    assert source.readers == ["MainThread", "behind"]  # one read behind, however many asked
    assert copy.get() == 2


def test_a_copy_past_its_age_is_read_by_its_caller_whose_error_it_gets() -> None:
    source = Source()
    copy = ReadAhead(source.read, 0, 0.05, name="inline")
    assert copy.get() == 1
    source.fail = True
    time.sleep(0.03)
    assert copy.get() == 1  # the read behind fails: the copy ages
    settle(copy)
    time.sleep(0.03)
    with pytest.raises(ConnectionError):
        copy.get()  # too old now: read inline, and its error is the caller's
    source.fail, source.value = False, 3
    assert copy.get() == 3
    assert copy.get(max_age_s=0.0) == 3 and source.readers[-1] == "MainThread"  # a stricter bound


def test_a_read_begun_before_an_invalidate_is_not_kept() -> None:
    source = Source()
    copy = ReadAhead(source.read, 0, 0.1, name="stale")
    assert copy.get() == 1
    time.sleep(0.06)
    source.gate.clear()
    copy.get()  # a read behind starts, and waits at the gate
    copy.invalidate()  # ... the process changes what it copies meanwhile
    source.value = 5
    source.gate.set()
    settle(copy)
    assert copy.get() == 5  # read again, not the value the earlier read found
