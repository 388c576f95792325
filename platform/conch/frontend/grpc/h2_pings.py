"""Keepalive and ping policing on an ``h2`` connection, with Triton's flags and gRPC core's rules.

Two directions, one book per connection:

- **Our pings (keepalive).** Every ``--grpc-keepalive-time`` the server pings the peer and
  closes the connection when no ACK comes within ``--grpc-keepalive-timeout``. It pings a
  connection with no call in flight only under ``--grpc-keepalive-permit-without-calls``,
  and sends at most ``--grpc-http2-max-pings-without-data`` pings (0: any number) before it
  has sent data or headers again.
- **The peer's pings (policing).** A ping that comes sooner than
  ``--grpc-http2-min-recv-ping-interval-without-data`` after the one before, with no data
  sent between, is a strike (with no call in flight and keepalive not permitted without
  calls, sooner than two hours is); past ``--grpc-http2-max-ping-strikes`` strikes (0: no
  limit) the connection is closed with GOAWAY ENHANCE_YOUR_CALM. Sending data or headers
  forgives the strikes. h2 answers each ping itself; this only counts.

Pure state over a clock the caller passes in (``time.monotonic()``), so each rule is tested
without a socket.
"""

from __future__ import annotations

from dataclasses import dataclass

from conch.settings import Settings

IDLE_PING_INTERVAL_S = 7200.0  # gRPC core's: how often a peer may ping an idle connection


@dataclass(frozen=True, slots=True)
class PingLimits:
    """Triton's keepalive and ping flags, in seconds."""

    keepalive_time_s: float
    keepalive_timeout_s: float
    permit_without_calls: bool
    max_pings_without_data: int
    min_recv_ping_interval_s: float
    max_ping_strikes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> PingLimits:
        return cls(
            keepalive_time_s=settings.grpc_keepalive_time_ms / 1000,
            keepalive_timeout_s=settings.grpc_keepalive_timeout_ms / 1000,
            permit_without_calls=settings.grpc_keepalive_permit_without_calls,
            max_pings_without_data=settings.grpc_http2_max_pings_without_data,
            min_recv_ping_interval_s=settings.grpc_http2_min_recv_ping_interval_without_data_ms
            / 1000,
            max_ping_strikes=settings.grpc_http2_max_ping_strikes,
        )


class PingBook:
    """One connection's pings both ways (see the module docstring)."""

    __slots__ = ("_last_received", "_sent_without_data", "limits", "strikes")

    def __init__(self, limits: PingLimits) -> None:
        self.limits = limits
        self._last_received: float | None = None
        self._sent_without_data = 0
        self.strikes = 0

    def data_sent(self) -> None:
        """We sent data or headers: strikes forgiven, and keepalive may ping again."""
        self._last_received = None
        self.strikes = 0
        self._sent_without_data = 0

    def received(self, now: float, calls: bool) -> bool:
        """A ping came (``calls``: some call is in flight); whether that is one strike too
        many, and the connection must go."""
        limits = self.limits
        if calls or limits.permit_without_calls:
            interval = limits.min_recv_ping_interval_s
        else:
            interval = IDLE_PING_INTERVAL_S
        last, self._last_received = self._last_received, now
        if last is not None and now - last < interval:
            self.strikes += 1
        return limits.max_ping_strikes > 0 and self.strikes > limits.max_ping_strikes

    def may_ping(self, calls: bool) -> bool:
        """Whether keepalive pings now (``calls``: some call is in flight)."""
        limits = self.limits
        if not (calls or limits.permit_without_calls):
            return False
        cap = limits.max_pings_without_data
        return cap == 0 or self._sent_without_data < cap

    def pinged(self) -> None:
        self._sent_without_data += 1


__all__ = ["IDLE_PING_INTERVAL_S", "PingBook", "PingLimits"]
