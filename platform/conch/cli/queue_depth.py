"""``conch queue-depth``: the work each model's workers owe, read straight from Redis.

The same count as the gateway's ``GET /queue-depth`` and its ``conch_queue_*`` gauges
(``conch.wire.work_owed``), for an operator at a shell: no gateway needed, only the
broker. It reads Redis, not the model repository, so a model is named with ``--model``
or found by its queue's keys (every model with something waiting or in flight).
``--jobs`` adds the batch jobs queue (``conch.jobs``), as the endpoint's ``jobs=1`` does.
"""

from __future__ import annotations

import argparse
import sys

import orjson

from conch.settings import FLAGS, Settings

_SHARED_FLAGS = ("--redis-url",)  # declared once, in conch.settings
JOBS_ROW = "(jobs)"  # the batch jobs queue's row, a label as "(all)" is (the JSON keeps it apart)
_COLUMNS = ("MODEL", "ONLINE", "ASYNC", "OFFLINE", "WAITING", "IN FLIGHT", "OWED")


def add_arguments(p: argparse.ArgumentParser) -> None:
    for flag in FLAGS:
        if flag.name in _SHARED_FLAGS:
            flag.add_to(p)
    p.add_argument(
        "-m",
        "--model",
        action="append",
        default=[],
        metavar="MODEL",
        help="count this model (repeatable); default: every model with a queue in Redis",
    )
    p.add_argument(
        "--jobs",
        action="store_true",
        help="count the batch jobs queue too (jobs waiting and drivers running; in the "
        "totals, as the endpoint's jobs=1)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the JSON of the gateway's GET /queue-depth instead of a table",
    )


def run(args: argparse.Namespace) -> int:
    """Count, then print a table (or the JSON); 2 when Redis or a model name is refused."""
    import redis

    from conch.core.repository_keys import model_name_problem
    from conch.wire import worker_reports
    from conch.wire.redis_client import open_client
    from conch.wire.work_owed import (
        PRIORITY_CLASSES,
        jobs_owed,
        queued_models,
        summary,
        work_owed,
    )

    for name in args.model:
        problem = model_name_problem(name)
        if problem:
            print(f"conch queue-depth: {name!r} is not a model name: {problem}", file=sys.stderr)
            return 2
    try:
        settings = Settings.from_args(args)
    except ValueError as exc:
        print(f"conch queue-depth: {exc}", file=sys.stderr)
        return 2
    url = settings.redis_url or settings.local_redis_url
    client = open_client(url)
    try:
        work = work_owed(client, args.model or queued_models(client))
        jobs = jobs_owed(client) if args.jobs else None
        where = worker_reports.residency(worker_reports.snapshot(client))
    except redis.RedisError as exc:
        print(f"conch queue-depth: Redis at {url} did not answer: {exc}", file=sys.stderr)
        return 2
    total = summary(work, jobs, where)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(total, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    rows = [
        (name, *w.by_class().values(), w.waiting, w.in_flight, w.owed) for name, w in work.items()
    ]
    if jobs is not None:  # the batch jobs queue: no priority classes
        rows.append(
            (JOBS_ROW, *("-" for _ in PRIORITY_CLASSES), jobs.waiting, jobs.in_flight, jobs.owed)
        )
    if not rows:
        print("no model has work waiting or in flight", file=sys.stderr)
        return 0
    by_class = [sum(w.by_class()[kind] for w in work.values()) for kind in PRIORITY_CLASSES]
    rows.append(("(all)", *by_class, total["waiting"], total["in_flight"], total["owed"]))
    print(table(_COLUMNS, rows))
    return 0


def table(header: tuple[str, ...], rows: list[tuple]) -> str:
    """Columns padded to their widest cell: names left, numbers right."""
    cells = [tuple(str(c) for c in row) for row in (header, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    )
