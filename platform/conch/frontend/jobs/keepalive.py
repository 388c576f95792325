"""What a job's driver keeps alive while it runs in a worker (batch jobs, ensembles' jobs)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import redis

from conch.wire import broker
from conch.wire.messages import REPLY_TTL_S


@contextlib.contextmanager
def keepalive(
    client: redis.Redis, job_id: str, period: float, reply_key: str = ""
) -> Iterator[None]:
    """While the job runs, keep kombu from restoring the task's message (its delivery tag
    is the job id), however long the job or one of its uploads takes, and its reply list
    (``reply_key``, if it has one) from expiring while the job is busy elsewhere (a slow
    read); and count it as work owed, in flight (``broker.job_running``: a group at zero
    is woken by the jobs it owes, and one running a job is not scaled down under it).
    The mark is renewed on every beat, so a Redis that lost it (a restart) has it again."""
    done = threading.Event()
    broker.job_running(client, job_id)

    def beat() -> None:
        while not done.wait(period):
            with contextlib.suppress(redis.RedisError):
                broker.touch(client, [job_id])
                broker.job_running(client, job_id)
                if reply_key:
                    client.expire(reply_key, REPLY_TTL_S)

    threading.Thread(target=beat, name=f"job-{job_id[:8]}", daemon=True).start()
    try:
        yield
    finally:
        done.set()
        with contextlib.suppress(redis.RedisError):
            broker.job_ended(client, job_id)
