"""``conch``: serve, gateway and worker, with Triton's flag names where Triton has them."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import subprocess
import sys
import time

from conch import __version__
from conch.settings import Role, Settings, add_arguments

_ROLE_HELP = {
    Role.SERVE: "run Redis (if needed), a worker and the gateway",
    Role.GATEWAY: "run the HTTP gateway under gunicorn",
    Role.WORKER: "run a Celery worker that serves models",
}


def parser() -> argparse.ArgumentParser:
    from repo_sync.cli import add_arguments as sync_arguments

    top = argparse.ArgumentParser(prog="conch", description=__doc__)
    top.add_argument("--version", action="version", version=f"conch {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    for role, help_text in _ROLE_HELP.items():
        add_arguments(sub.add_parser(role, help=help_text), role)
    sync_arguments(
        sub.add_parser("sync", help="mirror a model repository from S3 or a folder (repo_sync)")
    )
    _batch_arguments(
        sub.add_parser(
            "batch",
            help="run an offline batch job (JSONL of infer requests in S3) and follow it",
        )
    )
    return top


def _logging(verbose: int) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose > 0 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "sync":
        from repo_sync.cli import run as sync

        _logging(args.log_verbose)
        return sync(args)
    if args.command == "batch":
        _logging(args.log_verbose)
        return batch(args)
    try:
        settings = Settings.from_args(args)
    except ValueError as exc:
        raise SystemExit(f"conch: {exc}") from None
    _logging(settings.log_verbose)
    if not settings.model_repository.is_dir():
        raise SystemExit(f"conch: --model-repository {args.model_repository} is not a folder")
    if args.command == Role.WORKER:
        return worker(settings)
    if args.command == Role.GATEWAY:
        return gateway(settings)
    return serve(settings)


def worker(settings: Settings) -> int:
    from conch.devtools import redis_server
    from conch.worker import app as worker_app

    settings.redis_url, _ = redis_server.resolve(settings.redis_url, settings.local_redis_url)
    worker_app.run(settings, loglevel="DEBUG" if settings.log_verbose else "INFO")
    return 0


def gateway(settings: Settings) -> int:
    if settings.http_worker_uses_gevent:
        # Patch before redis (and ssl through it) is imported, as gevent asks.
        from gevent import monkey

        monkey.patch_all()
    from conch.devtools import redis_server
    from conch.frontend.http.server import run

    settings.redis_url, _ = redis_server.resolve(settings.redis_url, settings.local_redis_url)
    run(
        settings,
        bind=f"{settings.http_address}:{settings.http_port}",
        workers=settings.http_workers,
        threads=settings.http_thread_count,
    )
    return 0


def _batch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help="the model to run every line on")
    p.add_argument("-x", "--model-version", default="", help="default: the latest")
    p.add_argument("--input", required=True, help="s3://bucket/key of the JSONL requests")
    p.add_argument("--output", required=True, help="s3://bucket/key for the JSONL answers")
    p.add_argument("-u", "--url", default="127.0.0.1:8000", help="the gateway (host:port)")
    p.add_argument("--no-wait", action="store_true", help="print the job id and return at once")
    p.add_argument("--log-verbose", type=int, default=0, metavar="N")


def batch(args: argparse.Namespace) -> int:
    """Submit a batch job, then show its progress until it ends (0 when it succeeded)."""
    from tqdm import tqdm
    from tritonclient.utils import InferenceServerException

    from conch.job_client import JobClient

    jobs = JobClient(args.url)
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


def serve(settings: Settings) -> int:
    """The whole stack in one command: Redis if needed, one worker, the gateway."""
    log = logging.getLogger("conch.serve")
    from conch.devtools import redis_server

    url, private = redis_server.resolve(settings.redis_url, settings.local_redis_url)
    log.info("broker: %s%s", url, " (private redis-server)" if private else "")
    settings = dataclasses.replace(settings, redis_url=url)
    children = [
        subprocess.Popen([sys.executable, "-m", "conch", role.value, *settings.to_args(role)])
        for role in (Role.WORKER, Role.GATEWAY)
    ]
    log.info(
        "serving %s on http://%s:%d",
        settings.model_repository,
        settings.http_address,
        settings.http_port,
    )

    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    code = 0
    try:
        while not stopping:
            for c in children:
                if c.poll() is not None:
                    log.error("%s exited with %s; stopping", c.args[3], c.returncode)
                    stopping, code = True, c.returncode or 1
            time.sleep(0.2)
    finally:
        for c in children:
            if c.poll() is None:
                c.terminate()
        for c in children:
            try:
                c.wait(timeout=30)
            except subprocess.TimeoutExpired:
                c.kill()
        if private is not None:
            private.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
