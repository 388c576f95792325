#!/usr/bin/env python3
"""Which HTTP core should carry an infer call: the gateway's CPU per request on each
(issue 42, point 1).

    pip install --target /tmp/httpcores granian==2.8.7 uvicorn==0.54.0 httptools==0.9.0 \\
        uvloop==0.23.0                       # a scratch folder, not conch's venv
    PYTHONPATH=platform .venv/bin/python bench/http_cores.py --site /tmp/httpcores

Three servers answer the same infer calls, measured as bench/drain.py measures its
gateway row: binary-tensor calls of 1 KiB on keep-alive connections from a cheap client
in this process, a stand-in worker answering each request with its input (``drain.py
--stand-in``), one private redis-server on a Unix socket; the CPU counted is the server's
processes' own (from /proc), not the client's, the stand-in's or Redis's.

- **gevent**: today's ``conch gateway`` (gunicorn's gevent worker, its own keep-alive loop);
- **granian**: granian's Rust HTTP/1.1 on one worker process and one runtime thread, its
  RSGI interface on uvloop (bench/http_core_app.py);
- **uvicorn**: uvicorn with httptools and uvloop, ASGI (the same file).

The two prototypes run conch's own ``serve_infer`` (the request's whole Python, as the
gateway runs it) and conch's ``Publisher`` group commit, on the event loop; what differs
is the HTTP core, the loop, and how the wait for the reply is carried (bench/
http_core_app.py's docstring). All three run at once, on one model (``drain_b64``,
dynamic batching: requests that meet are bundled, as the gateway bundles them), and take
turns in each round, A B C C B A, so that the machine's drift falls on each alike. Each
point prints its CPU µs a request, its wall µs a request and the load average then.
Results: bench/README.md, "HTTP cores".
"""

from __future__ import annotations

import argparse
import json
import os
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

from conch.devtools import redis_server  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402

DEFAULT_JSON = ROOT / ".cache" / "bench" / "http_cores.json"
CORES = ("gevent", "granian", "uvicorn")
CANNED = " canned"  # a server's name ends so when it answers canned bytes (--canned)
SIZE = 1024


@dataclass
class Point:
    """One measurement: ``n`` calls at ``concurrency`` on ``core``."""

    core: str
    concurrency: int
    round: int
    n: int
    wall_s: float
    cpu_s: float
    system_share: float  # of the CPU ticks counted meanwhile, the kernel's
    load: float  # the 1-minute load average when it ended

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / self.n * 1e6

    @property
    def wall_us(self) -> float:
        return self.wall_s / self.n * 1e6


def order(cores: list[str], rounds: int) -> list[list[str]]:
    """Each round's order of turns: the cores, then the same in reverse (A B C C B A)."""
    return [cores + cores[::-1] for _ in range(rounds)]


def command(server: str, port: int, repo: Path, url: str) -> list[str]:
    core = server.removesuffix(CANNED)
    if server == "gevent" + CANNED:
        return [sys.executable, str(BENCH / "http_core_app.py"), "gevent", str(port)]
    if core == "gevent":
        listen = ["--http-address", "127.0.0.1", "--http-port", str(port)]
        listen += ["--metrics-port", str(redis_server.free_port())]
        return conch("gateway", "--model-repository", str(repo), "--redis-url", url, *listen)
    if core == "granian":
        return [
            sys.executable, "-m", "granian", "--interface", "rsgi", "--http", "1",
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--runtime-threads", "1", "--runtime-mode", "st", "--loop", "uvloop", "--no-ws",
            "--task-impl", os.environ.get("GRANIAN_TASK_IMPL", "asyncio"),
            "--log-level", "warning", "http_core_app:rsgi",
        ]  # fmt: skip
    if core == "uvicorn":
        return [sys.executable, str(BENCH / "http_core_app.py"), "uvicorn", str(port)]
    raise ValueError(f"unknown core {core!r}")


def summary(points: list[Point]) -> str:
    """One row per core and concurrency: every turn's CPU µs a request, their median,
    the median wall µs a request, and the load averages seen."""
    lines = [
        "| server | c | CPU µs/req, each turn | median CPU µs/req | kernel's share "
        "| median wall µs/req | load |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    seen: list[tuple[int, str]] = []
    for p in points:
        if (p.concurrency, p.core) not in seen:
            seen.append((p.concurrency, p.core))
    seen.sort(key=lambda k: (k[1].endswith(CANNED), k[0]))  # the full path first, by c
    for c, core in seen:
        mine = [p for p in points if (p.core, p.concurrency) == (core, c)]
        turns = ", ".join(f"{p.cpu_us:.0f}" for p in mine)
        cpu = statistics.median(p.cpu_us for p in mine)
        kernel = statistics.median(p.system_share for p in mine)
        wall = statistics.median(p.wall_us for p in mine)
        loads = f"{min(p.load for p in mine):.1f} to {max(p.load for p in mine):.1f}"
        lines.append(
            f"| {core} | {c} | {turns} | {cpu:.0f} | {100 * kernel:.0f} % | {wall:.0f} | {loads} |"
        )
    return "\n".join(lines)


def ticks(pids: list[int]) -> tuple[int, int]:
    """User and system clock ticks of ``pids`` so far (/proc/<pid>/stat)."""
    user = system = 0
    for pid in pids:
        fields = procs._stat_fields(pid)
        if fields is not None and len(fields) > 12:
            user, system = user + int(fields[11]), system + int(fields[12])
    return user, system


def run(args: argparse.Namespace) -> list[Point]:
    logs = args.json.parent / f"{args.json.stem}-logs"
    private = redis_server.start_private(unix_socket=True)
    points: list[Point] = []
    try:
        with procs.Group(logs) as group, tempfile.TemporaryDirectory(prefix="cores-") as tmp:
            group.guard("redis-server", private.process.pid)
            repo = Path(tmp)
            drain.write_repository(repo)
            url = private.url
            group.start(
                "stand-in", [sys.executable, drain.__file__, "--stand-in", url, drain.GATEWAY_MODEL]
            )
            path = os.pathsep.join([str(ROOT / "platform"), str(BENCH), args.site])
            env = {"CORE_REDIS_URL": url, "CORE_REPOSITORY": str(repo), "PYTHONPATH": path}
            canned = {**env, "CORE_CANNED": "1"}
            ports, sessions = {}, {}
            for core in args.servers:
                ports[core] = redis_server.free_port()
                # conch's venv alone for the gateway
                mine = None if core == "gevent" else canned if core.endswith(CANNED) else env
                child = group.start(
                    core.replace(" ", "-"),
                    command(core, ports[core], repo, url),
                    env=mine,
                    cwd=BENCH,
                )
                sessions[core] = child.pid
            call = drain.infer_call(drain.GATEWAY_MODEL, SIZE)
            for core in args.servers:
                ready = f"http://127.0.0.1:{ports[core]}/v2/models/{drain.GATEWAY_MODEL}/ready"
                if core == "gevent":
                    procs.wait_until(lambda u=ready: drain.http_ok(u), 120, group, f"{core} ready")
                else:  # the prototypes answer infer only: the first call proves them ready
                    procs.wait_until(
                        lambda c=core: _answers(ports[c], call), 120, group, f"{core} ready"
                    )
            for r, turns in enumerate(order(args.servers, args.rounds)):
                for c in args.concurrency:
                    for core in turns:
                        drain.drive(ports[core], call, 4 * c, c)  # warm
                        group.check_alive()
                        pids = procs.session_pids(sessions[core])
                        before, user0, system0 = procs.on_cpu_seconds(pids), *ticks(pids)
                        wall = drain.drive(ports[core], call, args.n, c)
                        cpu = procs.on_cpu_seconds(pids) - before
                        user, system = ticks(pids)
                        share = (system - system0) / max(1, user - user0 + system - system0)
                        load = float(Path("/proc/loadavg").read_text().split()[0])
                        point = Point(core, c, r, args.n, wall, cpu, share, load)
                        points.append(point)
                        drain.say(
                            f"round {r}, {core}, c={c}: {point.cpu_us:.0f} µs CPU/req, "
                            f"{point.wall_us:.0f} µs wall/req, load {load:.1f}"
                        )
    finally:
        private.stop()
    return points


def _answers(port: int, call: bytes) -> bool:
    try:
        drain.drive(port, call, 1, 1)
    except RuntimeError:
        return False
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--site", required=True, help="where granian, uvicorn, httptools, uvloop are")
    p.add_argument("--n", type=int, default=2000, help="calls a turn (default 2000)")
    p.add_argument("--concurrency", default="1,16,64", help="default 1,16,64")
    p.add_argument("--rounds", type=int, default=1, help="rounds of A B C C B A (default 1)")
    p.add_argument("--cores", default=",".join(CORES), help=f"default {','.join(CORES)}")
    p.add_argument(
        "--canned",
        action="store_true",
        help="also each core alone, answering canned bytes (no conch code, no Redis)",
    )
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"default {DEFAULT_JSON}")
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.cores = [c for c in args.cores.split(",") if c.strip()]
    if unknown := set(args.cores) - set(CORES):
        p.error(f"unknown cores: {sorted(unknown)}")
    args.servers = args.cores + ([c + CANNED for c in args.cores] if args.canned else [])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    points = run(args)
    print(
        f"\nthe gateway's CPU per request by HTTP core ({os.cpu_count()} CPUs, 1 KiB, "
        f"N = {args.n} a turn, {args.rounds} round(s) of A B C C B A):\n"
    )
    print(summary(points))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "argv": sys.argv[1:],
        "at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "points": [{**asdict(p), "cpu_us": p.cpu_us, "wall_us": p.wall_us} for p in points],
    }
    args.json.write_text(json.dumps(document, indent=2))
    print(f"\n(results: {args.json}; took {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
