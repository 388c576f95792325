#!/usr/bin/env python3
"""A sequence model's benchmark (issue 17): perf_analyzer's sequences against conch.

    make bench                                  # after bench/run.py
    make bench SEQ_BENCH_ARGS="--quick"
    .venv/bin/python bench/sequences.py --concurrency 16 --skip-grpc

The model: a GRU cell as an ONNX graph (``--input-size`` 64 -> ``--hidden`` 256, a 32-wide
linear read-out), its hidden state kept in Triton's implicit state (``STATE_IN`` ->
``STATE_OUT``, zero at START), with START and READY controls, Direct strategy with
``max_batch_size`` 64 (one slot per concurrent sequence). The same files are served twice:
``seq_gru`` as is (the state written to Redis after every step, so a sequence survives its
worker) and ``seq_gru_local`` with ``sequence_state_in_redis`` "false" (the state stays in
the worker): the difference is what keeping the state in Redis costs per step.

conch: a private redis-server on a Unix socket, one ``conch worker`` serving both models,
one ``conch gateway`` and one ``conch grpc``, as bench/run.py starts them. perf_analyzer
drives each model over HTTP and gRPC at each concurrency (default 16 and 64 concurrent
sequences) with ``--sequence-length 20`` (20% variation) and a sequence id range ten times
the concurrency wide, its inputs from fixed-seed data streams. The mean batch the worker
formed is the model's ``inference_count / execution_count`` (statistics) over the run. In
process: an onnxruntime session on the same file with conch's session options, stepping
sequences with their state fed back, at batch 1 and at each mean batch formed.

Progress goes to stderr, the tables to stdout; logs, CSVs and ``results.json`` to
``.cache/bench/runs/seq-<time>/``. Exit status: 0 when the tables were printed, 2 when the
benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import inprocess  # noqa: E402
import procs  # noqa: E402
import run  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402

MODEL = "seq_gru"
LOCAL = "seq_gru_local"  # the same files, its state kept out of Redis
OUTPUT_SIZE = 32
MAX_BATCH = 64
SEQUENCE_LENGTH = 20
STREAMS = 8  # perf_analyzer's data streams, one picked per new sequence
PROTOCOLS = {"http": "conch", "grpc": "conch-grpc"}  # perf_analyzer -i -> run.Point tag


def say(msg: str) -> None:
    run.say(msg)


# --------------------------------------------------------------------------- the model


def build_gru(dest: Path, name: str, input_size: int, hidden: int, *, state_in_redis: bool) -> Path:
    """``dest/name``: the GRU cell's model.onnx and config.pbtxt; the model file's path."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(17)

    def weights(label: str, *shape: int) -> onnx.TensorProto:
        scale = 1 / np.sqrt(shape[-1])
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), label
        )

    def axes(label: str) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array([0], np.int64), label)

    nodes = [
        helper.make_node("Cast", ["START"], ["start_b"], to=TensorProto.BOOL),
        helper.make_node("Cast", ["READY"], ["ready_b"], to=TensorProto.BOOL),
        helper.make_node("Where", ["start_b", "ZERO", "STATE_IN"], ["h0"]),  # reset at START
        helper.make_node("Unsqueeze", ["INPUT", "AXIS0"], ["x_seq"]),  # [1, batch, input]
        helper.make_node("Unsqueeze", ["h0", "AXIS0"], ["h0_seq"]),  # [1, batch, hidden]
        helper.make_node(
            "GRU", ["x_seq", "W", "R", "B", "", "h0_seq"], ["", "h1_seq"], hidden_size=hidden
        ),
        helper.make_node("Squeeze", ["h1_seq", "AXIS0"], ["h1"]),
        helper.make_node("Where", ["ready_b", "h1", "STATE_IN"], ["h"]),  # unchanged if not READY
        helper.make_node("Identity", ["h"], ["STATE_OUT"]),
        helper.make_node("MatMul", ["h", "W_OUT"], ["OUTPUT"]),
    ]

    def vi(label: str, width: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(label, TensorProto.FLOAT, ["batch", width])

    graph = helper.make_graph(
        nodes,
        "seq_gru",
        [vi("INPUT", input_size), vi("START", 1), vi("READY", 1), vi("STATE_IN", hidden)],
        [vi("OUTPUT", OUTPUT_SIZE), vi("STATE_OUT", hidden)],
        initializer=[
            weights("W", 1, 3 * hidden, input_size),
            weights("R", 1, 3 * hidden, hidden),
            weights("B", 1, 6 * hidden),
            weights("W_OUT", hidden, OUTPUT_SIZE),
            numpy_helper.from_array(np.zeros((), np.float32), "ZERO"),
            axes("AXIS0"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = dest / name / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    control = "control [ {{ kind: CONTROL_SEQUENCE_{} fp32_false_true: [ 0, 1 ] }} ]"
    opt_out = (
        ""
        if state_in_redis
        else 'parameters { key: "sequence_state_in_redis" value: { string_value: "false" } }\n'
    )
    (dest / name / "config.pbtxt").write_text(
        f'backend: "onnxruntime"\nmax_batch_size: {MAX_BATCH}\n'
        f'input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {input_size} ] }} ]\n'
        f'output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {OUTPUT_SIZE} ] }} ]\n'
        "sequence_batching {\n"
        "  max_sequence_idle_microseconds: 5000000\n"
        "  direct { }\n"
        "  control_input [\n"
        f'    {{ name: "START" {control.format("START")} }},\n'
        f'    {{ name: "READY" {control.format("READY")} }}\n'
        "  ]\n"
        f'  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 '
        f"dims: [ {hidden} ] initial_state: {{ data_type: TYPE_FP32 dims: [ {hidden} ] "
        'zero_data: true name: "zero" } } ]\n'
        "}\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n" + opt_out
    )
    return path


def write_streams(dest: Path, input_size: int) -> Path:
    """perf_analyzer ``--input-data``: ``STREAMS`` sequences of standard-normal steps."""
    rng = np.random.default_rng(20240817)
    streams = [
        [
            {"INPUT": [float(v) for v in rng.standard_normal(input_size, dtype=np.float32)]}
            for _ in range(SEQUENCE_LENGTH)
        ]
        for _ in range(STREAMS)
    ]
    dest.write_text(json.dumps({"data": streams}))
    return dest


# --------------------------------------------------------------------------- results


@dataclass
class Results:
    points: list[run.Point] = field(default_factory=list)  # every round's
    inprocess: dict[int, float] = field(default_factory=dict)  # batch -> steps/s
    state_us: dict[str, float] = field(default_factory=dict)  # the state's share of a commit
    settings: dict[str, Any] = field(default_factory=dict)

    def get(self, tag: str, model: str, concurrency: int) -> run.Point | None:
        """The rounds' mean of one point (None when none measured it)."""
        done = [
            p
            for p in self.points
            if (p.server, p.model, p.concurrency) == (tag, model, concurrency) and p.infer_per_s
        ]
        if not done:
            return None

        def mean(name: str) -> float | None:
            values = [getattr(p, name) for p in done if getattr(p, name) is not None]
            return sum(values) / len(values) if values else None

        return run.Point(
            tag,
            model,
            concurrency,
            infer_per_s=mean("infer_per_s"),
            p50_ms=mean("p50_ms"),
            p99_ms=mean("p99_ms"),
            mean_batch=mean("mean_batch"),
        )


def _counts(url: str, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) so far, from the statistics extension."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as resp:
        stats = json.load(resp)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def bench_conch(
    args: argparse.Namespace, repo: Path, pa: run.PaOptions, run_dir: Path, results: Results
) -> None:
    from conch.devtools import redis_server

    say("conch: starting a private redis-server (Unix socket)")
    private = redis_server.start_private(unix_socket=True)
    try:
        with procs.Group(run_dir / "logs") as group:
            group.guard("redis-server", private.process.pid)
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            group.start("conch-worker", conch("worker", *common))
            port, grpc_port = redis_server.free_port(), redis_server.free_port()
            gateway = [
                *("--http-address", "127.0.0.1", "--http-port", str(port)),
                *("--metrics-port", str(redis_server.free_port())),
            ]
            group.start("conch-gateway", conch("gateway", *common, *gateway))
            urls = {"http": f"127.0.0.1:{port}"}
            if not args.skip_grpc:
                grpc = ["--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port)]
                group.start("conch-grpc", conch("grpc", *common, *grpc))
                urls["grpc"] = f"127.0.0.1:{grpc_port}"
            say(f"conch: waiting for {MODEL} and {LOCAL} on {', '.join(urls.values())}")
            procs.wait_until(
                lambda: (
                    all(
                        run._http_ok(f"http://{urls['http']}/v2/models/{m}/ready")
                        for m in (MODEL, LOCAL)
                    )
                    and (args.skip_grpc or _grpc_ready(urls["grpc"]))
                ),
                180,
                group,
                "conch readiness",
            )
            # A B B A ...: the machine's drift hits the two state placements alike.
            for c in args.concurrency:
                flags = (
                    *("--sequence-length", str(SEQUENCE_LENGTH)),
                    *("--sequence-length-variation", "20"),
                    # ids ten times the live sequences, so one mostly comes back after its
                    # END ran (perf_analyzer still reuses one at once now and then)
                    *("--sequence-id-range", f"1:{10 * c + 1}"),
                )
                for protocol, target in urls.items():
                    for model in _abba(args.rounds):
                        group.check_alive()
                        say(f"{PROTOCOLS[protocol]}: {model}, {c} concurrent sequences")
                        point = _measure(
                            pa, run_dir, urls["http"], target, protocol, model, c, flags
                        )
                        results.points.append(point)
                        run._report_point(point)
            results.state_us = state_cost(private.url, args.hidden)
    finally:
        private.stop()


def _measure(
    pa: run.PaOptions,
    run_dir: Path,
    stats_url: str,
    target: str,
    protocol: str,
    model: str,
    concurrency: int,
    flags: tuple[str, ...],
) -> run.Point:
    """One perf_analyzer point, with the mean batch the worker formed during it."""
    before = _counts(stats_url, model)
    t0 = time.monotonic()
    tag = PROTOCOLS[protocol]
    point = run.run_perf_analyzer(
        pa, target, model, concurrency, run_dir, tag, json=False, protocol=protocol, extra=flags
    )
    point.wall_s = time.monotonic() - t0
    after = _counts(stats_url, model)
    requests, executions = after[0] - before[0], after[1] - before[1]
    if executions > 0:
        point.executions = executions
        point.mean_batch = requests / executions
    return point


def _abba(rounds: int) -> list[str]:
    return [m for i in range(rounds) for m in ((MODEL, LOCAL) if i % 2 == 0 else (LOCAL, MODEL))]


def state_cost(redis_url: str, hidden: int, pairs: int = 200, calls: int = 25) -> dict[str, float]:
    """What the state adds to one step's commit, in microseconds: packing it
    (``pack_state``) and its ``SET`` in the commit's round trip: a pipeline with and one
    without a SET of that many bytes, against the same Redis, timed in adjacent blocks; the
    median of the pairs' differences, so the shared machine's drift cancels out."""
    import statistics

    import redis

    from conch.wire.sequence_state import pack_state

    state = {"STATE_IN": np.random.default_rng(0).standard_normal(hidden, dtype=np.float32)}
    client = redis.Redis.from_url(redis_url)
    blob = pack_state(state)

    def commit(with_state: bool) -> None:
        pipe = client.pipeline(transaction=False)
        pipe.hincrby("bench.seq.record", "steps", 1)
        if with_state:
            pipe.set("bench.seq.state", blob, ex=60)
        pipe.execute()

    def block(fn: Any) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e6

    without, added, pack = [], [], []
    for i in range(pairs):
        first = i % 2 == 0  # which goes first alternates too
        a = block(lambda w=first: commit(not w))
        b = block(lambda w=first: commit(w))
        plain, stated = (a, b) if first else (b, a)
        without.append(plain)
        added.append(stated - plain)
        pack.append(block(lambda: pack_state(state)))
    client.delete("bench.seq.record", "bench.seq.state")
    return {
        "bytes": float(len(blob)),
        "pack_us": statistics.median(pack),
        "set_us": statistics.median(added),
        "commit_us": statistics.median(without),
    }


def _grpc_ready(url: str) -> bool:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        return all(client.is_model_ready(m) for m in (MODEL, LOCAL))
    except Exception:
        return False
    finally:
        client.close()


def bench_inprocess(
    model_file: Path, batches: list[int], budget_s: float, results: Results
) -> None:
    """Steps per second of the model in process: ``batch`` sequences stepped together, the
    state fed back, START on the first step, as the worker runs one batch."""
    session = inprocess.ort_session(model_file)
    widths = {i.name: int(i.shape[1]) for i in session.get_inputs()}
    for batch in batches:
        rng = np.random.default_rng(batch)
        x = rng.standard_normal((batch, widths["INPUT"]), dtype=np.float32)
        ones, zeros = np.ones((batch, 1), np.float32), np.zeros((batch, 1), np.float32)
        state = [np.zeros((batch, widths["STATE_IN"]), np.float32)]

        def step(x=x, ones=ones, zeros=zeros, state=state) -> None:
            feed = {"INPUT": x, "START": zeros, "READY": ones, "STATE_IN": state[0]}
            state[0] = session.run(["STATE_OUT", "OUTPUT"], feed)[0]

        results.inprocess[batch] = inprocess.rate(step, batch, budget_s)
        say(f"in process: batch {batch}: {results.inprocess[batch]:,.0f} steps/s")


# --------------------------------------------------------------------------- report


def _cell(p: run.Point | None) -> list[str]:
    if p is None or p.infer_per_s is None:
        return ["failed" if p else "n/a", "", "", ""]
    return [
        f"{p.infer_per_s:,.0f}",
        f"{p.p50_ms:.2f}",
        f"{p.p99_ms:.2f}",
        run._f(p.mean_batch, ".1f"),
    ]


def _inproc(results: Results, batch: float | None) -> tuple[int | None, float | None]:
    if batch is None or not results.inprocess:
        return None, None
    nearest = min(results.inprocess, key=lambda b: abs(b - batch))
    return nearest, results.inprocess[nearest]


def report(results: Results, args: argparse.Namespace) -> str:
    lines = [
        f"Sequence model {MODEL}: GRU cell, input {args.input_size}, hidden {args.hidden} "
        f"(state {4 * args.hidden} bytes a sequence), Direct, max_batch_size {MAX_BATCH}; "
        f"perf_analyzer --sequence-length {SEQUENCE_LENGTH} (20% variation)",
        "",
        "| state | protocol | sequences | infer/s | p50 ms | p99 ms | mean batch "
        "| in process at that batch (steps/s) | conch ÷ in process |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, where in ((MODEL, "Redis"), (LOCAL, "worker")):
        for c in args.concurrency:
            for protocol, tag in PROTOCOLS.items():
                p = results.get(tag, model, c)
                if p is None and protocol == "grpc" and args.skip_grpc:
                    continue
                batch, rate = _inproc(results, p.mean_batch if p else None)
                ratio = p.infer_per_s / rate if p and p.infer_per_s and rate else None
                inproc = f"{rate:,.0f} (batch {batch})" if rate else "n/a"
                lines.append(
                    f"| {where} | {protocol} | {c} | "
                    + " | ".join(_cell(p))
                    + f" | {inproc} | {run._ratio(ratio)} |"
                )
    lines += [
        "",
        "In process (steps/s): "
        + ", ".join(f"batch {b}: {r:,.0f}" for b, r in sorted(results.inprocess.items())),
        "",
        f"What keeping the state in Redis costs a step (Redis vs in the worker, mean of "
        f"{args.rounds} rounds in A B B A order):",
        "",
        "| protocol | sequences | infer/s ratio | p50 ms added | p99 ms added |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in args.concurrency:
        for protocol, tag in PROTOCOLS.items():
            kept, local = results.get(tag, MODEL, c), results.get(tag, LOCAL, c)
            if not (kept and local and kept.infer_per_s and local.infer_per_s):
                continue
            lines.append(
                f"| {protocol} | {c} | {kept.infer_per_s / local.infer_per_s:.2f} | "
                f"{kept.p50_ms - local.p50_ms:+.2f} | {kept.p99_ms - local.p99_ms:+.2f} |"
            )
    if results.state_us:
        st = results.state_us
        lines += [
            "",
            f"The state's share of a commit, measured alone: {st['bytes']:.0f} bytes; "
            f"pack_state {st['pack_us']:.1f} us + its SET in the commit's round trip "
            f"{st['set_us']:.1f} us = {st['pack_us'] + st['set_us']:.1f} us a step "
            f"(a commit's round trip without it: {st['commit_us']:.0f} us)",
        ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="1 s windows, shorter in-process timing")
    p.add_argument(
        "--concurrency", default="16,64", help="concurrent sequences, comma-separated (16,64)"
    )
    p.add_argument("--window-ms", type=int, default=None, help="window (default 2000, quick 1000)")
    p.add_argument("--max-trials", type=int, default=5, help="windows per point at most")
    p.add_argument("--skip-grpc", action="store_true", help="HTTP only")
    p.add_argument(
        "--rounds", type=int, default=None, help="A/B rounds of each point (default 2, quick 1)"
    )
    p.add_argument("--input-size", type=int, default=64, help="the GRU's input width")
    p.add_argument("--hidden", type=int, default=256, help="the GRU's state width")
    args = p.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    except ValueError:
        p.error("--concurrency takes integers, e.g. 16,64")
    if not args.concurrency or min(args.concurrency) < 1 or max(args.concurrency) > MAX_BATCH:
        p.error(f"--concurrency takes integers from 1 to {MAX_BATCH} (the model's slots)")
    if args.window_ms is None:
        args.window_ms = 1000 if args.quick else 2000
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = run.CACHE / "runs" / time.strftime("seq-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    results = Results()
    try:
        uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        results.settings = {
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "uptime_before": uptime,
            "cpus": os.cpu_count(),
            "argv": sys.argv[1:],
        }
        repo = run_dir / "repo"
        model_file = build_gru(repo, MODEL, args.input_size, args.hidden, state_in_redis=True)
        build_gru(repo, LOCAL, args.input_size, args.hidden, state_in_redis=False)
        data = write_streams(run_dir / "streams.json", args.input_size)
        pa = run.PaOptions(
            binary=perf_analyzer.binary(),
            window_ms=args.window_ms,
            stability_pct=100,
            max_trials=args.max_trials,
            input_files={MODEL: data, LOCAL: data},
        )
        bench_conch(args, repo, pa, run_dir, results)
        batches = sorted(
            {1} | {max(1, round(p.mean_batch)) for p in results.points if p.mean_batch}
        )
        bench_inprocess(model_file, batches, 1.0 if args.quick else 3.0, results)
        results.settings["uptime_after"] = subprocess.run(
            ["uptime"], capture_output=True, text=True
        ).stdout.strip()
    except Exception as exc:  # reported; exit 2
        traceback.print_exc()
        say(f"the sequence benchmark could not run: {exc}")
        return 2
    finally:
        (run_dir / "results.json").write_text(
            json.dumps(
                {
                    "points": [asdict(p) for p in results.points],
                    "inprocess": results.inprocess,
                    "state_us": results.state_us,
                    "settings": results.settings,
                },
                indent=2,
            )
        )
    print(report(results, args))
    print(f"\n{results.settings['started']}; before: {results.settings['uptime_before']}")
    print(f"after: {results.settings['uptime_after']}; results in {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
