"""Triton's perf_analyzer for the tests and the benchmark: finding the binary, running it
with a CSV, and the CSV's rows.

The tests check that it runs; the benchmark keeps its numbers (and measures again when a
point is not stable). Both read them here.
"""

from __future__ import annotations

import csv
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conch.devtools import processes

# The script that builds perf_analyzer on first use and prints its path (a checkout's bench/).
SETUP = Path(__file__).resolve().parents[3] / "bench" / "perf-analyzer-setup"


def binary() -> str:
    """$PERF_ANALYZER if set (``make test`` and ``make bench-gpu`` set it), else the path
    that ``bench/perf-analyzer-setup`` prints last."""
    given = os.environ.get("PERF_ANALYZER")
    if given:
        return given
    out = subprocess.run([str(SETUP)], check=True, stdout=subprocess.PIPE, text=True)
    path = out.stdout.strip().splitlines()[-1]
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"bench/perf-analyzer-setup printed {path!r}, which is not executable")
    return path


def window_args(
    model: str,
    url: str,
    protocol: str,
    concurrency: int,
    *,
    window_ms: int,
    stability_pct: int,
    max_trials: int,
) -> list[str]:
    """The flags of one measured point in fixed time windows, as conch's benchmark and its
    model analyzer both drive perf_analyzer."""
    return [
        *("-m", model, "-u", url, "-i", protocol),
        *("--concurrency-range", str(concurrency)),
        *("--measurement-mode", "time_windows", "--measurement-interval", str(window_ms)),
        *("--stability-percentage", str(stability_pct), "--max-trials", str(max_trials)),
    ]


@dataclass
class Outcome:
    """One perf_analyzer run: its exit status (None: killed past its time), its output
    (stdout and stderr), and its CSV's lines (none when it wrote no CSV)."""

    code: int | None
    output: str
    lines: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[dict[str, str]]:
        """The CSV's rows by column name (``Inferences/Second``, ``p99 latency``, ...)."""
        return list(csv.DictReader(self.lines))


def run(command: str, args: Sequence[str], csv_path: Path, *, timeout_s: float) -> Outcome:
    """``command`` (perf_analyzer) with ``args``, its CSV to ``csv_path`` (a composing model
    of an ensemble gets a CSV of its own beside it) and its output to the ``.log`` beside
    that; its process group is killed past ``timeout_s``."""
    code, output = processes.run_bounded(
        [command, *args, "-f", str(csv_path)],
        timeout_s=timeout_s,
        log_path=csv_path.with_suffix(".log"),
    )
    lines = csv_path.read_text().splitlines() if csv_path.exists() else []
    return Outcome(code, output, lines)
