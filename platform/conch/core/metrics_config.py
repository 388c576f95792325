"""Triton's ``--metrics-config``: which latency families the metrics port prints.

Triton's flag is ``--metrics-config <key>=<value>``, repeatable. conch takes its keys:

- ``counter_latencies`` (default true): the ``nv_inference_*_duration_us`` counters;
- ``summary_latencies`` (default false): the ``nv_inference_*_summary_us`` summaries,
  quantiles over the recent requests (``summary_quantiles``, Triton's
  ``<quantile>:<error>,...`` form; Triton's default five when not given);
- ``histogram_latencies`` (default false): ``nv_inference_first_response_histogram_ms``.

Workers keep the recent samples a summary is computed from only while summaries are on,
so give the flag to workers as well as to gateways (``conch serve`` passes it on).
Free of imports, so ``conch.settings`` can use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Triton's default quantiles and their allowed errors.
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
_SWITCHES = ("counter_latencies", "summary_latencies", "histogram_latencies")
_BOOLS = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}
FORMS = (
    "counter_latencies=<bool>, summary_latencies=<bool>, histogram_latencies=<bool> or "
    "summary_quantiles=<quantile>:<error>,... (e.g. 0.5:0.05,0.9:0.01)"
)


@dataclass(frozen=True)
class MetricsConfig:
    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES

    @classmethod
    def parse(cls, items: Iterable[str]) -> MetricsConfig:
        """``--metrics-config`` values. Raises ValueError saying what to write for an
        unknown key, a value that is not a bool, or a malformed quantile list."""
        values: dict[str, object] = {}
        for item in items:
            key, eq, value = item.partition("=")
            if not eq or not value:
                raise ValueError(f"--metrics-config {item!r}: the form is <key>=<value>: {FORMS}")
            if key in _SWITCHES:
                if value.lower() not in _BOOLS:
                    raise ValueError(f"--metrics-config {item!r}: '{key}' takes true or false")
                values[key] = _BOOLS[value.lower()]
            elif key == "summary_quantiles":
                values["quantiles"] = _quantiles(item, value)
            else:
                raise ValueError(
                    f"--metrics-config {item!r}: unknown key '{key}'; conch takes {FORMS}"
                )
        return cls(**values)  # type: ignore[arg-type]

    def items(self) -> list[str]:
        """The ``--metrics-config`` values that reproduce it."""
        out = [f"{k}={str(getattr(self, k)).lower()}" for k in _SWITCHES]
        pairs = ",".join(f"{q:g}:{e:g}" for q, e in self.quantiles)
        return [*out, f"summary_quantiles={pairs}"]


def _quantiles(item: str, text: str) -> tuple[tuple[float, float], ...]:
    out = []
    for pair in text.split(","):
        q, colon, e = pair.partition(":")
        try:
            quantile, error = float(q), float(e)
        except ValueError:
            quantile = error = -1.0
        if not colon or not (0 <= quantile <= 1 and 0 <= error <= 1):
            raise ValueError(
                f"--metrics-config {item!r}: each quantile is <quantile>:<error>, both "
                f"between 0 and 1 (e.g. 0.5:0.05,0.9:0.01); got {pair!r}"
            )
        out.append((quantile, error))
    return tuple(out)


__all__ = ["DEFAULT_QUANTILES", "FORMS", "MetricsConfig"]
