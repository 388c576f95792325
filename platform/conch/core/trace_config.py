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
from dataclasses import dataclass, field, replace

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
                values[key] = _number(f"--trace-config {item!r}", value, key)
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


def _number(where: str, value: str, key: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -2
    if n < (1 if key == "rate" else -1):
        least = "1" if key == "rate" else "-1 (no limit)"
        raise ValueError(f"{where}: {key} is an integer, at least {least}")
    return n


# The trace extension's keys (GET/POST v2[/models/<m>]/trace/setting), Triton's JSON names.
API_KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode", "trace_file")


def to_json(config: TraceConfig) -> dict[str, object]:
    """``config`` as the trace extension shows it: Triton's keys, values as strings."""
    return {
        "trace_level": [config.level],
        "trace_rate": str(config.rate),
        "trace_count": str(config.count),
        "log_frequency": "0",
        "trace_mode": "opentelemetry",
    }


def updated(config: TraceConfig, changes: object) -> TraceConfig:
    """``config`` with a trace extension request's ``changes`` (a ``None`` value keeps the
    setting, the caller drops it from its scope); ValueError saying what is wrong."""
    if not isinstance(changes, dict):
        raise ValueError("trace settings must be a JSON object")
    values: dict[str, object] = {}
    for key, value in changes.items():
        if key not in API_KEYS:
            raise ValueError(
                f"unknown trace setting '{key}'; the settings are {', '.join(API_KEYS)}"
            )
        if value is None:
            continue
        if key == "trace_level":
            levels = value if isinstance(value, list) else [value]
            if not levels or not all(isinstance(v, str) and v.upper() in LEVELS for v in levels):
                raise ValueError("trace_level must be a list of OFF or TIMESTAMPS")
            on = any(v.upper() != "OFF" for v in levels)
            values["level"] = "TIMESTAMPS" if on else "OFF"
        elif key in ("trace_rate", "trace_count"):
            name = key.removeprefix("trace_")
            values[name] = _number(key, str(value), name)
        elif key == "trace_mode" and value != "opentelemetry":
            raise ValueError("trace_mode cannot be changed at run time: it is opentelemetry")
        elif key == "log_frequency" and str(value) != "0":
            raise ValueError(
                "log_frequency is for Triton's trace files: conch exports spans over OTLP"
            )
        elif key == "trace_file":
            raise ValueError(
                "trace_file is for Triton's trace files: conch exports spans over OTLP"
            )
    return replace(config, **values)  # type: ignore[arg-type]
