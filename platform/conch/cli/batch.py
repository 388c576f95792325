"""``conch batch``: submit an offline batch job to a running gateway and follow it.

A client of the gateway's job API (``conch.job_client``), not a server role: it takes no
Settings, only where the gateway is and what to run.
"""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help="the model to run every line on")
    p.add_argument("-x", "--model-version", default="", help="default: the latest")
    p.add_argument("--input", required=True, help="s3://bucket/key of the JSONL requests")
    p.add_argument("--output", required=True, help="s3://bucket/key for the JSONL answers")
    p.add_argument("-u", "--url", default="127.0.0.1:8000", help="the gateway (host:port)")
    p.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="send this header with every call (a restricted API's); repeatable",
    )
    p.add_argument("--no-wait", action="store_true", help="print the job id and return at once")
    p.add_argument("--log-verbose", type=int, default=0, metavar="N")


def run(args: argparse.Namespace) -> int:
    """Submit a batch job, then show its progress until it ends (0 when it succeeded)."""
    from tqdm import tqdm
    from tritonclient.utils import InferenceServerException

    from conch.job_client import JobClient

    headers = {}
    for item in args.header:
        name, colon, value = item.partition(":")
        if not colon or not name.strip():
            print(f"conch batch: --header is NAME:VALUE, not {name!r}", file=sys.stderr)
            return 2
        headers[name.strip()] = value.strip()
    jobs = JobClient(args.url, headers=headers)
    try:
        job = jobs.submit_batch(
            args.model, args.input, args.output, model_version=args.model_version
        )
    except InferenceServerException as exc:
        print(f"conch batch: refused ({exc.status()}): {exc.message()}", file=sys.stderr)
        return 2
    print(f"job {job}: {args.input} -> {args.output} on model '{args.model}'", file=sys.stderr)
    if args.no_wait:
        print(job)
        return 0
    bar = tqdm(desc=f"{args.model}", unit=" lines", dynamic_ncols=True)
    try:
        while True:
            status = jobs.status(job)
            progress = status.get("progress", {})
            bar.update(int(progress.get("lines", 0)) - bar.n)
            bar.set_postfix(failed=progress.get("failed", 0), status=status["status"])
            if status["status"] not in ("PENDING", "STARTED"):
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        bar.close()
        print(
            f"\njob {job} keeps running; follow it at GET /v2/jobs/{job}, cancel it with "
            f"DELETE /v2/jobs/{job}",
            file=sys.stderr,
        )
        return 130
    bar.close()
    if status["status"] != "SUCCESS":
        print(f"job {job} ended {status['status']}: {status.get('error', '')}", file=sys.stderr)
        return 1
    failed = progress.get("failed", 0)
    print(
        f"job {job}: {progress.get('lines', 0)} lines answered into {args.output}"
        + (f", {failed} of them with an error line" if failed else ""),
        file=sys.stderr,
    )
    print(job)
    return 0
