#!/usr/bin/env python3
"""The response cache's benchmark: perf_analyzer on a hit against a miss (issue 16).

    .venv/bin/python bench/cache.py                          # local cache, c=1 and 16
    .venv/bin/python bench/cache.py --cache redis --concurrency 16 --window-ms 2000

One redis-server, one worker, one gateway started with ``--cache-config`` (``local``, or
``redis`` in the broker's own Redis: the shared form); the model is ``mlp`` (functions/),
served twice: as itself (no ``response_cache``) and as ``mlp_cached`` (``response_cache
{ enable: true }``). At each concurrency perf_analyzer (HTTP, binary tensors) measures:

- ``off``: ``mlp``, one fixed input: the cache is not looked at;
- ``hit``: ``mlp_cached``, the same fixed input: every request after the first is a hit;
- ``miss``: ``mlp_cached`` cycling through ``--samples`` distinct inputs, more than the
  cache holds (its size is set so), so least-recently-used eviction turns every request
  into a miss: lookup, the model's queue, and an insert.

It prints throughput and latency for each, hit ÷ miss and hit ÷ off, and the cache_hit /
cache_miss counts the statistics extension recorded during each run (so a "hit" row that
missed would show). Logs go to ``.cache/bench/cache/<time>/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import procs  # noqa: E402
from run import PaOptions, run_perf_analyzer, say  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402

ENTRY_BYTES = 100  # an mlp answer in the cache: 16 FP32 and msgpack framing, about


def _repository(root: Path) -> Path:
    shutil.copytree(ROOT / "functions" / "mlp", root / "mlp")
    shutil.copytree(ROOT / "functions" / "mlp", root / "mlp_cached")
    config = root / "mlp_cached" / "config.pbtxt"
    text = config.read_text().replace('name: "mlp"', 'name: "mlp_cached"')
    config.write_text(text + "response_cache { enable: true }\n")
    return root


def _samples(count: int, dest: Path) -> Path:
    """``count`` distinct standard-normal inputs, as perf_analyzer's --input-data."""
    rng = np.random.default_rng(16)
    rows = rng.standard_normal((count, 64), dtype=np.float32)
    data = [{"INPUT0": {"content": [float(v) for v in row], "shape": [64]}} for row in rows]
    dest.write_text(json.dumps({"data": data}))
    return dest


def _cache_counts(url: str, model: str) -> tuple[int, int]:
    import tritonclient.http as httpclient

    stats = httpclient.InferenceServerClient(url).get_inference_statistics(model)
    phases = stats["model_stats"][0]["inference_stats"]
    return int(phases["cache_hit"]["count"]), int(phases["cache_miss"]["count"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", choices=("local", "redis"), default="local")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--window-ms", type=int, default=1500)
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args(argv)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    # A quarter of the distinct inputs fit: a cycle through them always misses.
    size = args.samples // 4 * ENTRY_BYTES

    import tritonclient.http as httpclient

    from conch.devtools import redis_server

    run_dir = ROOT / ".cache" / "bench" / "cache" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    pa = PaOptions(perf_analyzer.binary(), args.window_ms, 30, 6)
    pa.input_files["mlp_cached"] = _samples(args.samples, run_dir / "samples.json")
    private = redis_server.start_private()
    host, port = private.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    cache = (
        f"local,size={size}"
        if args.cache == "local"
        else f"redis,host={host},port={port},size={size}"
    )
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp, procs.Group(run_dir / "logs") as group:
            group.guard("redis-server", private.process.pid)
            repo = _repository(Path(tmp))
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            http_port = redis_server.free_port()
            group.start("conch-worker", conch("worker", *common))
            group.start(
                "conch-gateway",
                conch(
                    "gateway",
                    *common,
                    *("--http-address", "127.0.0.1", "--http-port", str(http_port)),
                    *("--metrics-port", str(redis_server.free_port()), "--cache-config", cache),
                ),
            )
            url = f"127.0.0.1:{http_port}"
            client = httpclient.InferenceServerClient(url)

            def ready() -> bool:
                try:
                    return all(client.is_model_ready(m) for m in ("mlp", "mlp_cached"))
                except Exception:
                    return False

            procs.wait_until(ready, 180, group, "conch readiness")
            say(f"cache: --cache-config {cache}")
            for c in concurrency:
                for mode, model in (("off", "mlp"), ("hit", "mlp_cached"), ("miss", "mlp_cached")):
                    files = dict(pa.input_files)
                    if mode != "miss":
                        pa.input_files.pop("mlp_cached", None)
                    say(f"{mode}: {model} at concurrency {c}")
                    before = _cache_counts(url, model)
                    point = run_perf_analyzer(pa, url, model, c, run_dir, mode, json=False)
                    after = _cache_counts(url, model)
                    pa.input_files = files
                    hits, misses = (after[0] - before[0], after[1] - before[1])
                    rows.append((c, mode, point, hits, misses))
    finally:
        private.stop()

    print(f"\nResponse cache (--cache-config {cache.split(',')[0]}), mlp over HTTP\n")
    print(
        f"{'c':>3} {'mode':<5} {'infer/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'hits':>8} {'misses':>8}"
    )
    by = {}
    for c, mode, p, hits, misses in rows:
        by[(c, mode)] = p
        if p.infer_per_s is None:
            print(f"{c:>3} {mode:<5} error: {p.error}")
            continue
        unsteady = " (windows not within the stability bound)" if p.error else ""
        print(
            f"{c:>3} {mode:<5} {p.infer_per_s:>9.0f} {p.p50_ms:>7.2f} {p.p99_ms:>7.2f} "
            f"{hits:>8} {misses:>8}{unsteady}"
        )
    for c in concurrency:
        hit, miss, off = by.get((c, "hit")), by.get((c, "miss")), by.get((c, "off"))
        if hit and miss and off and hit.infer_per_s and miss.infer_per_s and off.infer_per_s:
            print(
                f"c={c}: hit / miss {hit.infer_per_s / miss.infer_per_s:.2f}x throughput, "
                f"p50 {hit.p50_ms:.2f} vs {miss.p50_ms:.2f} ms; "
                f"hit / off {hit.infer_per_s / off.infer_per_s:.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
