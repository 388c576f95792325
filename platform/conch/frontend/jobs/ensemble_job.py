"""Async jobs on an ensemble: the graph run by a worker's job driver, not by the gateway.

An ensemble has no queue of its own, and a job must outlive the gateway that took it.
So the job is a Celery task on ``conch.jobs``, as a batch job is: the worker that takes it
runs the graph (``ensemble_runner.GraphRunner``), each step on its model's queue at the
async step (below online traffic), and writes the result where any infer job's result
goes (``job_store.store``). A worker that dies running it hands it to another, which runs
it again; the first result stored stands. The task keeps no Celery result or state of its
own, so the job reads PENDING until its result is written, as a model's job does.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import redis

from conch.core import tracing
from conch.core.errors import ConchError, Internal, Unavailable
from conch.frontend import calls
from conch.frontend.ensemble_runner import GraphRunner
from conch.frontend.jobs.keepalive import keepalive
from conch.settings import Settings
from conch.wire import broker, job_store
from conch.wire.messages import BadMessage, InferMessage, Reply

log = logging.getLogger(__name__)

TASK_NAME = "conch.ensemble_job"


def submit(
    client: redis.Redis, record: job_store.JobRecord, msg: InferMessage, max_queued: int
) -> None:
    """Record the job and queue its task (gateway side); a full jobs queue is a 503."""
    if max_queued and client.llen(broker.JOBS_QUEUE) >= max_queued:
        raise Unavailable(
            f"Exceeds maximum queue size: {max_queued} jobs already wait on "
            f"'{broker.JOBS_QUEUE}' (CONCH_MAX_QUEUED_JOBS); retry later"
        )
    task = broker.envelope(
        {"id": record.id, "message": msg.to_dict()},
        task_id=record.id,
        queue=broker.JOBS_QUEUE,
        priority=0,
        reply_to=None,
        task=TASK_NAME,
        keep_result=False,  # run_task writes the job's result itself
    )
    pipe = client.pipeline(transaction=True)
    record.save(pipe, msg.job_ttl)
    pipe.lpush(broker.JOBS_QUEUE, task)
    pipe.execute()


def run_task(
    settings: Settings, client: redis.Redis, graph: GraphRunner, payload: dict[str, Any]
) -> None:
    """The body of the ``conch.ensemble_job`` task, in the worker that took it."""
    job_id = job_store.check_id(str(payload.get("id", "")))
    try:
        msg = InferMessage.from_dict(payload.get("message"))
    except BadMessage as exc:
        log.warning("ensemble job %s: unreadable message, dropped: %s", job_id, exc)
        return
    if msg.id != job_id or not msg.job_ttl:
        log.warning("ensemble job %s: the message is not this job's, dropped", job_id)
        return
    if job_store.cancelled(client, [job_id]):
        return  # cancelled while queued: REVOKED is already its result
    period = min(1.0, settings.visibility_timeout_s / 3)
    # The graph's steps are children of this span, itself the submission's child.
    traced = tracing.span("ensemble_job", msg.traceparent, model=msg.model)
    with keepalive(client, job_id, period), traced if msg.traceparent else nullcontext():
        try:
            entry = graph.resolve(msg.model)
            to = calls.target(entry, "" if msg.version == calls.LATEST else msg.version)
            reply = graph.reply(entry, msg, to.version, calls.Lane.ASYNC)
        except ConchError as exc:
            reply = Reply(msg.id, error=exc)
        except redis.RedisError:
            raise  # the task is redelivered once Redis is back
        except Exception as exc:
            log.exception("ensemble job %s failed", job_id)
            reply = Reply(msg.id, error=Internal(f"ensemble job failed: {exc}"))
    pipe = client.pipeline(transaction=False)
    job_store.store(pipe, job_id, msg.model, reply, msg.job_ttl)
    pipe.execute()
