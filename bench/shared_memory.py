#!/usr/bin/env python3
"""System shared memory against the body: perf_analyzer on a 4 MiB input (issue 33, point 2).

    .venv/bin/python bench/shared_memory.py                      # HTTP and gRPC, c=1 and 4
    .venv/bin/python bench/shared_memory.py --concurrency 1,4,8 --window-ms 2000

One redis-server, one worker, one gateway and one gRPC server, the frontends with
``--allow-client-shm``; the model is an identity ONNX model of 1,048,576 FP32 (4 MiB in,
4 MiB out). At each concurrency perf_analyzer measures each protocol twice: ``body``
(binary tensors in the HTTP body, ``raw_input_contents`` over gRPC) and ``shm``
(``--shared-memory system``: the input and output in /dev/shm regions, registered once).
Zero-copy ends at the frontend: in both the tensor still crosses Redis to the worker and
back, so what ``shm`` saves is the client's and the frontend's side of the body. Logs go
to ``.cache/bench/shared_memory/<time>/``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import procs  # noqa: E402
from run import PaOptions, run_perf_analyzer, say  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402

ELEMENTS = 1 << 20  # FP32: 4 MiB
MODEL = "identity_4m"


def _repository(root: Path) -> Path:
    """An ONNX identity of ``ELEMENTS`` FP32, no batching."""
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [ELEMENTS])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [ELEMENTS])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], MODEL, [x], [y]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / MODEL / "1").mkdir(parents=True)
    save(model, str(root / MODEL / "1" / "model.onnx"))
    (root / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        f'input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }}]\n'
        f'output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }}]\n'
    )
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--window-ms", type=int, default=1500)
    args = parser.parse_args(argv)
    concurrency = [int(c) for c in args.concurrency.split(",")]

    import tritonclient.http as httpclient

    from conch.devtools import redis_server

    run_dir = ROOT / ".cache" / "bench" / "shared_memory" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    pa = PaOptions(perf_analyzer.binary(), args.window_ms, 30, 6)
    private = redis_server.start_private()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp, procs.Group(run_dir / "logs") as group:
            group.guard("redis-server", private.process.pid)
            repo = _repository(Path(tmp))
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            http_port, grpc_port = redis_server.free_port(), redis_server.free_port()
            group.start("conch-worker", conch("worker", *common))
            group.start(
                "conch-gateway",
                conch(
                    "gateway",
                    *common,
                    *("--http-address", "127.0.0.1", "--http-port", str(http_port)),
                    *("--metrics-port", str(redis_server.free_port()), "--allow-client-shm"),
                ),
            )
            group.start(
                "conch-grpc",
                conch(
                    "grpc",
                    *common,
                    *("--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port)),
                    "--allow-client-shm",
                ),
            )
            url = f"127.0.0.1:{http_port}"
            client = httpclient.InferenceServerClient(url)

            def ready() -> bool:
                try:
                    return client.is_model_ready(MODEL)
                except Exception:
                    return False

            procs.wait_until(ready, 180, group, "conch readiness")
            shm = ("--shared-memory", "system", "--output-shared-memory-size", str(4 * ELEMENTS))
            for c in concurrency:
                for protocol, at in (("http", url), ("grpc", f"127.0.0.1:{grpc_port}")):
                    for mode, extra in (("body", ()), ("shm", shm)):
                        say(f"{protocol} {mode} at concurrency {c}")
                        point = run_perf_analyzer(
                            pa, at, MODEL, c, run_dir, f"{protocol}-{mode}", json=False,
                            protocol=protocol, extra=extra,
                        )  # fmt: skip
                        rows.append((c, protocol, mode, point))
            group.check_alive()
    finally:
        private.stop()

    print(f"\nSystem shared memory, {MODEL} (4 MiB FP32 in and out), perf_analyzer\n")
    print(f"{'c':>3} {'protocol':<8} {'mode':<5} {'infer/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for c, protocol, mode, p in rows:
        if p.infer_per_s is None:
            print(f"{c:>3} {protocol:<8} {mode:<5} error: {p.error}")
            continue
        unsteady = " (windows not within the stability bound)" if p.error else ""
        print(
            f"{c:>3} {protocol:<8} {mode:<5} {p.infer_per_s:>9.1f} {p.p50_ms:>8.2f} "
            f"{p.p99_ms:>8.2f}{unsteady}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
