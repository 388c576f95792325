#!/usr/bin/env python3
"""A decoupled model's response streams (issue 30, point 6): conch against NVIDIA Triton.

    make bench                                        # after bench/sequences.py
    make bench STREAM_BENCH_ARGS="--quick"
    .venv/bin/python bench/streaming.py --streams 1,4 --rounds 2 --profile

The model is Triton python_backend's ``repeat`` example, the vendored files as they are
(tests/third_party/triton_python_backend_examples/examples/decoupled/repeat_model.py and
repeat_config.pbtxt): a request's IN holds ``--responses`` int32 values (default 1,000),
DELAY as many zeros and WAIT zero, and the model sends one response per value from a
thread of its own, then the final flag alone. Both servers serve the same repository at
once and are measured in turn (A B B A ...), so the machine's drift hits them alike:

- Triton: ``tritonserver`` from ``make triton``'s venv, its gRPC frontend;
- conch: a private redis-server on a Unix socket, one ``conch worker``, one ``conch grpc``.

The client is stock ``tritonclient.grpc`` in this process: each stream is a client of its
own (``start_stream``, then ``async_stream_infer`` with ``enable_empty_final_response``),
sending its next request as soon as the previous one's final response came. A point runs
``--streams`` such streams at once for ``--window-s`` seconds (after one request per
stream unmeasured), the requests still open then running to their end. It reports:

- responses/s: the responses that came, over the time from the first request sent to the
  last final response;
- first response (p50): from sending a request to its first response;
- gap p99: between consecutive responses of one request, as the client sees them;
- CPU microseconds per response: the server's processes and this client's.

Each point pools its rounds. ``--profile`` then records py-spy on conch's gRPC server and
worker during one more conch window, and prints their top frames (bench/pyspy_top.py).

Progress goes to stderr, the tables to stdout; logs and ``results.json`` to
``.cache/bench/runs/stream-<time>/``. Exit status: 0 when the tables were printed, 2 when the
benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import procs  # noqa: E402
import pyspy_top  # noqa: E402
import run  # noqa: E402
import text_embedding  # noqa: E402

from conch.devtools.processes import conch  # noqa: E402

EXAMPLE = ROOT / "tests" / "third_party" / "triton_python_backend_examples" / "examples"
MODEL = "repeat_int32"  # the name in the example's config
MODEL_FILES = {  # the example's file -> where a Triton repository holds it
    "decoupled/repeat_model.py": f"{MODEL}/1/model.py",
    "decoupled/repeat_config.pbtxt": f"{MODEL}/config.pbtxt",
}
SERVERS = ("triton", "conch")
CLIENT = "client"  # this process, in a window's CPU by process
RESPONSES_GOAL = 0.8  # conch's responses/s over Triton's, at least
FIRST_GOAL_MS = 1.0  # conch's first response p50 minus Triton's, at most
REQUEST_TIMEOUT_S = 60.0


def say(msg: str) -> None:
    run.say(msg)


# --------------------------------------------------------------------------- the model


def build_repository(dest: Path, example: Path = EXAMPLE) -> Path:
    """``dest`` laid out as the example's README lays out its repository, the files copied."""
    for source, target in MODEL_FILES.items():
        path = dest / target
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(example / source, path)
    return dest


def request_arrays(responses: int) -> dict[str, np.ndarray]:
    """The inputs of a request asking for ``responses`` responses, none of them delayed."""
    return {
        "IN": np.arange(responses, dtype=np.int32),
        "DELAY": np.zeros(responses, np.uint32),
        "WAIT": np.zeros(1, np.uint32),
    }


# --------------------------------------------------------------------------- results


@dataclass
class Request:
    """One request as the client saw it: when it went, when each response came."""

    sent: float
    arrivals: list[float] = field(default_factory=list)
    error: str | None = None


@dataclass
class Window:
    """One server's point in one round: its requests and what they cost."""

    server: str
    streams: int
    requests: list[Request]
    seconds: float  # first request sent to the last final response
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds


@dataclass
class Point:
    """A server's point, its rounds pooled."""

    server: str
    streams: int
    requests: int = 0
    responses: int = 0
    errors: int = 0
    responses_per_s: float | None = None
    first_p50_ms: float | None = None
    gap_p50_ms: float | None = None
    gap_p99_ms: float | None = None
    cpu_us: dict[str, float] = field(default_factory=dict)  # process -> CPU us a response

    @property
    def server_cpu_us(self) -> float | None:
        server = [v for k, v in self.cpu_us.items() if k != CLIENT]
        return sum(server) if server else None

    @property
    def client_cpu_us(self) -> float | None:
        return self.cpu_us.get(CLIENT)


def pool(windows: list[Window]) -> Point:
    """The point of one server at one stream count from its rounds' windows (at least one).
    Requests that failed count only as errors; their responses are not counted."""
    first = windows[0]
    point = Point(first.server, first.streams)
    firsts: list[float] = []
    gaps: list[np.ndarray] = []
    seconds = 0.0
    cpu: dict[str, float] = {}
    for w in windows:
        seconds += w.seconds
        for name, spent in w.cpu_s.items():
            cpu[name] = cpu.get(name, 0.0) + spent
        for r in w.requests:
            point.requests += 1
            if r.error is not None:
                point.errors += 1
                continue
            point.responses += len(r.arrivals)
            if r.arrivals:
                firsts.append(r.arrivals[0] - r.sent)
                gaps.append(np.diff(np.asarray(r.arrivals)))
    if point.responses and seconds > 0:
        point.responses_per_s = point.responses / seconds
        point.cpu_us = {name: 1e6 * spent / point.responses for name, spent in cpu.items()}
    if firsts:
        point.first_p50_ms = 1e3 * float(np.percentile(firsts, 50))
    every_gap = np.concatenate(gaps) if gaps else np.empty(0)
    if every_gap.size:
        point.gap_p50_ms = 1e3 * float(np.percentile(every_gap, 50))
        point.gap_p99_ms = 1e3 * float(np.percentile(every_gap, 99))
    return point


def order(rounds: int) -> list[str]:
    """The servers' turns at one point: A B, B A, A B, ..."""
    return [s for i in range(rounds) for s in (SERVERS if i % 2 == 0 else SERVERS[::-1])]


@dataclass
class Results:
    windows: list[Window] = field(default_factory=list)
    profiles: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def point(self, server: str, streams: int) -> Point | None:
        done = [w for w in self.windows if (w.server, w.streams) == (server, streams)]
        return pool(done) if done else None


# --------------------------------------------------------------------------- the client


class Stream:
    """One gRPC stream of the stock client, one request on it at a time."""

    def __init__(self, url: str, responses: int) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import np_to_triton_dtype

        self.expected = responses
        self.inputs = []
        for name, array in request_arrays(responses).items():
            tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            self.inputs.append(tensor)
        self.client = grpcclient.InferenceServerClient(url)
        self.current: Request | None = None
        self.done = threading.Event()
        self.client.start_stream(callback=self._answer)

    def _answer(self, result: Any, error: Any) -> None:
        now = time.perf_counter()
        request = self.current
        if request is None:
            return
        if error is not None:
            request.error = str(error)
            self.done.set()
            return
        response = result.get_response()
        if response.outputs:
            request.arrivals.append(now)
        final = response.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            self.done.set()

    def one(self) -> Request:
        """Send a request and wait for its final response."""
        request = self.current = Request(time.perf_counter())
        self.done.clear()
        self.client.async_stream_infer(MODEL, self.inputs, enable_empty_final_response=True)
        if not self.done.wait(REQUEST_TIMEOUT_S):
            request.error = f"no final response within {REQUEST_TIMEOUT_S:.0f} s"
        elif request.error is None and len(request.arrivals) != self.expected:
            request.error = f"{len(request.arrivals)} responses, not {self.expected}"
        self.current = None
        return request

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def drive(streams: list[Stream], window_s: float) -> tuple[list[Request], float]:
    """Every stream sends request after request for ``window_s``; the requests and the
    seconds from the first sent to the last ended."""
    for s in streams:  # unmeasured: the first request of a stream warms its path
        s.one()
    done: list[list[Request]] = [[] for _ in streams]
    start = time.perf_counter()
    deadline = start + window_s

    def loop(stream: Stream, out: list[Request]) -> None:
        while time.perf_counter() < deadline:
            request = stream.one()
            out.append(request)
            if request.error is not None and request.error.startswith("no final"):
                break  # the stream is stuck; its other requests would wait as long

    threads = [threading.Thread(target=loop, args=pair) for pair in zip(streams, done, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for out in done for r in out], time.perf_counter() - start


def measure(server: str, url: str, streams: int, args: argparse.Namespace, cpu: Any) -> Window:
    """One window of ``streams`` streams against ``url``; ``cpu()`` gives the CPU seconds
    of the server's processes so far, by process."""
    opened = [Stream(url, args.responses) for _ in range(streams)]
    try:
        cpu0, client0 = cpu(), time.process_time()
        requests, seconds = drive(opened, args.window_s)
        window = Window(server, streams, requests, seconds)
        cpu1 = cpu()
        window.cpu_s = {name: cpu1[name] - cpu0[name] for name in cpu0}
        window.cpu_s[CLIENT] = time.process_time() - client0
    finally:
        for s in opened:
            s.close()
    return window


# --------------------------------------------------------------------------- the servers


@dataclass
class Served:
    url: str  # host:port of its gRPC frontend
    sessions: dict[str, int]  # process -> the session leader whose session it is
    alone: dict[str, int] = field(default_factory=dict)  # process -> a pid out of those
    pyspy_pids: dict[str, int] = field(default_factory=dict)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far by process: each session's, less the pids named alone,
        which count by themselves."""
        sessions = procs.cpu_seconds(sessions=list(self.sessions.values()))
        pids = procs.cpu_seconds(pids=list(self.alone.values()))
        out = {name: sessions[leader] for name, leader in self.sessions.items()}
        for name, pid in self.alone.items():
            out[name] = pids[pid]
            for session, leader in self.sessions.items():
                if _session(pid) == leader:
                    out[session] -= pids[pid]
        return out


def _session(pid: int) -> int | None:
    fields = procs._stat_fields(pid)
    return int(fields[3]) if fields and len(fields) > 3 else None


def grpc_ready(url: str) -> bool:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        return bool(client.is_model_ready(MODEL))
    except Exception:
        return False
    finally:
        client.close()


def start_triton(group: procs.Group, repo: Path) -> Served:
    """``make triton``'s tritonserver serving ``repo``, gRPC on 127.0.0.1, as bench/run.py
    starts it (the same environment for its Python backend stub)."""
    from conch.devtools.redis_server import free_port

    layout = run.triton_layout()
    tdir = Path(layout["purelib"]) / "pytriton" / "tritonserver"
    port = free_port()
    cmd = [str(tdir / "bin" / "tritonserver"), "--model-repository", str(repo)]
    cmd += ["--backend-directory", str(tdir / "backends")]
    cmd += ["--cache-directory", str(tdir / "caches")]
    cmd += ["--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--allow-http", "false"]
    cmd += ["--allow-metrics", "false", "--allow-gpu-metrics", "false"]
    cmd += ["--exit-timeout-secs", "5"]
    libs = (layout["libdir"], str(Path(layout["purelib"]) / "nvidia_pytriton.libs"))
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join((*libs, os.environ.get("LD_LIBRARY_PATH", ""))),
        "PATH": f"{run.TRITON_VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": "",
    }
    server = group.start("tritonserver", cmd, env=env)
    # Its Python backend stub processes are in its session.
    return Served(f"127.0.0.1:{port}", {"stub": server.pid}, {"tritonserver": server.pid})


@contextmanager
def private_redis() -> Iterator[Any]:
    """A private redis-server on a Unix socket (as ``conch serve`` starts it), stopped last."""
    from conch.devtools import redis_server

    private = redis_server.start_private(unix_socket=True)
    try:
        yield private
    finally:
        private.stop()


def start_conch(group: procs.Group, repo: Path, private: Any) -> Served:
    """One worker and one ``conch grpc`` on ``private``'s Redis, serving ``repo``."""
    from conch.devtools.redis_server import free_port

    group.guard("redis-server", private.process.pid)
    common = ["--model-repository", str(repo), "--redis-url", private.url]
    worker = group.start("conch-worker", conch("worker", *common))
    port = free_port()
    grpc = ["--grpc-address", "127.0.0.1", "--grpc-port", str(port)]
    server = group.start("conch-grpc", conch("grpc", *common, *grpc))
    return Served(
        f"127.0.0.1:{port}",
        {"grpc": server.pid, "worker": worker.pid},
        {"redis": private.process.pid},
        {"grpc": server.pid, "worker": worker.pid},
    )


def bench(args: argparse.Namespace, run_dir: Path, results: Results) -> None:
    repo = build_repository(run_dir / "repo")
    with private_redis() as private, procs.Group(run_dir / "logs") as group:
        served = {"conch": start_conch(group, repo, private)}
        if not args.skip_triton:
            served["triton"] = start_triton(group, repo)
        for name, s in served.items():
            say(f"{name}: waiting for {MODEL} on {s.url}")
            procs.wait_until(lambda s=s: grpc_ready(s.url), 180, group, f"{name} readiness")
        for streams in args.streams:
            for server in order(args.rounds):
                if server not in served:
                    continue
                group.check_alive()
                say(f"{server}: {streams} stream(s), {args.window_s:g} s")
                window = measure(server, served[server].url, streams, args, served[server].cpu)
                results.windows.append(window)
                _say_window(window)
        if args.profile:
            profile(args, served["conch"], run_dir, results)


def _say_window(window: Window) -> None:
    p = pool([window])
    if p.responses_per_s is None:
        say(f"  -> FAILED: {p.errors} of {p.requests} requests failed")
        return
    say(
        f"  -> {p.responses_per_s:,.0f} responses/s, first {p.first_p50_ms:.2f} ms, "
        f"gap p99 {p.gap_p99_ms:.3f} ms, {p.requests} requests, {p.errors} failed"
    )


def profile(args: argparse.Namespace, served: Served, run_dir: Path, results: Results) -> None:
    """py-spy on conch's gRPC server and worker, both at once, over one more window."""
    streams = args.streams[-1]
    seconds = max(args.window_s, args.profile_s)
    say(f"conch: profiling {', '.join(served.pyspy_pids)} at {streams} stream(s), {seconds:g} s")
    profiled = argparse.Namespace(**{**vars(args), "window_s": seconds})
    with ExitStack() as spies:
        for name, pid in served.pyspy_pids.items():
            out = run_dir / f"pyspy-{name}.txt"
            spies.enter_context(text_embedding.pyspy(pid, seconds, out, True))
        measure("conch", served.url, streams, profiled, served.cpu)
    for name in served.pyspy_pids:
        raw = run_dir / f"pyspy-{name}.txt"
        if raw.exists():
            results.profiles[f"conch {name}, {streams} stream(s)"] = pyspy_top.summarise(raw, 20)


# --------------------------------------------------------------------------- report


def _cells(p: Point | None) -> list[str]:
    if p is None:
        return ["n/a"] * 5
    if p.responses_per_s is None:
        return [f"failed ({p.errors} of {p.requests})", "", "", "", ""]
    return [
        f"{p.responses_per_s:,.0f}",
        f"{p.first_p50_ms:.2f}",
        f"{p.gap_p99_ms:.3f}",
        run._f(p.server_cpu_us, ".0f"),
        run._f(p.client_cpu_us, ".0f"),
    ]


def goals(conch_point: Point | None, triton: Point | None) -> tuple[str, str]:
    """Issue 30's two goals at one point: (responses/s ratio, first response difference),
    each with its verdict, or "n/a" where a server did not answer."""
    if not (conch_point and triton and conch_point.responses_per_s and triton.responses_per_s):
        return "n/a", "n/a"
    ratio = conch_point.responses_per_s / triton.responses_per_s
    delta = conch_point.first_p50_ms - triton.first_p50_ms
    rate = f"{ratio:.2f} ({'met' if ratio >= RESPONSES_GOAL else 'missed'})"
    first = f"{delta:+.2f} ms ({'met' if delta <= FIRST_GOAL_MS else 'missed'})"
    return rate, first


def report(results: Results, args: argparse.Namespace) -> str:
    lines = [
        f"Decoupled model {MODEL} (python_backend's repeat example), {args.responses:,} "
        f"responses a request, DELAY 0, WAIT 0; stock tritonclient.grpc streams, "
        f"{args.window_s:g} s windows, {args.rounds} round(s) in A B B A order",
        "",
        "| streams | server | responses/s | first response p50 ms | gap p99 ms "
        "| server CPU us/response | client CPU us/response | conch ÷ Triton responses/s "
        "| conch - Triton first response |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for streams in args.streams:
        triton = results.point("triton", streams)
        conch_point = results.point("conch", streams)
        rate, first = goals(conch_point, triton)
        for server, p in (("Triton", triton), ("conch", conch_point)):
            if p is None and server == "Triton" and args.skip_triton:
                continue
            tail = [rate, first] if server == "conch" else ["", ""]
            lines.append(f"| {streams} | {server} | " + " | ".join(_cells(p) + tail) + " |")
    lines += ["", "CPU microseconds per response, by process:", ""]
    for streams in args.streams:
        for server in SERVERS:
            p = results.point(server, streams)
            if p is not None and p.cpu_us:
                split = ", ".join(f"{k} {v:.0f}" for k, v in p.cpu_us.items())
                lines.append(f"- {server}, {streams} stream(s): {split}")
    lines += [
        "",
        f"goals (issue 30): conch >= {RESPONSES_GOAL}x Triton's responses/s; "
        f"first response p50 within {FIRST_GOAL_MS:g} ms of Triton's",
    ]
    for p in (results.point(s, n) for n in args.streams for s in SERVERS):
        if p is not None and p.errors:
            lines.append(f"note: {p.server}, {p.streams} stream(s): {p.errors} failed requests")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="2 s windows, 1 round (default 5 s, 2)")
    p.add_argument(
        "--streams", type=text_embedding.positive_ints, default="1,4", help="e.g. 1,4 (default)"
    )
    p.add_argument("--responses", type=int, default=1000, help="responses a request")
    p.add_argument("--window-s", type=float, default=None, help="seconds per window")
    p.add_argument("--rounds", type=int, default=None, help="A B rounds of each point")
    p.add_argument("--skip-triton", action="store_true", help="conch alone")
    p.add_argument("--profile", action="store_true", help="py-spy conch's grpc and worker")
    p.add_argument("--profile-s", type=float, default=10, help="seconds of the profile")
    args = p.parse_args(argv)
    if args.responses < 1:
        p.error("--responses takes a positive integer")
    args.window_s = args.window_s or (2.0 if args.quick else 5.0)
    args.rounds = args.rounds or (1 if args.quick else 2)
    return args


def _as_json(results: Results) -> dict[str, Any]:
    points = [
        {**vars(p), "server_cpu_us": p.server_cpu_us}
        for p in (results.point(s, n) for n in results.settings.get("streams", []) for s in SERVERS)
        if p is not None
    ]
    return {"points": points, "profiles": results.profiles, "settings": results.settings}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, run._interrupt)
    started = time.monotonic()
    run_dir = run.CACHE / "runs" / time.strftime("stream-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    results = Results()
    results.settings = {
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpus": os.cpu_count(),
        "streams": args.streams,
        "loadavg_before": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }
    busy = run.cpu_busy_fraction()
    if busy is not None and busy > 0.25:
        say(f"warning: the CPUs were {100 * busy:.0f}% busy with other work before the run")
    results.settings["cpu_busy_before"] = busy
    try:
        bench(args, run_dir, results)
    except KeyboardInterrupt:
        say("interrupted: the processes it started are stopped")
        return 130
    except Exception:
        traceback.print_exc(file=sys.stderr)
        say("the streaming benchmark failed (above); results.json has what was measured")
        return 2
    finally:
        results.settings["loadavg_after"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
        (run_dir / "results.json").write_text(json.dumps(_as_json(results), indent=2))
    print(report(results, args))
    for name, text in results.profiles.items():
        print(f"\npy-spy, {name}:\n{text}")
    s = results.settings
    busy_text = "n/a" if busy is None else f"{100 * busy:.0f}%"
    print(
        f"\n{s['started']}; {s['cpus']} CPUs, {busy_text} busy before; load average before "
        f"{s['loadavg_before']}, after {s['loadavg_after']}; results in {run_dir} "
        f"(took {time.monotonic() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
