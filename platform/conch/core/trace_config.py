"""Triton's ``--trace-config``: whether and how conch traces requests.

Triton's flag is ``--trace-config [<section>,]<key>=<value>``, repeatable. conch takes
``mode=opentelemetry``, ``opentelemetry,url=<host:port/path>`` (the OTLP/HTTP collector;
Triton's default ``localhost:4318/v1/traces``), ``opentelemetry,resource=<key>=<value>``,
``rate=<N>`` (one new trace in N; default 1000), ``count=<N>`` (stop after N traces; -1,
the default, never) and ``level=OFF|TIMESTAMPS`` (OFF, Triton's default: none). Triton's
own trace-file mode is refused with a message saying so. ``conch.core.tracing`` applies
it; this module imports nothing of conch's or OpenTelemetry's, so ``conch.settings`` can use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# A W3C traceparent, version 00: the only form a message may carry.
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
DEFAULT_URL = "http://localhost:4318/v1/traces"  # Triton's default collector
LEVELS = ("OFF", "TIMESTAMPS")
FORMS = (
    "mode=opentelemetry, opentelemetry,url=<host:port/path>, opentelemetry,resource=<k>=<v>, "
    "rate=<N>, count=<N or -1>, level=OFF|TIMESTAMPS"
)


@dataclass(frozen=True)
class TraceConfig:
    """Triton's ``--trace-config`` settings that conch applies."""

    mode: str = ""  # "" until given: no tracing at all
    url: str = DEFAULT_URL
    level: str = "OFF"
    rate: int = 1000
    count: int = -1
    resource: tuple[tuple[str, str], ...] = field(default=())

    @property
    def on(self) -> bool:
        return self.mode == "opentelemetry" and self.level != "OFF"

    @classmethod
    def parse(cls, items: Iterable[str]) -> TraceConfig:
        """``--trace-config`` values; ValueError saying what to write for one that is not
        Triton's form or names something conch does not do."""
        values: dict[str, object] = {}
        resource: list[tuple[str, str]] = []
        for item in items:
            section, comma, rest = item.partition(",")
            if comma:
                if section != "opentelemetry":
                    raise ValueError(
                        f"--trace-config {item!r}: conch traces with OpenTelemetry only; {FORMS}"
                    )
                key, eq, value = rest.partition("=")
                if key == "url" and eq and value:
                    values["url"] = value if "://" in value else f"http://{value}"
                elif key == "resource" and "=" in value:
                    name, _, attr = value.partition("=")
                    resource.append((name, attr))
                else:
                    raise ValueError(f"--trace-config {item!r}: conch takes {FORMS}")
                values.setdefault("mode", "opentelemetry")
                continue
            key, eq, value = item.partition("=")
            if not eq or not value:
                raise ValueError(f"--trace-config {item!r}: the form is <key>=<value>: {FORMS}")
            if key == "mode":
                if value != "opentelemetry":
                    raise ValueError(
                        f"--trace-config {item!r}: conch traces with mode=opentelemetry only"
                    )
                values["mode"] = value
            elif key == "level":
                if value.upper() not in LEVELS:
                    raise ValueError(f"--trace-config {item!r}: level is OFF or TIMESTAMPS")
                values["level"] = value.upper()
            elif key in ("rate", "count"):
                values[key] = _number(item, value, key)
            else:
                raise ValueError(
                    f"--trace-config {item!r}: unknown key '{key}'; conch takes {FORMS}"
                )
        if "level" in values and values["level"] != "OFF":
            values.setdefault("mode", "opentelemetry")
        return cls(resource=tuple(resource), **values)  # type: ignore[arg-type]

    def items(self) -> list[str]:
        """The ``--trace-config`` values that reproduce it."""
        if not self.mode:
            return []
        out = [f"mode={self.mode}", f"opentelemetry,url={self.url}"]
        out += [f"opentelemetry,resource={k}={v}" for k, v in self.resource]
        return [*out, f"level={self.level}", f"rate={self.rate}", f"count={self.count}"]


def _number(item: str, value: str, key: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -2
    if n < (1 if key == "rate" else -1):
        least = "1" if key == "rate" else "-1 (no limit)"
        raise ValueError(f"--trace-config {item!r}: {key} is an integer, at least {least}")
    return n
