"""Async jobs: an infer request that waits below online traffic, its result polled by id.

A job is an ordinary infer message on its model's queue, one priority step below every
online level, so the batcher serves it only from slots online requests leave free. The
worker stores the reply where Celery's Redis result backend keeps a task's state
(``celery-task-meta-<id>``, msgpack), so Celery's ``AsyncResult`` can read it as well as
the gateway. The gateway keeps a small record of what the client asked for (which
outputs, binary or JSON), so the result comes back exactly as the infer call would have.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgpack
import orjson
import redis

from conch.core.errors import Cancelled, ConchError, InvalidArgument, error_class, from_code
from conch.wire import statistics
from conch.wire.keys import JOB_RECORD_PREFIX, JOB_RESULT_PREFIX
from conch.wire.messages import MAX_COLLECTED, BadMessage, Reply, WireTensor, read_tensor
from conch.wire.redis_link import CommandQueue

JOB_ID = re.compile(r"[0-9a-f]{32}")

PENDING, STARTED, SUCCESS, FAILURE = "PENDING", "STARTED", "SUCCESS", "FAILURE"
REVOKED = "REVOKED"  # Celery's name for a cancelled task
INFER, BATCH = "infer", "batch"  # one request; an offline batch job (conch.frontend.jobs.batch_job)
PROGRESS = ("lines", "failed")


# KEYS: the job's result, its model's statistics hash. ARGV: the result, its TTL (s), the
# counter to add 1 to if this result is the first (``conch_jobs_total``). Returns 1 then.
_FIRST_RESULT_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2], 'NX') then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
  return 1
end
return 0
"""


def _first_result(
    pipe: CommandQueue, job_id: str, model: str, meta: bytes, ttl_s: int, state: str
) -> None:
    """Write the job's result unless one stands, counting it under ``state`` if written."""
    counter = statistics.model_field(statistics.job_field(INFER, state))
    pipe.eval(_FIRST_RESULT_LUA, 2, result_key(job_id), statistics.key(model), meta, ttl_s, counter)


def result_key(job_id: str) -> str:
    return JOB_RESULT_PREFIX + job_id


def record_key(job_id: str) -> str:
    return JOB_RECORD_PREFIX + job_id


def check_id(job_id: str) -> str:
    """A job id from a URL: ours are 32 hex digits, and nothing else may name a key."""
    if not JOB_ID.fullmatch(job_id):
        raise InvalidArgument(f"'{job_id}' is not a job id (expected 32 hex digits)")
    return job_id


@dataclass
class JobRecord:
    """What the gateway needs to answer for a job later, kept beside its result."""

    id: str
    model: str
    version: str  # as the client named it; "" = the latest
    submitted: float  # epoch seconds
    # INFER: how the client wants the result encoded: the request's id, its output list
    # ([name, binary, class_count] each, or None for all) and binary_data_output.
    # BATCH: the input and output object URIs (conch.frontend.jobs.batch_job).
    detail: dict[str, Any]
    kind: str = INFER
    progress: dict[str, int] = field(default_factory=dict)  # BATCH: lines done, failed

    def save(self, pipe: redis.client.Pipeline, ttl_s: int) -> None:
        key = record_key(self.id)
        pipe.hset(
            key,
            mapping={
                "kind": self.kind,
                "model": self.model,
                "version": self.version,
                "submitted": repr(self.submitted),
                "detail": orjson.dumps(self.detail),
            },
        )
        pipe.expire(key, ttl_s)

    @classmethod
    def load(cls, client: redis.Redis, job_id: str) -> JobRecord | None:
        fields = client.hgetall(record_key(job_id))
        if not fields:
            return None
        f = {k.decode(): v for k, v in fields.items()}
        return cls(
            id=job_id,
            model=f["model"].decode(),
            version=f["version"].decode(),
            submitted=float(f["submitted"]),
            detail=orjson.loads(f["detail"]),
            kind=f["kind"].decode(),
            progress={k: int(f[k]) for k in PROGRESS if k in f},
        )


def report_progress(client: redis.Redis, job_id: str, **counts: int) -> None:
    """A running batch job's counters, shown by its status; raises JobCancelled once
    the job has been cancelled."""
    pipe = client.pipeline(transaction=False)
    pipe.hset(record_key(job_id), mapping=counts)
    pipe.hget(record_key(job_id), "cancelled")
    if pipe.execute()[1]:
        raise JobCancelled(job_id)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def store(pipe: CommandQueue, job_id: str, model: str, reply: Reply, ttl_s: int) -> None:
    """Write a job's reply as Celery's result backend would write a task's (worker side)."""
    if reply.error is None:
        status = SUCCESS
        result: dict[str, Any] = {"model_name": model, "model_version": str(reply.version)}
        if reply.responses is not None:  # a decoupled model's, every response in order
            result["responses"] = [{"outputs": _stored(r)} for r in reply.responses]
        else:
            result["outputs"] = _stored(reply.outputs or [])
    else:
        status = FAILURE
        err = reply.error
        # Celery rebuilds the exception from exc_type/exc_message (exc_module None: a
        # class of that name is made up, nothing is imported); conch_* are ours.
        result = {
            "exc_type": type(err).__name__,
            "exc_message": [err.message],
            "exc_module": None,
            "conch_code": err.code,
            "conch_status": err.status,
        }
    meta = _meta(job_id, status, result)
    # The first result stands: a request run twice (redelivered after a crash) or one
    # cancelled before it ran does not overwrite it (nor is it counted again).
    state = statistics.JOB_SUCCEEDED if status == SUCCESS else statistics.JOB_FAILED
    _first_result(pipe, job_id, model, meta, ttl_s, state)
    pipe.publish(result_key(job_id), meta)  # what Celery's AsyncResult.get() listens for


def _stored(outputs: list[WireTensor]) -> list[dict[str, Any]]:
    return [
        {"name": n, "datatype": dt, "shape": list(shape), "data": raw}
        for n, dt, shape, raw in outputs
    ]


def _read_outputs(stored: Any) -> list[WireTensor]:
    return [read_tensor([o["name"], o["datatype"], o["shape"], o["data"]]) for o in stored]


def _meta(job_id: str, status: str, result: Any) -> bytes:
    return msgpack.packb(
        {
            "status": status,
            "result": result,
            "traceback": None,
            "children": [],
            "date_done": iso(time.time()),
            "task_id": job_id,
        },
        use_bin_type=True,
    )


def cancel(client: redis.Redis, record: JobRecord, ttl_s: int) -> bool:
    """Mark a job cancelled unless it has finished; False when it had.

    A queued infer job is then dropped by the worker that pops it (and counted cancelled
    here); a batch job stops sending lines at its next progress report (its driver
    counts it).
    """
    job_id = record.id
    pipe = client.pipeline(transaction=True)
    pipe.hset(record_key(job_id), "cancelled", 1)
    if record.kind == INFER:
        _first_result(pipe, job_id, record.model, _revoked(job_id), ttl_s, statistics.JOB_CANCELLED)
    else:
        pipe.set(result_key(job_id), _revoked(job_id), ex=ttl_s, nx=True)
    _, stored = pipe.execute()
    if stored:
        client.publish(result_key(job_id), b"")  # wakes anyone waiting on it
    return bool(stored) or read(client, job_id).status not in (SUCCESS, FAILURE)


def revoke(client: redis.Redis, job_id: str, ttl_s: int) -> None:
    """A running batch job's own answer to its cancel: REVOKED over its STARTED state."""
    client.set(result_key(job_id), _revoked(job_id), ex=ttl_s)
    client.publish(result_key(job_id), b"")


def _revoked(job_id: str) -> bytes:
    error = {"exc_type": "TaskRevokedError", "exc_message": ["cancelled"], "exc_module": None}
    return _meta(job_id, REVOKED, error)


class JobCancelled(Exception):
    """Raised inside a batch job once its cancel is seen."""


def cancelled(client: redis.Redis, job_ids: list[str]) -> set[str]:
    """Which of these jobs were cancelled (one round trip; worker side)."""
    if not job_ids:
        return set()
    flags = client.pipeline(transaction=False)
    for job_id in job_ids:
        flags.hget(record_key(job_id), "cancelled")
    return {j for j, f in zip(job_ids, flags.execute(), strict=True) if f}


@dataclass
class Outcome:
    status: str
    reply: Reply | None = None  # set when an infer job has finished, or any job failed
    done_at: str = ""
    summary: dict[str, Any] = field(default_factory=dict)  # a finished batch job's result


def read(client: redis.Redis, job_id: str) -> Outcome:
    """A job's state as the worker left it; broker data is checked, never trusted."""
    raw = client.get(result_key(job_id))
    if raw is None:
        return Outcome(PENDING)
    try:
        meta = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        status = meta["status"]
        result = meta["result"]
        done_at = str(meta.get("date_done") or "")
        if status == SUCCESS and "responses" in result:  # a decoupled model's
            stored = result["responses"]
            if not isinstance(stored, list) or len(stored) > MAX_COLLECTED:
                raise BadMessage("a job's responses are not a bounded list")
            responses = [_read_outputs(r["outputs"]) for r in stored]
            version = int(result.get("model_version") or 0)
            reply = Reply(job_id, responses=responses, version=version)
            return Outcome(SUCCESS, reply, done_at)
        if status == SUCCESS and "outputs" not in result:  # a batch job's summary
            return Outcome(SUCCESS, None, done_at, summary=dict(result))
        if status == STARTED:
            return Outcome(STARTED)
        if status == REVOKED:
            error = Cancelled(f"job {job_id} was cancelled")
            return Outcome(REVOKED, Reply(job_id, error=error), done_at)
        if status == SUCCESS:
            outputs = _read_outputs(result["outputs"])
            version = int(result.get("model_version") or 0)
            return Outcome(SUCCESS, Reply(job_id, outputs=outputs, version=version), done_at)
        if status == FAILURE:
            message = result["exc_message"]
            message = " ".join(map(str, message)) if isinstance(message, list) else str(message)
            code, http = result.get("conch_code"), result.get("conch_status")
            if code is None and result.get("exc_module") == "conch.core.errors":
                # Raised by a batch job's Celery task and stored by Celery itself.
                cls = error_class(str(result.get("exc_type")))
                code, http = cls.code, cls.status
            error: ConchError = from_code(str(code or "INTERNAL"), message, int(http or 500))
            return Outcome(FAILURE, Reply(job_id, error=error), done_at)
    except (BadMessage, KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
        return Outcome(
            FAILURE,
            Reply(job_id, error=from_code("INTERNAL", f"unreadable job result: {exc}", 500)),
        )
    return Outcome(PENDING)


def wait(client: redis.Redis, job_id: str, seconds: float) -> Outcome:
    """The job's outcome once it has finished, or as it stands after ``seconds``.

    Listens where Celery's result backend (and conch's worker) announce a result, so a
    waiting client costs a subscription, not a poll.
    """
    deadline = time.monotonic() + seconds
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(result_key(job_id))
        while True:
            outcome = read(client, job_id)  # after subscribing: no result slips between
            left = deadline - time.monotonic()
            if outcome.status not in (PENDING, STARTED) or left <= 0:
                return outcome
            pubsub.get_message(timeout=min(left, 1.0))
    finally:
        pubsub.close()
