"""``conch``: serve, gateway and worker, with Triton's flag names where Triton has them."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conch import __version__
from conch.settings import ModelControlMode, Settings


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-repository",
        required=True,
        type=Path,
        metavar="DIR",
        help="the Triton-layout model repository to serve",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", ""),
        help="the broker (default: $REDIS_URL)",
    )
    p.add_argument(
        "--log-verbose", type=int, default=0, metavar="N", help="verbose logging when N > 0"
    )
    p.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="do not complete configs from the models themselves",
    )
    p.add_argument("--strict-model-config", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="BACKEND,KEY=VALUE",
        help="e.g. onnxruntime,default-max-batch-size=8",
    )
    p.add_argument(
        "--request-timeout-secs",
        type=float,
        default=None,
        help="deadline of requests that set no 'timeout' parameter",
    )
    p.add_argument(
        "--model-control-mode",
        choices=[m.value for m in ModelControlMode],
        default="none",
        help="none: load everything at start; poll: follow repository changes; "
        "explicit: load and unload through the repository API",
    )
    p.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        metavar="S",
        help="poll mode: how often to look for repository changes",
    )
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="MODEL",
        help="explicit mode: load this model at start ('*' for all); repeatable",
    )


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _http(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-port", type=int, default=8002, help="GET /metrics here (Triton's 8002)"
    )
    p.add_argument(
        "--allow-metrics",
        type=_flag,
        default=True,
        metavar="BOOL",
        help="serve metrics (default true; --allow-metrics=false to turn them off)",
    )
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-thread-count", type=int, default=64, help="threads per gateway process")
    p.add_argument(
        "--http-workers", type=int, default=min(2, os.cpu_count() or 1), help="gateway processes"
    )
    p.add_argument("--http-max-input-size", type=int, default=None, metavar="BYTES")


def _worker(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models", default="", help="comma-separated models this worker serves (default: all)"
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="conch", description=__doc__)
    top.add_argument("--version", action="version", version=f"conch {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run Redis (if needed), a worker and the gateway")
    _common(serve)
    _http(serve)
    _worker(serve)
    gateway = sub.add_parser("gateway", help="run the HTTP gateway under gunicorn")
    _common(gateway)
    _http(gateway)
    worker = sub.add_parser("worker", help="run a Celery worker that serves models")
    _common(worker)
    _worker(worker)
    from repo_sync.cli import add_arguments as _sync

    _sync(sub.add_parser("sync", help="mirror a model repository from S3 or a folder (repo_sync)"))
    batch = sub.add_parser(
        "batch",
        help="run an offline batch job (JSONL of infer requests in S3) and follow it",
    )
    batch.add_argument("-m", "--model", required=True, help="the model to run every line on")
    batch.add_argument("-x", "--model-version", default="", help="default: the latest")
    batch.add_argument("--input", required=True, help="s3://bucket/key of the JSONL requests")
    batch.add_argument("--output", required=True, help="s3://bucket/key for the JSONL answers")
    batch.add_argument("-u", "--url", default="127.0.0.1:8000", help="the gateway (host:port)")
    batch.add_argument("--no-wait", action="store_true", help="print the job id and return at once")
    batch.add_argument("--log-verbose", type=int, default=0, metavar="N")
    return top


def settings_from(args: argparse.Namespace) -> Settings:
    s = Settings(model_repository=args.model_repository.resolve(), log_verbose=args.log_verbose)
    if args.redis_url:
        s.redis_url = args.redis_url
    s.auto_complete = not (args.disable_auto_complete_config or args.strict_model_config)
    for item in args.backend_config:
        backend, _, setting = item.partition(",")
        key, _, value = setting.partition("=")
        if backend == "onnxruntime" and key == "default-max-batch-size":
            s.default_max_batch_size = int(value)
        else:
            raise SystemExit(f"conch: unknown --backend-config {item!r}")
    if args.request_timeout_secs is not None:
        s.request_timeout_s = args.request_timeout_secs
    s.model_control_mode = ModelControlMode(args.model_control_mode)
    s.repository_poll_secs = args.repository_poll_secs
    s.load_models = list(args.load_model)
    if hasattr(args, "metrics_port"):
        s.metrics_port, s.allow_metrics = args.metrics_port, args.allow_metrics
    if getattr(args, "http_max_input_size", None):
        s.max_input_bytes = args.http_max_input_size
    models = getattr(args, "models", "")
    s.models = [m for m in models.split(",") if m] or None
    return s


def _logging(verbose: int) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose > 0 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _logging(args.log_verbose)
    if args.command == "sync":
        from repo_sync.cli import run as sync

        return sync(args)
    if args.command == "batch":
        return batch(args)
    if not args.model_repository.is_dir():
        raise SystemExit(f"conch: --model-repository {args.model_repository} is not a folder")
    if args.command == "worker":
        from conch.devtools import redis_server
        from conch.worker import app as worker_app

        settings = settings_from(args)
        settings.redis_url, _ = redis_server.resolve(settings.redis_url or None)
        worker_app.run(settings, loglevel="DEBUG" if args.log_verbose else "INFO")
        return 0
    if args.command == "gateway":
        from conch.settings import gateway_uses_gevent

        if gateway_uses_gevent():
            # Patch before redis (and ssl through it) is imported, as gevent asks.
            from gevent import monkey

            monkey.patch_all()
        from conch.devtools import redis_server
        from conch.frontend.http.server import run

        settings = settings_from(args)
        settings.redis_url, _ = redis_server.resolve(settings.redis_url or None)
        run(
            settings,
            bind=f"{args.http_address}:{args.http_port}",
            workers=args.http_workers,
            threads=args.http_thread_count,
        )
        return 0
    return serve(args)


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


def serve(args: argparse.Namespace) -> int:
    """The whole stack in one command: Redis if needed, one worker, the gateway."""
    from conch.devtools import redis_server

    settings = settings_from(args)
    url, private = redis_server.resolve(settings.redis_url or None)
    log = logging.getLogger("conch.serve")
    log.info("broker: %s%s", url, " (private redis-server)" if private else "")
    common = [sys.executable, "-m", "conch"]
    shared = [
        "--model-repository",
        str(settings.model_repository),
        "--redis-url",
        url,
        "--log-verbose",
        str(args.log_verbose),
    ]
    for item in args.backend_config:
        shared += ["--backend-config", item]
    if not settings.auto_complete:
        shared.append("--disable-auto-complete-config")
    if args.request_timeout_secs is not None:
        shared += ["--request-timeout-secs", str(args.request_timeout_secs)]
    shared += [
        "--model-control-mode",
        args.model_control_mode,
        "--repository-poll-secs",
        str(args.repository_poll_secs),
    ]
    for m in args.load_model:
        shared += ["--load-model", m]
    worker_cmd = [*common, "worker", *shared]
    if args.models:
        worker_cmd += ["--models", args.models]
    gateway_cmd = [
        *common,
        "gateway",
        *shared,
        "--http-port",
        str(args.http_port),
        "--http-address",
        args.http_address,
        "--http-thread-count",
        str(args.http_thread_count),
        "--http-workers",
        str(args.http_workers),
        "--metrics-port",
        str(args.metrics_port),
        f"--allow-metrics={str(args.allow_metrics).lower()}",
    ]
    if args.http_max_input_size:
        gateway_cmd += ["--http-max-input-size", str(args.http_max_input_size)]
    children = [subprocess.Popen(worker_cmd), subprocess.Popen(gateway_cmd)]
    log.info(
        "serving %s on http://%s:%d", settings.model_repository, args.http_address, args.http_port
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
                    log.error("%s exited with %s; stopping", " ".join(c.args[3:4]), c.returncode)
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
