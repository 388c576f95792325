"""``conch``: serve, gateway and worker, with Triton's flag names where Triton has them.

argv → ``Settings`` → one role. The flags of serve, gateway and worker, their defaults
and the environment variables behind them are all in ``conch.settings``; this package
only builds the parser from them and starts the role asked for: ``worker``,
``gateway``, ``grpc`` (with ``--grpc-workers`` above 1, ``cli/grpc_workers.py``) and
``autoscale`` (``conch.autoscale``) here, ``serve``
(``cli/serve.py``) as the first three (the worker, or an autoscaler of workers) in child
processes, plus ``batch``
(``cli/batch.py``, a client of a running gateway), ``queue-depth`` (``cli/queue_depth.py``,
the work owed, read from Redis), ``analyze`` (``cli/analyze.py``, the model analyzer) and
``sync`` (``repo_sync.cli``). The
CLI sits above every room, so it is the one place in conch that may import repo_sync.

Imports stay lazy: ``conch gateway``, and ``conch grpc`` on ``--grpc-transport h2``, must
patch the process for gevent before redis (and ssl through it) is imported.
"""

from __future__ import annotations

import argparse
import logging

from conch import server_log
from conch.core.backend_table import BACKENDS
from conch.settings import FLAGS, GrpcTransport, Role, Settings, add_arguments
from conch.version import __version__

log = logging.getLogger("conch.cli")

DESCRIPTION = (__doc__ or "").partition("\n")[0]
_ROLE_HELP = {
    Role.SERVE: "run Redis (if needed), a worker, the gateway and the gRPC server",
    Role.GATEWAY: "run the HTTP gateway under gunicorn",
    Role.GRPC: "run the gRPC server (Triton's GRPCInferenceService)",
    Role.WORKER: "run a Celery worker that serves models",
    Role.AUTOSCALE: "run MIN to MAX workers, started and retired on the work their models owe",
}


def parser() -> argparse.ArgumentParser:
    from conch.cli import analyze, batch, queue_depth
    from repo_sync.cli import add_arguments as sync_arguments

    top = argparse.ArgumentParser(prog="conch", description=DESCRIPTION)
    top.add_argument("--version", action="version", version=f"conch {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    for role, help_text in _ROLE_HELP.items():
        add_arguments(sub.add_parser(role, help=help_text), role)
    sync_arguments(
        sub.add_parser("sync", help="mirror a model repository from S3 or a folder (repo_sync)")
    )
    batch.add_arguments(
        sub.add_parser(
            "batch",
            help="run an offline batch job (JSONL of infer requests in S3) and follow it",
        )
    )
    queue_depth.add_arguments(
        sub.add_parser(
            "queue-depth",
            help="show the work each model's workers owe (waiting and in flight), from Redis",
        )
    )
    analyze.add_arguments(
        sub.add_parser(
            "analyze",
            help="sweep a model's batching and instance settings with perf_analyzer, "
            "rank them within a p99 latency budget",
        )
    )
    return top


def _logging(verbose: int) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose > 0 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _warn_ignored(settings: Settings) -> None:
    """A Triton launch line starts unchanged: what conch does not apply is named, once."""
    config = settings.backend_config
    for item in config.ignored:
        log.warning("--backend-config %s ignored: conch applies only default-max-batch-size", item)
    defaults = Settings()
    for flag in FLAGS:  # each flag that asks for what conch does not do (its default does not)
        if flag.ignored and getattr(settings, flag.field) != getattr(defaults, flag.field):
            log.warning("%s ignored: %s", flag.name, flag.ignored)
    for backend in sorted(set(config.max_batch_sizes) - {"", *BACKENDS}):
        log.warning(
            "--backend-config %s,...: conch has no backend '%s' (it has %s)",
            backend,
            backend,
            ", ".join(sorted(BACKENDS)),
        )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "sync":
        from repo_sync.cli import run as sync

        _logging(args.log_verbose)
        return sync(args)
    if args.command == "batch":
        from conch.cli import batch

        _logging(args.log_verbose)
        return batch.run(args)
    if args.command == "queue-depth":
        from conch.cli import queue_depth

        return queue_depth.run(args)
    if args.command == "analyze":
        from conch.cli import analyze

        return analyze.run(args)
    try:
        settings = Settings.from_args(args)
    except ValueError as exc:
        raise SystemExit(f"conch: {exc}") from None
    server_log.configure(settings)
    _warn_ignored(settings)
    from conch.cli import repository_mirror

    try:
        settings, mirrors = repository_mirror.mirror(settings)
    except repository_mirror.MirrorError as exc:
        raise SystemExit(f"conch: {exc}") from None
    try:
        for folder in settings.repository_folders:
            if not folder.is_dir():
                raise SystemExit(f"conch: --model-repository {folder} is not a folder")
        _check_rate_limits(args.command, settings)
        _check_exit_on_error(args.command, settings)
        return _run_role(args.command, settings)
    finally:
        repository_mirror.stop(mirrors)


def _check_rate_limits(command: str, settings: Settings) -> None:
    """A process that runs workers refuses to start, as Triton does, when the repository
    lists a rate-limit resource both as global and per device."""
    from conch.settings import RateLimitMode

    if command not in (Role.SERVE, Role.WORKER, Role.AUTOSCALE):
        return
    if settings.rate_limit is not RateLimitMode.EXECUTION_COUNT:
        return
    from conch.core.repository import ModelRepository
    from conch.worker.rate_limiter import resource_conflict

    entries = ModelRepository(settings.repository_folders).scan().values()
    problem = resource_conflict(entries)
    if problem:
        raise SystemExit(f"conch: --rate-limit execution_count: {problem}")


def _check_exit_on_error(command: str, settings: Settings) -> None:
    """--exit-on-error is refused where workers are autoscaled: the autoscaler replaces a
    worker that exits, which would then fail to load the same model again, and again."""
    autoscaled = command == Role.AUTOSCALE or (command == Role.SERVE and settings.workers)
    if settings.exit_on_error and autoscaled:
        raise SystemExit(
            "conch: --exit-on-error=true is refused with --workers: the autoscaler replaces "
            "a worker that exits, and the new one would fail to load the same model again; "
            "a model that fails to load is unavailable with its reason"
        )


def _run_role(command: str, settings: Settings) -> int:
    if command == Role.WORKER:
        return worker(settings)
    if command == Role.GATEWAY:
        return gateway(settings)
    if command == Role.GRPC:
        return grpc_server(settings)
    if command == Role.AUTOSCALE:
        return autoscale(settings)
    from conch.cli import serve

    return serve.run(settings)


def worker(settings: Settings) -> int:
    from conch.devtools import redis_server
    from conch.worker import app as worker_app

    settings.redis_url, _ = redis_server.resolve(settings.redis_url, settings.local_redis_url)
    return worker_app.run(settings, loglevel="DEBUG" if settings.log_verbose else "INFO")


def autoscale(settings: Settings) -> int:
    from conch.autoscale import loop
    from conch.devtools import redis_server

    if settings.workers is None:
        raise SystemExit("conch: autoscale needs --workers MIN:MAX")
    settings.redis_url, _ = redis_server.resolve(settings.redis_url, settings.local_redis_url)
    return loop.run(settings)


def gateway(settings: Settings) -> int:
    from conch.frontend.http.gevent_patch import patch_if_gevent

    patch_if_gevent(settings.http_worker_uses_gevent)  # before redis or gunicorn load
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


def grpc_server(settings: Settings) -> int:
    supervisor = settings.grpc_workers > 1 and not settings.grpc_shared_port
    on_h2 = settings.grpc_transport is GrpcTransport.H2
    if on_h2 and not supervisor:  # a server on h2 runs on gevent: patched before redis loads
        from conch.frontend.http.gevent_patch import patch_if_gevent

        patch_if_gevent(True)
    from conch.devtools import redis_server

    settings.redis_url, _ = redis_server.resolve(settings.redis_url, settings.local_redis_url)
    if supervisor:
        from conch.cli import grpc_workers

        return grpc_workers.run(settings)
    if on_h2:
        from conch.frontend.grpc.h2_server import run
    else:
        from conch.frontend.grpc.server import run

    run(settings)
    return 0
