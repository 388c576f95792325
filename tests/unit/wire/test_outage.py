"""Which Redis errors are an outage, the 503 they become, and when Redis lost its data."""

from __future__ import annotations

import pytest
import redis

from conch.core.errors import BrokerUnavailable, InvalidArgument
from conch.frontend.http.fast_path import error_answer
from conch.wire import outage
from conch.wire.outage import Dataset


@pytest.mark.parametrize(
    "exc",
    [
        redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
        redis.TimeoutError("Timeout reading from socket"),
        redis.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.ResponseError("LOADING Redis is loading the dataset in memory"),
        redis.ResponseError("READONLY You can't write against a read only replica."),
        redis.ResponseError("MASTERDOWN Link with MASTER is down"),
    ],
)
def test_an_unreachable_redis_is_a_503_that_says_so_and_when_to_retry(exc: Exception) -> None:
    assert outage.is_outage(exc)

    @outage.translated
    def call() -> None:
        raise exc

    with pytest.raises(BrokerUnavailable) as got:
        call()
    assert got.value.status == 503 and "Redis" in got.value.message
    status, headers, body = error_answer(got.value)
    assert status == 503 and ("Retry-After", "1") in headers
    assert body.startswith(b'{"error":"Redis is ')


def test_a_bad_command_is_no_outage() -> None:
    exc = redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    assert not outage.is_outage(exc)
    with pytest.raises(redis.ResponseError):
        outage.translated(lambda: (_ for _ in ()).throw(exc))()
    assert not outage.is_outage(OSError("No space left on device"))  # a disk's, not Redis's


def test_other_errors_carry_no_retry_after() -> None:
    _, headers, _ = error_answer(InvalidArgument("bad"))
    assert all(name != "Retry-After" for name, _ in headers)


def test_every_public_operation_is_translated_and_private_ones_left_alone() -> None:
    @outage.translate_outages
    class Plane:
        def public(self) -> None:
            raise redis.ConnectionError("gone")

        def _private(self) -> None:
            raise redis.ConnectionError("gone")

    with pytest.raises(BrokerUnavailable):
        Plane().public()
    with pytest.raises(redis.ConnectionError):
        Plane()._private()


BEFORE = Dataset("a1", "run1", appendonly=True)


@pytest.mark.parametrize(
    ("now", "lost"),
    [
        (Dataset("a1", "run1", True), False),  # the connection dropped, Redis stayed up
        (Dataset("a1", "run2", True), False),  # restarted and read its append-only file back
        (Dataset("b2", "run2", True), True),  # restarted empty: AOF lost, or a new server
        (Dataset("a1", "run2", False), True),  # restarted from a snapshot: recent writes gone
        (Dataset("a1", "run1", False), False),  # no AOF, but never restarted
    ],
)
def test_whether_redis_kept_what_it_held(now: Dataset, lost: bool) -> None:
    assert (outage.lost(BEFORE, now) is not None) is lost
