"""bench/timeline.py end to end with a tiny N: a real gateway and worker stamp every point
of the path, so every request is followed, each hop in order with its hand-off."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "timeline.py"

# The script starts a redis-server of its own, in the child process.
pytestmark = pytest.mark.redis


def test_every_request_is_followed_through_every_hand_off(tmp_path: Path) -> None:
    out = tmp_path / "timeline.json"
    argv = [sys.executable, str(SCRIPT), "--n", "40", "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text())
    # A stamp the path lost (moved, renamed, or never reached) leaves requests out.
    assert got["incomplete"] == 0 and got["requests"] == 40
    hops = got["hops"]
    assert hops[0]["start"] == "client.send" and hops[-1]["end"] == "client.received"
    assert all(a["end"] == b["start"] for a, b in itertools.pairwise(hops))
    assert all(h["median_us"] >= 0 for h in hops)
    handoffs = {(h["start"], h["end"]): h["handoff"] for h in hops}
    assert handoffs[("publish.sent", "worker.woke")] == "process"
    assert handoffs[("worker.replying", "reply.popped")] == "process"
    assert handoffs[("reply.routed", "reply.woke")] == "thread"  # listener → request greenlet
    assert {s["end"] for s in got["side"]} == {"publish.acked", "reply.woke", "worker.replied"}
    assert got["floor_us"] > 0 and got["round_trip_us"] > 0
    assert "sum of the medians" in proc.stdout
