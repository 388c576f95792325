"""Command line of repo_sync: ``conch sync ...`` and ``python -m repo_sync ...``.

This module stays cheap to import (``conch --help`` builds its parser from it); the sync
machinery is imported when a sync runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from conch.core.byte_sizes import parse_byte_size

log = logging.getLogger("repo_sync")


def byte_size(text: str) -> int:
    """``1048576``, ``512M``, ``64G`` (binary units), for --max-object-bytes."""
    try:
        return parse_byte_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        default=os.environ.get("MODEL_SOURCE", ""),
        metavar="URL|DIR",
        help="the repository to mirror: s3://bucket/prefix, s3://host:port/bucket/prefix, "
        "gs://bucket/prefix, as://account/container/prefix, or a folder (default: "
        "$MODEL_SOURCE; with none, the daemon idles)",
    )
    p.add_argument(
        "--model-repository",
        required=True,
        type=Path,
        metavar="DIR",
        help="the local cache that workers and gateways read (created if missing)",
    )
    p.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        metavar="SECS",
        help="seconds between polls of the source (default 15)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="sync once and exit (a second pass one poll later if versions wait to settle)",
    )
    p.add_argument(
        "--s3-endpoint-url",
        default=None,
        metavar="URL",
        help="S3 API endpoint (MinIO, ...); default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, AWS",
    )
    p.add_argument(
        "--s3-region",
        default=None,
        metavar="REGION",
        help="default: $AWS_DEFAULT_REGION, $AWS_REGION, the AWS config",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", ""),
        help="where repository events are published (default: $REDIS_URL; none: only logged)",
    )
    p.add_argument(
        "--require-ready-marker",
        action="store_true",
        help="take a version only once its <model>/<version>/.ready object exists",
    )
    p.add_argument(
        "--max-object-bytes",
        type=byte_size,
        default=64 << 30,
        metavar="SIZE",
        help="refuse larger objects (default 64G)",
    )
    p.add_argument(
        "--delete-delay-secs",
        type=float,
        default=30.0,
        metavar="SECS",
        help="old copies of replaced or removed versions are deleted this long after, "
        "for readers still reading them (default 30)",
    )
    p.add_argument(
        "--download-threads",
        type=int,
        default=4,
        metavar="N",
        help="objects of a version downloaded at once (default 4)",
    )
    p.add_argument(
        "--log-verbose", type=int, default=0, metavar="N", help="verbose logging when N > 0"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m repo_sync",
        description="Mirror a Triton model repository from S3, Google Cloud Storage, Azure "
        "Blob Storage or a folder into a local cache.",
    )
    add_arguments(p)
    return p


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def _handler(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)
        signal.signal(signal.SIGINT, _handler)
    return stop


def run(args: argparse.Namespace) -> int:
    """Run the sync the parsed ``args`` describe; the exit status."""
    from .events import Publisher
    from .sources import open_source
    from .sync import CacheError, Syncer, SyncOptions

    if args.repository_poll_secs < 0:
        log.error("--repository-poll-secs must be >= 0")
        return 2
    if not args.source:
        if args.once:
            log.error("no --source given (nor $MODEL_SOURCE): nothing to sync")
            return 2
        log.warning("no --source given (nor $MODEL_SOURCE): nothing to sync; idle until stopped")
        _stop_on_signals().wait()
        return 0
    try:
        source = open_source(args.source, endpoint_url=args.s3_endpoint_url, region=args.s3_region)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    options = SyncOptions(
        poll_secs=args.repository_poll_secs,
        require_ready_marker=args.require_ready_marker,
        max_object_bytes=args.max_object_bytes,
        download_threads=max(1, args.download_threads),
        delete_delay_secs=args.delete_delay_secs,
        progress=args.once and sys.stderr.isatty(),
    )
    try:
        syncer = Syncer(
            source, args.model_repository, options=options, publisher=Publisher(args.redis_url)
        )
    except CacheError as exc:
        log.error("%s", exc)
        return 2
    with syncer:
        if args.once:
            result = syncer.sync_settled()
            return 0 if result.listed and not result.errors else 1
        syncer.run(_stop_on_signals())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.log_verbose > 0 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return run(args)
