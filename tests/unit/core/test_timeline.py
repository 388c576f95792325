"""conch.core.timeline: stamps land in one file per process and read back in order."""

from __future__ import annotations

import os

import pytest

from conch.core import timeline


@pytest.fixture
def stamping(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline, "_folder", str(tmp_path))
    monkeypatch.setattr(timeline, "_book", None)
    yield tmp_path
    timeline._book = None


def test_off_it_writes_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(timeline, "_folder", "")
    monkeypatch.setattr(timeline, "_book", None)
    timeline.stamp("gateway.read")
    assert timeline._book is None


def test_stamps_read_back_in_order_with_their_thread(stamping) -> None:
    for point in ("gateway.read", "gateway.parsed", "reply.woke"):
        timeline.stamp(point)
    files = list(stamping.glob(f"*{timeline.SUFFIX}"))
    assert [f.name for f in files] == [f"{os.getpid()}{timeline.SUFFIX}"]
    got = timeline.read(files[0])
    assert [s.point for s in got] == ["gateway.read", "gateway.parsed", "reply.woke"]
    assert [s.ns for s in got] == sorted(s.ns for s in got)
    assert {s.pid for s in got} == {os.getpid()}


def test_a_forked_child_writes_a_file_of_its_own(stamping) -> None:
    timeline.stamp("parent.before")  # the parent's file is mapped before the fork
    pid = os.fork()
    if pid == 0:  # the child: one stamp, then out without any cleanup
        timeline.stamp("child.only")
        os._exit(0)
    os.waitpid(pid, 0)
    timeline.stamp("parent.after")
    mine = timeline.read(stamping / f"{os.getpid()}{timeline.SUFFIX}")
    child = timeline.read(stamping / f"{pid}{timeline.SUFFIX}")
    assert [s.point for s in mine] == ["parent.before", "parent.after"]
    assert [s.point for s in child] == ["child.only"]
