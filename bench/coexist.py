"""Online traffic beside an offline batch job on the same model: is it starved?

One conch worker and one gateway serve the model; an S3-API server (moto's server mode,
on loopback) holds a JSONL input of the model's requests. perf_analyzer (``-i http``,
binary tensors) drives the model at one concurrency three times: alone, beside a running
batch job, and the job's own rate is measured alone and during that run. Prints the
online throughput and latency both ways, their ratio, and the job's lines per second.

    .venv/bin/python bench/coexist.py                       # mlp, concurrency 16
    .venv/bin/python bench/coexist.py --model mlp_large --concurrency 16 --lines 20000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import procs  # noqa: E402
import run  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402

import models  # noqa: E402

AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
BUCKET = "bench"


def jsonl(repo: Path, model: str, lines: int) -> bytes:
    """``lines`` one-row requests of fixed-seed normal data, 3 decimals (small JSON)."""
    config = run._triton_config(repo / model)
    (entry,) = config["input"]
    dims = [int(d) for d in entry["dims"]]
    rng = np.random.default_rng(7)
    samples = []
    for _ in range(64):  # distinct rows, cycled
        x = np.round(rng.standard_normal(int(np.prod(dims))), 3).tolist()
        doc = {
            "inputs": [{"name": entry["name"], "datatype": "FP32", "shape": [1, *dims], "data": x}]
        }
        samples.append(json.dumps(doc, separators=(",", ":")).encode())
    return b"\n".join(samples[i % len(samples)] for i in range(lines)) + b"\n"


def job_lines(client, job_id: str) -> tuple[str, int]:
    status = client.status(job_id)
    return status["status"], int(status.get("progress", {}).get("lines", 0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--lines", type=int, default=60_000, help="lines in the batch job's input")
    p.add_argument("--window-ms", type=int, default=2000)
    p.add_argument("--job-alone-s", type=float, default=5.0)
    args = p.parse_args(argv)

    import boto3
    import tritonclient.http as httpclient

    from conch.devtools import redis_server
    from conch.job_client import JobClient

    run_dir = run.CACHE / "runs" / ("coexist-" + time.strftime("%Y%m%d-%H%M%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    run.say(f"run folder: {run_dir}")
    repo = models.build_repository()
    pa = run.PaOptions(perf_analyzer.binary(), args.window_ms, 100, 5)
    pa.input_files[args.model] = run.write_input_data(
        repo, args.model, run_dir / f"input-{args.model}.json"
    )
    os.environ.update(AWS)
    private = redis_server.start_private()
    try:
        with procs.Group(run_dir / "logs") as group:
            group.guard("redis-server", private.process.pid)
            s3_port = redis_server.free_port()
            endpoint = f"http://127.0.0.1:{s3_port}"
            group.start(
                "moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)]
            )
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            group.start(
                "conch-worker",
                conch("worker", *common, "--models", args.model),
                env={**AWS, "AWS_ENDPOINT_URL": endpoint},
            )
            port = redis_server.free_port()
            gw = ["--http-address", "127.0.0.1", "--http-port", str(port)]
            gw += ["--metrics-port", str(redis_server.free_port())]
            group.start("conch-gateway", conch("gateway", *common, *gw))
            url = f"127.0.0.1:{port}"

            def ready() -> bool:
                try:
                    return httpclient.InferenceServerClient(url).is_model_ready(args.model)
                except Exception:
                    return False

            procs.wait_until(ready, 180, group, "conch readiness")
            s3 = boto3.client("s3", endpoint_url=endpoint)
            procs.wait_until(lambda: _s3_up(s3), 30, group, "the S3 server")
            s3.create_bucket(Bucket=BUCKET)
            data = jsonl(repo, args.model, args.lines)
            s3.put_object(Bucket=BUCKET, Key="in.jsonl", Body=data)
            run.say(f"batch job input: {args.lines:,} lines, {len(data) / 1e6:.1f} MB")

            run.say(f"online alone: {args.model} at concurrency {args.concurrency}")
            alone = run.run_perf_analyzer(
                pa, url, args.model, args.concurrency, run_dir, "alone", json=False
            )
            jobs = JobClient(url)
            job = jobs.submit_batch(
                args.model, f"s3://{BUCKET}/in.jsonl", f"s3://{BUCKET}/out.jsonl"
            )
            procs.wait_until(lambda: job_lines(jobs, job)[1] > 0, 60, group, "the job to start")
            _, l0 = job_lines(jobs, job)
            time.sleep(args.job_alone_s)
            _, l1 = job_lines(jobs, job)
            job_alone = (l1 - l0) / args.job_alone_s
            run.say(f"job alone: {job_alone:,.0f} lines/s; online beside it")
            t0 = time.monotonic()
            beside = run.run_perf_analyzer(
                pa, url, args.model, args.concurrency, run_dir, "beside-job", json=False
            )
            state, l2 = job_lines(jobs, job)
            job_beside = (l2 - l1) / (time.monotonic() - t0)
            if state == "STARTED":
                jobs.cancel(job)
            else:
                run.say(f"warning: the job ended ({state}) during the run; use more --lines")
    finally:
        private.stop()

    print(
        f"\nonline {args.model} at concurrency {args.concurrency} (perf_analyzer -i http, "
        f"{args.window_ms} ms windows) beside an offline batch job on the same model\n"
    )
    print("| online traffic | infer/s | p50 ms | p99 ms | job lines/s |")
    print("|---|---|---|---|---|")
    print(
        f"| alone | {alone.infer_per_s or 0:,.0f} | {alone.p50_ms or 0:.2f} | "
        f"{alone.p99_ms or 0:.2f} | {job_alone:,.0f} (job alone) |"
    )
    print(
        f"| beside the job | {beside.infer_per_s or 0:,.0f} | {beside.p50_ms or 0:.2f} | "
        f"{beside.p99_ms or 0:.2f} | {job_beside:,.0f} |"
    )
    if alone.infer_per_s and beside.infer_per_s:
        print(
            f"\nonline throughput beside the job: {beside.infer_per_s / alone.infer_per_s:.2f}x "
            f"of alone; p99 {beside.p99_ms / alone.p99_ms:.2f}x"
        )
    for point in (alone, beside):
        if point.error:
            print(f"note ({point.server}): {point.error}")
    print(f"(logs and perf_analyzer CSVs: {run_dir})")
    return 0


def _s3_up(s3) -> bool:
    try:
        s3.list_buckets()
        return True
    except Exception:
        return False


if __name__ == "__main__":
    sys.exit(main())
