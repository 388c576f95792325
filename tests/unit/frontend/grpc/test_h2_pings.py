"""Keepalive and ping policing on the h2 transport: Triton's flags, gRPC core's rules."""

from __future__ import annotations

from pathlib import Path

from conch.cli import parser
from conch.frontend.grpc.h2_pings import IDLE_PING_INTERVAL_S, PingBook, PingLimits
from conch.settings import Settings


def _limits(**changes: object) -> PingLimits:
    base = {
        "keepalive_time_s": 10.0,
        "keepalive_timeout_s": 2.0,
        "permit_without_calls": False,
        "max_pings_without_data": 2,
        "min_recv_ping_interval_s": 300.0,
        "max_ping_strikes": 2,
    }
    return PingLimits(**{**base, **changes})  # type: ignore[arg-type]


def test_limits_come_from_tritons_flags(tmp_path: Path) -> None:
    flags = """--grpc-keepalive-time 1000 --grpc-keepalive-timeout 2000
        --grpc-keepalive-permit-without-calls=1 --grpc-http2-max-pings-without-data 0
        --grpc-http2-min-recv-ping-interval-without-data 3000 --grpc-http2-max-ping-strikes 5"""
    args = parser().parse_args(["grpc", "--model-repository", str(tmp_path), *flags.split()])
    limits = PingLimits.from_settings(Settings.from_args(args, environ={}))
    assert limits == PingLimits(1.0, 2.0, True, 0, 3.0, 5)


def test_pings_past_the_strikes_end_the_connection() -> None:
    book = PingBook(_limits())
    assert not book.received(0.0, calls=True)  # the first is never a strike
    assert not book.received(1.0, calls=True)  # strike 1
    assert not book.received(2.0, calls=True)  # strike 2
    assert book.received(3.0, calls=True)  # strike 3: past 2


def test_pings_far_enough_apart_are_no_strikes() -> None:
    book = PingBook(_limits(min_recv_ping_interval_s=1.0))
    assert not any(book.received(t * 1.5, calls=True) for t in range(20))
    assert book.strikes == 0


def test_sending_data_forgives_strikes() -> None:
    book = PingBook(_limits())
    for t in range(3):
        book.received(float(t), calls=True)
        book.data_sent()
    assert book.strikes == 0 and not book.received(3.5, calls=True)


def test_an_idle_connection_may_be_pinged_every_two_hours_only() -> None:
    book = PingBook(_limits(min_recv_ping_interval_s=1.0))
    book.received(0.0, calls=False)
    book.received(10.0, calls=False)  # 10 s: fine with calls, a strike without
    assert book.strikes == 1
    book.received(10.0 + IDLE_PING_INTERVAL_S, calls=False)
    assert book.strikes == 1


def test_no_limit_on_strikes_when_zero() -> None:
    book = PingBook(_limits(max_ping_strikes=0))
    assert not any(book.received(float(t), calls=True) for t in range(50))


def test_keepalive_pings_only_with_calls_unless_permitted() -> None:
    assert not PingBook(_limits()).may_ping(calls=False)
    assert PingBook(_limits()).may_ping(calls=True)
    assert PingBook(_limits(permit_without_calls=True)).may_ping(calls=False)


def test_keepalive_sends_at_most_max_pings_without_data() -> None:
    book = PingBook(_limits(max_pings_without_data=2))
    for _ in range(2):
        assert book.may_ping(calls=True)
        book.pinged()
    assert not book.may_ping(calls=True)
    book.data_sent()
    assert book.may_ping(calls=True)
    unlimited = PingBook(_limits(max_pings_without_data=0))
    for _ in range(10):
        unlimited.pinged()
    assert unlimited.may_ping(calls=True)
