"""What a pop gives the drain loop: each message a ``Popped``, read from the pop script's
flat reply without Redis."""

from __future__ import annotations

import dataclasses

import pytest
import redis

from conch.worker.drain import Drain, Popped


def test_a_pop_reads_the_scripts_reply_as_popped_messages() -> None:
    drain = Drain(redis.Redis(), "m")  # never reached: no command is sent
    # The pop script's reply: the messages still waiting, then (tag, raw, attempts) each.
    flat = [3, b"tag-1", b'{"body": 1}', 1, "tag-2", b'{"body": 2}', 2]
    popped = drain.popped(flat, 2)
    assert popped == [Popped("tag-1", b'{"body": 1}', 1), Popped("tag-2", b'{"body": 2}', 2)]
    assert [p.tag for p in popped] == ["tag-1", "tag-2"]  # tags as str, raw as sent
    assert popped[1].attempts == 2 and drain.waiting == 3
    assert drain.popped([0], 8) == [] and drain.waiting == 0


def test_a_popped_message_is_a_small_frozen_record() -> None:
    p = Popped("t", b"raw", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.attempts = 2  # type: ignore[misc]
    assert not hasattr(p, "__dict__")  # slots: no per-message dict on the hot path
