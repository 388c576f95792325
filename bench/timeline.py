#!/usr/bin/env python3
"""One request's timeline: when each thread and process took it up and handed it on.

    .venv/bin/python bench/timeline.py              # N = 2000 requests, one at a time
    .venv/bin/python bench/timeline.py --quick      # N = 300

Serves Triton's ``add_sub`` example (``functions/add_sub``, no batching) as ``conch
serve`` does, as a ``conch gateway`` and a ``conch worker`` over a private redis-server
on a Unix socket, both with ``CONCH_TIMELINE_DIR`` set. Then it sends N binary-tensor
infer calls one after another on one keep-alive connection (concurrency 1). The places
where a request changes hands stamp the time (``conch.core.timeline``: one
``CLOCK_MONOTONIC`` read and a record in a memory-mapped file per process, no system
call), and this script stamps the client's send and receive on the same clock.

The files are merged afterwards (``follow``). A stamp belongs to the request whose
client window (send to receive) holds it, since only one request is in flight. Each
request's stamps are walked in ``CHAIN`` order. Printed: for each hop between two
stamps in a row, the median µs over the N requests, whether the hop crosses a process or
a thread (a greenlet under gevent), and what happens in it. Then the sum of those
medians against the client's median round trip, the side waits (``SIDE``: a round trip
that another thread or process overlaps), and the hops' floor (``drain.measure_hops``:
the same processes' hops with no conch code) measured in the same run.

Why stamps and not conch's OpenTelemetry spans (``--trace-config``): the spans cover
the gateway's ``infer`` call and the worker's queue wait and batch, not the hand-offs in
between (the reply listener, the wake and the pop, the write). And a span costs its
creation and a batch exporter thread in the measured processes, which would take a
share of the hops being timed. Results: bench/README.md, "bench/timeline.py".
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import drain  # noqa: E402
import procs  # noqa: E402

from conch.core import timeline  # noqa: E402
from conch.core.timeline import Stamp  # noqa: E402
from conch.devtools import redis_server  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402

import models  # noqa: E402

DEFAULT_JSON = ROOT / ".cache" / "bench" / "timeline.json"
WARM_UP = 200  # calls before the measured ones, whose stamps are left out
CLIENT_SEND, CLIENT_RECEIVED = "client.send", "client.received"
INPUTS = ("INPUT0", "INPUT1")
OUTPUTS = ("OUTPUT0", "OUTPUT1")


@dataclass(frozen=True)
class Point:
    """A stamp in a request's path, and what happened since the one before it."""

    name: str
    since_previous: str


# The path of one request to a model without dynamic batching, in the order its stamps
# are taken; where each is stamped: grep for the name in platform/conch.
CHAIN = (
    Point(CLIENT_SEND, ""),
    Point("gateway.read", "the kernel, gevent's hub waking the connection's greenlet, recv"),
    Point("gateway.parsed", "the head parsed, the model found, the body decoded"),
    Point("gateway.validated", "the request checked against the model's config"),
    Point("publish.queued", "the message built (calls.build), given to the Publisher"),
    Point("publish.sent", "the group commit's yield to the hub, the envelope, written"),
    Point("worker.woke", "Redis's publish script and wake token; the worker's BLPOP returns"),
    Point("worker.popped", "a second round trip: the pop script takes the message"),
    Point("worker.admitted", "the envelope and msgpack decoded, the request admitted"),
    Point("worker.executing", "inputs as numpy arrays, the backend's request"),
    Point("worker.executed", "the Python backend runs the model's execute"),
    Point("worker.encoded", "outputs as wire tensors, the Reply"),
    Point("worker.replying", "statistics, the reply packed, its ack and the next pop queued"),
    Point("reply.popped", "Redis pushes the reply; the gateway's reply listener's BLMPOP returns"),
    Point("reply.routed", "the reply unpacked, its waiter's event set"),
    Point("reply.woke", "the hub switches from the listener to the request's greenlet"),
    Point("gateway.encoded", "the outcome built, the response encoded"),
    Point("gateway.writing", "the response's head made"),
    Point(CLIENT_RECEIVED, "the kernel, the client reading the response whole"),
)


@dataclass(frozen=True)
class Side:
    """A wait that overlaps the chain: from ``start`` (a chain point) to ``end``."""

    start: str
    end: str
    what: str


SIDE = (
    Side("publish.sent", "publish.acked", "the publish's round trip, as the request waits on it"),
    Side("reply.waiting", "reply.woke", "the request's greenlet waiting for its reply"),
    Side("worker.replying", "worker.replied", "the reply's round trip, as the worker waits on it"),
)


# --------------------------------------------------------------------------- merging


@dataclass(frozen=True)
class Window:
    """One measured call, as the client saw it."""

    sent_ns: int
    received_ns: int


@dataclass
class Followed:
    """The merged timelines: each complete request's stamp at each point (chain and
    side), and how many requests lacked a chain point (left out)."""

    requests: list[dict[str, Stamp]]
    incomplete: int


def follow(stamps: list[Stamp], windows: list[Window], client_pid: int = 0) -> Followed:
    """Each window's request, its stamps walked in ``CHAIN`` order: at each point, the
    first stamp of that name at or after the point before it. A request missing a point
    (a stamp out of the usual order) is counted as incomplete and left out. Side points
    are the first of their name at or after their start."""
    ordered = sorted(stamps, key=lambda s: s.ns)
    times = [s.ns for s in ordered]
    out: list[dict[str, Stamp]] = []
    incomplete = 0
    lo = 0
    for w in windows:
        while lo < len(ordered) and times[lo] < w.sent_ns:
            lo += 1
        hi = lo
        while hi < len(ordered) and times[hi] <= w.received_ns:
            hi += 1
        inside = ordered[lo:hi]
        got = {
            CLIENT_SEND: Stamp(client_pid, w.sent_ns, 0, CLIENT_SEND),
            CLIENT_RECEIVED: Stamp(client_pid, w.received_ns, 0, CLIENT_RECEIVED),
        }
        at = w.sent_ns
        for point in CHAIN[1:-1]:
            found = _first(inside, point.name, at)
            if found is None:
                break
            got[point.name] = found
            at = found.ns
        else:
            for side in SIDE:
                start = got.get(side.start) or _first(inside, side.start, w.sent_ns)
                end = _first(inside, side.end, start.ns) if start is not None else None
                if start is not None and end is not None:
                    got[side.start], got[side.end] = start, end
            out.append(got)
            continue
        incomplete += 1
    return Followed(out, incomplete)


def _first(stamps: list[Stamp], point: str, at_or_after: int) -> Stamp | None:
    return next((s for s in stamps if s.point == point and s.ns >= at_or_after), None)


def handoff(a: Stamp, b: Stamp) -> str:
    """What carries a request from stamp ``a`` to ``b``: another process, another thread
    (a greenlet under gevent) of the same process, or the same thread."""
    if a.pid != b.pid:
        return "process"
    return "thread" if a.thread != b.thread else ""


@dataclass(frozen=True)
class Hop:
    """One hop's durations over the requests followed, in µs."""

    start: str
    end: str
    what: str
    handoff: str  # the most frequent over the requests
    median_us: float
    p90_us: float


def _hop(requests: list[dict[str, Stamp]], start: str, end: str, what: str) -> Hop | None:
    pairs = [(r[start], r[end]) for r in requests if start in r and end in r]
    if not pairs:
        return None
    took = sorted((b.ns - a.ns) / 1000 for a, b in pairs)
    kinds = [handoff(a, b) for a, b in pairs]
    kind = max(set(kinds), key=kinds.count)
    return Hop(start, end, what, kind, statistics.median(took), took[int(0.9 * (len(took) - 1))])


def hops(followed: Followed) -> list[Hop]:
    """The chain's hops, in order."""
    found = [
        _hop(followed.requests, a.name, b.name, b.since_previous)
        for a, b in itertools.pairwise(CHAIN)
    ]
    return [h for h in found if h is not None]


def side_waits(followed: Followed) -> list[Hop]:
    found = [_hop(followed.requests, s.start, s.end, s.what) for s in SIDE]
    return [h for h in found if h is not None]


def round_trip_us(followed: Followed) -> float:
    """The client's median round trip over the requests followed."""
    return statistics.median(
        (r[CLIENT_RECEIVED].ns - r[CLIENT_SEND].ns) / 1000 for r in followed.requests
    )


def format_table(chain: list[Hop], side: list[Hop], round_trip: float, floor_us: float) -> str:
    total = sum(h.median_us for h in chain)
    lines = [
        "| hop | hand-off | median µs | p90 µs | share | what happens |",
        "|---|---|---:|---:|---:|---|",
    ]
    for h in chain:
        share = f"{100 * h.median_us / total:.0f} %" if total else ""
        lines.append(
            f"| {h.start} → {h.end} | {h.handoff or 'none'} | {h.median_us:.1f} | {h.p90_us:.1f} "
            f"| {share} | {h.what} |"
        )
    lines.append(f"| **sum of the medians** | | **{total:.1f}** | | | |")
    lines.append(f"| client's round trip (median) | | {round_trip:.1f} | | | |")
    if floor_us:
        lines.append(
            f"| the hops' floor (drain.py's hops row, p50) | | {floor_us:.1f} | | | no conch code |"
        )
    for h in side:
        lines.append(
            f"| (side) {h.start} → {h.end} | {h.handoff or 'none'} | {h.median_us:.1f} "
            f"| {h.p90_us:.1f} | | {h.what} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- the run


def write_repository(root: Path) -> None:
    """``add_sub`` as bench/run.py serves it (bench/models.py), alone."""
    (root / models.ADD_SUB_NAME / "1").mkdir(parents=True)
    source = ROOT / "functions" / models.ADD_SUB_NAME / "1" / "model.py"
    (root / models.ADD_SUB_NAME / "1" / "model.py").write_bytes(source.read_bytes())
    (root / models.ADD_SUB_NAME / "config.pbtxt").write_text(models.ADD_SUB_CONFIG)


def add_sub_call() -> bytes:
    """An infer call on add_sub: two FP32 [4] inputs and both outputs, binary."""
    raw = bytes(range(16))  # four small floats' worth of bytes; any value adds
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": [4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
                for name in INPUTS
            ],
            "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in OUTPUTS],
        }
    ).encode()
    head = (
        f"POST /v2/models/{models.ADD_SUB_NAME}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(header) + 2 * len(raw)}\r\n\r\n"
    )
    return head.encode() + header + raw + raw


def calls(port: int, call: bytes, count: int) -> list[Window]:
    """``count`` calls one after another on one keep-alive connection, each timed on
    ``CLOCK_MONOTONIC`` from the start of its write to the end of its answer."""
    windows: list[Window] = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        for _ in range(count):
            sent = time.monotonic_ns()
            sock.sendall(call)
            while (end := buf.find(b"\r\n\r\n")) < 0:
                buf += drain.receive(sock)
            head = bytes(buf[:end]).lower()
            need = end + 4 + drain.content_length(head)
            while len(buf) < need:
                buf += drain.receive(sock)
            received = time.monotonic_ns()
            if not head.startswith(b"http/1.1 200"):
                raise RuntimeError(f"the gateway answered: {bytes(buf[:need])[:500]!r}")
            del buf[:need]
            windows.append(Window(sent, received))
    return windows


def run(args: argparse.Namespace) -> dict:
    logs = args.json.parent / f"{args.json.stem}-logs"
    private = redis_server.start_private(unix_socket=True)
    try:
        with (
            procs.Group(logs) as group,
            tempfile.TemporaryDirectory(prefix="timeline-") as tmp,
        ):
            group.guard("redis-server", private.process.pid)
            repo, stamps_dir = Path(tmp) / "repo", Path(tmp) / "stamps"
            stamps_dir.mkdir()
            write_repository(repo)
            env = {timeline.ENV: str(stamps_dir)}
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            worker = group.start("conch-worker", conch("worker", *common), env=env)
            port = redis_server.free_port()
            listen = ["--http-address", "127.0.0.1", "--http-port", str(port)]
            listen += ["--metrics-port", str(redis_server.free_port())]
            gateway = group.start("conch-gateway", conch("gateway", *common, *listen), env=env)
            ready = f"http://127.0.0.1:{port}/v2/models/{models.ADD_SUB_NAME}/ready"
            procs.wait_until(lambda: drain.http_ok(ready), 120, group, "add_sub's readiness")
            call = add_sub_call()
            calls(port, call, WARM_UP)
            windows = calls(port, call, args.n)
            time.sleep(0.2)  # the last side stamps (the worker's reply acked) are in
            gateway.stop()
            worker.stop()
            stamps = [
                s for path in stamps_dir.glob(f"*{timeline.SUFFIX}") for s in timeline.read(path)
            ]
            floor = drain.measure_hops(group, private.url, args.n)
    finally:
        private.stop()
    followed = follow(stamps, windows, os.getpid())
    return {
        "followed": followed,
        "floor_us": floor.p50_s * 1e6,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N = 300 unless --n says otherwise")
    p.add_argument("--n", type=int, help="requests followed (default 2000; --quick: 300)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"default {DEFAULT_JSON}")
    args = p.parse_args(argv)
    if args.n is None:
        args.n = 300 if args.quick else 2000
    if args.n < 1:
        p.error("--n takes a positive integer")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    got = run(args)
    followed: Followed = got["followed"]
    if not followed.requests:
        print(f"no request could be followed ({followed.incomplete} incomplete)")
        return 1
    chain, side = hops(followed), side_waits(followed)
    rtt = round_trip_us(followed)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"\nadd_sub at concurrency 1: {len(followed.requests)} requests followed, "
        f"{followed.incomplete} left out (a stamp out of order); load average {' '.join(load)}\n"
    )
    print(format_table(chain, side, rtt, got["floor_us"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "argv": sys.argv[1:],
        "at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "requests": len(followed.requests),
        "incomplete": followed.incomplete,
        "round_trip_us": rtt,
        "floor_us": got["floor_us"],
        "hops": [asdict(h) for h in chain],
        "side": [asdict(h) for h in side],
    }
    args.json.write_text(json.dumps(document, indent=2))
    print(f"\n(results: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
