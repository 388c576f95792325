#!/usr/bin/env python3
"""Issue 28 point 3: gRPC in a process of its own, or in the gateway's processes?

    .venv/bin/python bench/grpc_process_model.py
    .venv/bin/python bench/grpc_process_model.py --setups A1,B1,B2 --rounds 2 --window-ms 2000
    .venv/bin/python bench/grpc_process_model.py --setups A2,B2 --concurrency 16,64 --models mlp

Setups, each over one private redis-server (Unix socket) and one ``conch worker`` that
live for the whole run (only the frontends are started and stopped for each setup):

- ``A<n>``: today: ``conch gateway --http-workers n`` and ``conch grpc --grpc-workers n``
  (h2 transport): 2n frontend processes (plus gunicorn's master, plus the supervisor of
  ``conch grpc`` when n > 1);
- ``B<n>``: ``conch gateway --http-workers n --grpc-in-gateway=true``: each of the n
  gunicorn workers serves gRPC on the same port (SO_REUSEPORT) from its own data plane.

For each setup it measures, with perf_analyzer in time windows: ``-i grpc`` on each model
at each concurrency (infer/s, p50, and the CPU milliseconds per request of the frontend
processes, of the worker and of Redis: /proc utime+stime of the processes' sessions,
over the requests the model's statistics counted); ``-i http`` at ``--http-concurrency``
(does HTTP suffer with gRPC beside it?); and, with ``--mixed``, HTTP and gRPC at
``--http-concurrency`` each at once, on the first model. Setups run in mirrored order
round after round (A B B A ...) since this machine drifts; every run's row is printed
(markdown), then the means by setup. CSVs and logs: ``.cache/bench/process-model/<time>/``.

The gateway takes no ``--grpc-*`` flag, so ``B`` runs it through this script
(``gateway`` below), which sets the gRPC address and port on its Settings.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import procs  # noqa: E402
from run import PaOptions, Point, run_perf_analyzer, write_input_data  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402

LOCAL = "127.0.0.1"
OUT = ROOT / ".cache" / "bench" / "process-model"


def gateway_main(grpc_port: int, argv: list[str]) -> int:
    """``conch gateway <argv>`` with its gRPC on ``127.0.0.1:grpc_port`` (the gateway
    role has no ``--grpc-port``)."""
    from conch import cli, server_log
    from conch.settings import Settings

    settings = Settings.from_args(cli.parser().parse_args(["gateway", *argv]))
    settings.grpc_address, settings.grpc_port = LOCAL, grpc_port
    server_log.configure(settings)
    return cli.gateway(settings)


@dataclass
class Frontends:
    setup: str
    http: str  # host:port
    grpc: str
    sessions: list[int]  # the frontends' process sessions


def start_frontends(
    group: procs.Group, setup: str, common: list[str], log_tag: str
) -> tuple[Frontends, list[procs.Child]]:
    kind, n = setup[0], int(setup[1:])
    http_port, grpc_port = _free_port(), _free_port()
    gw = [
        *common,
        *("--http-address", LOCAL, "--http-port", str(http_port)),
        *("--http-workers", str(n), "--allow-metrics", "false"),
    ]
    if kind == "A":
        children = [
            group.start(f"gateway-{log_tag}", conch("gateway", *gw)),
            group.start(
                f"grpc-{log_tag}",
                conch(
                    "grpc",
                    *common,
                    *("--grpc-address", LOCAL, "--grpc-port", str(grpc_port)),
                    *("--grpc-workers", str(n), "--grpc-transport", "h2"),
                ),
            ),
        ]
    elif kind == "B":
        cmd = [sys.executable, __file__, "gateway", str(grpc_port), *gw, "--grpc-in-gateway=true"]
        children = [group.start(f"gateway-{log_tag}", cmd)]
    else:
        raise SystemExit(f"unknown setup {setup!r}: A<n> or B<n>")
    fronts = Frontends(
        setup, f"{LOCAL}:{http_port}", f"{LOCAL}:{grpc_port}", [c.pid for c in children]
    )
    return fronts, children


def _free_port() -> int:
    from conch.devtools import redis_server

    return redis_server.free_port()


def _successes(http_url: str, model: str) -> int:
    """The model's successful requests so far (statistics extension), either frontend's."""
    url = f"http://{http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return int(json.load(resp)["model_stats"][0]["inference_stats"]["success"]["count"])


def _ready(fronts: Frontends, models: list[str]) -> bool:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    try:
        h = httpclient.InferenceServerClient(fronts.http)
        g = grpcclient.InferenceServerClient(fronts.grpc)
        try:
            return all(h.is_model_ready(m) and g.is_model_ready(m) for m in models)
        finally:
            h.close()
            g.close()
    except Exception:
        return False


@dataclass
class Row:
    round: int
    setup: str
    what: str  # "grpc", "http" or "mixed"
    model: str
    concurrency: int
    infer_per_s: float | None
    p50_ms: float | None
    frontend_ms: float | None  # CPU ms per request, all frontend processes
    worker_ms: float | None
    redis_ms: float | None
    grpc_infer_per_s: float | None = None  # mixed: each side's
    http_infer_per_s: float | None = None
    error: str = ""


def measure(
    pa: PaOptions,
    fronts: Frontends,
    runs: list[tuple[str, str]],  # (protocol, url) run at once
    model: str,
    concurrency: int,
    out_dir: Path,
    cpu_ids: dict[str, int],
    tag: str,
) -> tuple[list[Point], dict[str, float], int]:
    """perf_analyzer(s) at once; their points, CPU ms/request by name, requests served."""
    sessions = [*fronts.sessions, cpu_ids["worker"]]
    count0 = _successes(fronts.http, model)
    cpu0 = procs.cpu_seconds(pids=[cpu_ids["redis"]], sessions=sessions)
    points: list[Point] = [None] * len(runs)  # type: ignore[list-item]

    def one(i: int, protocol: str, url: str) -> None:
        points[i] = run_perf_analyzer(
            pa, url, model, concurrency, out_dir, f"{tag}-{protocol}", json=False, protocol=protocol
        )

    threads = [
        threading.Thread(target=one, args=(i, protocol, url))
        for i, (protocol, url) in enumerate(runs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1 = procs.cpu_seconds(pids=[cpu_ids["redis"]], sessions=sessions)
    served = max(1, _successes(fronts.http, model) - count0)
    front = sum(cpu1[s] - cpu0[s] for s in fronts.sessions)
    ms = {
        "frontend": 1000 * front / served,
        "worker": 1000 * (cpu1[cpu_ids["worker"]] - cpu0[cpu_ids["worker"]]) / served,
        "redis": 1000 * (cpu1[cpu_ids["redis"]] - cpu0[cpu_ids["redis"]]) / served,
    }
    return points, ms, served


def order(setups: list[str], rounds: int) -> list[tuple[int, str]]:
    """Mirrored rounds: A B, B A, A B, ... (ABBA for two setups)."""
    return [(r, s) for r in range(1, rounds + 1) for s in (setups if r % 2 else setups[::-1])]


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def print_row(row: Row) -> None:
    extra = ""
    if row.what == "mixed":
        extra = f" (gRPC {_fmt(row.grpc_infer_per_s, ',.0f')} + HTTP {_fmt(row.http_infer_per_s, ',.0f')})"
    print(
        f"| {row.round} | {row.setup} | {row.what} | {row.model} | {row.concurrency} "
        f"| {_fmt(row.infer_per_s, ',.0f')}{extra} | {_fmt(row.p50_ms, '.2f')} "
        f"| {_fmt(row.frontend_ms, '.3f')} | {_fmt(row.worker_ms, '.3f')} "
        f"| {_fmt(row.redis_ms, '.3f')} |{' ' + row.error if row.error else ''}",
        flush=True,
    )


def print_means(rows: list[Row], setups: list[str]) -> None:
    print("\nMeans over the rounds (infer/s; p50 ms; frontend CPU ms/req):\n")
    print("| what | model | conc | " + " | ".join(setups) + " |")
    print("|---|---|---|" + "---|" * len(setups))
    keys = sorted(
        {(r.what, r.model, r.concurrency) for r in rows},
        key=lambda k: (["grpc", "http", "mixed"].index(k[0]), k[1], k[2]),
    )
    for what, model, conc in keys:
        cells = []
        for setup in setups:
            got = [
                r
                for r in rows
                if (r.what, r.model, r.concurrency, r.setup) == (what, model, conc, setup)
                and r.infer_per_s is not None
            ]
            if not got:
                cells.append("—")
                continue
            rate = statistics.mean(r.infer_per_s for r in got)  # type: ignore[misc]
            p50 = statistics.mean(r.p50_ms for r in got if r.p50_ms is not None)
            cpu = statistics.mean(r.frontend_ms for r in got if r.frontend_ms is not None)
            cells.append(f"{rate:,.0f}; {p50:.2f}; {cpu:.3f}")
        print(f"| {what} | {model} | {conc} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gateway"]:
        return gateway_main(int(argv[1]), argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setups", default="A1,B1", help="A<n> and B<n>, comma-separated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--models", default="mlp,add_sub")
    p.add_argument("--concurrency", default="1,16,64", help="gRPC's levels")
    p.add_argument("--http-concurrency", type=int, default=16, help="0: no HTTP run")
    p.add_argument("--mixed", action="store_true", help="HTTP and gRPC at once, first model")
    p.add_argument("--window-ms", type=int, default=2000)
    p.add_argument("--max-trials", type=int, default=3)
    args = p.parse_args(argv)
    setups = args.setups.split(",")
    models = args.models.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]

    from conch.devtools import redis_server

    run_dir = OUT / time.strftime("%Y%m%d-%H%M%S")
    repo = run_dir / "repo"
    for model in models:
        shutil.copytree(ROOT / "functions" / model, repo / model)
    # Accepting any three windows: the windows' spread is the noise this script averages.
    pa = PaOptions(perf_analyzer.binary(), args.window_ms, 1000, args.max_trials)
    for model in models:
        pa.input_files[model] = write_input_data(repo, model, run_dir / f"input-{model}.json")
    print(f"# {' '.join(sys.argv)}\n# {run_dir}\n")
    print(
        "| round | setup | what | model | conc | infer/s | p50 ms | frontend CPU ms/req "
        "| worker CPU ms/req | redis CPU ms/req |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows: list[Row] = []
    private = redis_server.start_private(unix_socket=True)
    try:
        with procs.Group(run_dir / "logs") as group:
            group.guard("redis-server", private.process.pid)
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            worker = group.start("worker", conch("worker", *common))
            cpu_ids = {"worker": worker.pid, "redis": private.process.pid}
            for n, (rnd, setup) in enumerate(order(setups, args.rounds)):
                fronts, children = start_frontends(group, setup, common, f"{setup}-{n}")
                try:
                    procs.wait_until(lambda f=fronts: _ready(f, models), 180, group, setup)
                    plan: list[tuple[str, str, int]] = [
                        ("grpc", m, c) for m in models for c in levels
                    ]
                    if args.http_concurrency:
                        plan += [("http", m, args.http_concurrency) for m in models]
                    if args.mixed:
                        plan.append(("mixed", models[0], args.http_concurrency or 16))
                    for what, model, conc in plan:
                        group.check_alive()
                        runs = {
                            "grpc": [("grpc", fronts.grpc)],
                            "http": [("http", fronts.http)],
                            "mixed": [("grpc", fronts.grpc), ("http", fronts.http)],
                        }[what]
                        tag = f"{setup}-r{rnd}-{what}"
                        points, ms, _ = measure(
                            pa, fronts, runs, model, conc, run_dir, cpu_ids, tag
                        )
                        rates = [pt.infer_per_s for pt in points]
                        row = Row(
                            rnd,
                            setup,
                            what,
                            model,
                            conc,
                            None if None in rates else sum(rates),  # type: ignore[arg-type]
                            points[0].p50_ms,
                            ms["frontend"],
                            ms["worker"],
                            ms["redis"],
                            error="; ".join(pt.error for pt in points if pt.error),
                        )
                        if what == "mixed":
                            row.grpc_infer_per_s, row.http_infer_per_s = rates
                        rows.append(row)
                        print_row(row)
                finally:
                    for child in reversed(children):
                        child.stop()
                        group.children.remove(child)
    finally:
        private.stop()
    print_means(rows, setups)
    (run_dir / "rows.json").write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
