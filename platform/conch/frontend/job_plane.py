"""The data plane's jobs: async jobs and offline batch jobs, submitted and answered.

``DataPlane`` hands its job calls here. An async job is an infer request checked as an
infer call is (``Inference.prepare``) and queued below every online request; its result
is kept in the job store (``conch.wire.job_store``) until read or expired. A job on an
ensemble, and a batch job, is run by a worker's job driver (``frontend/jobs``); this side
records and queues it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from conch.core import ensemble_graph, tracing
from conch.core.errors import InvalidArgument, NotFound, Unavailable
from conch.core.inference import InferRequest, RequestedOutput
from conch.frontend import calls
from conch.frontend.inference import Inference, InferOutcome
from conch.frontend.jobs import batch_job, ensemble_job
from conch.frontend.model_view import ModelView
from conch.frontend.producer import Dispatcher
from conch.frontend.sequence_route import SequenceRoute
from conch.settings import Settings
from conch.wire import job_store, statistics

MAX_JOB_WAIT_S = 60.0  # the longest a job result call may be held waiting (long polling)


@dataclass
class JobState:
    """An async or batch job's record and where it stands."""

    record: job_store.JobRecord
    outcome: job_store.Outcome

    @property
    def done(self) -> bool:
        return self.outcome.status not in (job_store.PENDING, job_store.STARTED)


@dataclass
class CollectedOutcome:
    """A decoupled model's async job, answered: each of its responses as an
    ``InferOutcome``, in order (none when the model sent only its final flag)."""

    model: str
    version: int
    request_id: str
    responses: list[InferOutcome]


@dataclass(eq=False)
class JobPlane:
    """The job calls of one data plane (see the module docstring)."""

    settings: Settings
    view: ModelView
    dispatcher: Dispatcher
    sequences: SequenceRoute
    inference: Inference

    @property
    def _client(self) -> redis.Redis:
        return self.dispatcher.client

    def submit_job(
        self, to: calls.Target, request: InferRequest, traceparent: str = ""
    ) -> JobState:
        """Queue an infer request as an async job, below every online request. Its
        ``job`` span (the submission) is the parent of the worker's spans for it."""
        with tracing.span("job", traceparent, model=to.entry.name, request_id=request.id):
            return self._submit_job(to, request)

    def _submit_job(self, to: calls.Target, request: InferRequest) -> JobState:
        call = self.inference.prepare(to, request, calls.Lane.ASYNC)
        model = to.entry.name
        msg = call.msg
        msg.job_ttl = self.settings.job_ttl_s
        msg.collect = to.decoupled  # its result holds every response, in order
        record = job_store.JobRecord(
            id=msg.id,
            model=model,
            version="" if to.latest else str(to.version),
            submitted=msg.enqueued,
            detail={
                "id": request.id,
                "outputs": None
                if request.outputs is None
                else [[o.name, o.binary, o.class_count] for o in request.outputs],
                "binary_data_output": request.binary_data_output,
            },
        )
        limit = self.settings.max_queued_jobs
        if to.entry.backend == ensemble_graph.ENSEMBLE:  # a worker's job driver runs its graph
            ensemble_job.submit(self._client, record, msg, limit)
            self._count_job(model, job_store.INFER)
            return JobState(record, job_store.Outcome(job_store.PENDING))
        pipe = self._client.pipeline(transaction=False)
        record.save(pipe, msg.job_ttl)
        pipe.execute()
        if not self.dispatcher.publisher.publish(
            model,
            msg.to_dict(),
            task_id=msg.id,
            priority=msg.priority,
            reply_to=None,
            max_queue_size=limit,
        ):
            self._client.delete(job_store.record_key(msg.id))
            statistics.record_failure(self._client, model, call.version, statistics.REJECTED)
            raise Unavailable(
                f"Exceeds maximum queue size: model '{model}' already has {limit} async jobs "
                "waiting (CONCH_MAX_QUEUED_JOBS); retry later"
            )
        self._count_job(model, job_store.INFER)
        return JobState(record, job_store.Outcome(job_store.PENDING))

    def _count_job(self, model: str, kind: str) -> None:
        """One more ``kind`` job submitted for ``model`` (``conch_jobs_total``)."""
        pipe = self._client.pipeline(transaction=False)
        statistics.count_model(pipe, model, statistics.job_field(kind, statistics.JOB_SUBMITTED))
        pipe.execute()

    def submit_batch(self, model: str, version: str, source: Any, target: Any) -> JobState:
        """An offline batch job: JSONL of infer requests at ``source`` (an s3:// URI),
        JSONL of responses to ``target``."""
        entry = self.view.serving(model)
        if version:
            entry.resolve_version(version)
        if self.sequences.spec(entry.config) is not None:
            raise self.sequences.refuse_job(model)
        record = batch_job.submit(
            self._client, entry, version, source, target, self.settings.job_ttl_s
        )
        return JobState(record, job_store.Outcome(job_store.PENDING))

    def job_status(self, job_id: str) -> JobState:
        record = self._record(job_id)
        return JobState(record, job_store.read(self._client, record.id))

    def cancel_job(self, job_id: str) -> JobState:
        """Cancel a job that has not finished: a queued request never runs; a batch job
        stops sending lines (those already queued still run) and uploads nothing."""
        record = self._record(job_id)
        if not job_store.cancel(self._client, record, self.settings.job_ttl_s):
            outcome = job_store.read(self._client, record.id)
            raise InvalidArgument(f"job {record.id} has already finished ({outcome.status})")
        return JobState(record, job_store.read(self._client, record.id))

    def job_result(
        self, job_id: str, wait_s: float = 0.0
    ) -> tuple[JobState, InferOutcome | CollectedOutcome | None]:
        """Where the job stands, held up to ``wait_s`` for it to finish; a finished infer
        job's outcome as its infer call would have been answered (a decoupled model's:
        one per response, in order; None for a batch job, whose result is its output
        object). A failed job raises its error."""
        record = self._record(job_id)
        if not 0 <= wait_s <= MAX_JOB_WAIT_S:
            raise InvalidArgument(f"'wait' must be a number of seconds from 0 to {MAX_JOB_WAIT_S}")
        outcome = (
            job_store.wait(self._client, record.id, wait_s)
            if wait_s
            else job_store.read(self._client, record.id)
        )
        state = JobState(record, outcome)
        if not state.done:
            return state, None
        reply = outcome.reply
        if reply is not None and reply.error is not None:
            raise reply.error
        if record.kind == job_store.BATCH or reply is None:
            return state, None
        asked = record.detail
        request = InferRequest(
            id=asked["id"],
            inputs=[],
            outputs=None
            if asked["outputs"] is None
            else [RequestedOutput(n, bool(b), int(k)) for n, b, k in asked["outputs"]],
            binary_data_output=bool(asked["binary_data_output"]),
            parameters={},
        )
        entry = self.view.serving(record.model)
        answer = self.inference.outcome
        if reply.responses is not None:
            responses = [
                answer(entry, request.narrowed(t[0] for t in outputs), reply.version, outputs)
                for outputs in reply.responses
            ]
            return state, CollectedOutcome(entry.name, reply.version, request.id, responses)
        return state, answer(entry, request, reply.version, list(reply.outputs or ()))

    def _record(self, job_id: str) -> job_store.JobRecord:
        record = job_store.JobRecord.load(self._client, job_store.check_id(job_id))
        if record is None:
            raise NotFound(f"unknown job '{job_id}': it never existed, or its result has expired")
        return record


__all__ = ["MAX_JOB_WAIT_S", "CollectedOutcome", "JobPlane", "JobState"]
