"""HTTP routes of async jobs (``conch.wire.job_store``): submit, poll the status, fetch the result.

The submit body is exactly an infer request body (JSON or binary tensors), and the
result is exactly the infer response, so a client switches between waiting and polling
by changing the URL. Triton has no such extension; the names follow its style.
"""

from __future__ import annotations

from typing import Any

import orjson
from flask import Blueprint, Response, current_app, request

from conch.core import ensemble_graph
from conch.core.errors import InvalidArgument, NotFound, Unsupported
from conch.frontend import batch_job
from conch.frontend.http.dataplane import DataPlane, too_large
from conch.wire import job_store

bp = Blueprint("jobs", __name__)
MAX_BATCH_SPEC_BYTES = 8192
MAX_WAIT_S = 60.0


def _plane() -> DataPlane:
    return current_app.extensions["conch.dataplane"]


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(obj), status=status, headers=headers, mimetype="application/json")


def _record(job_id: str) -> job_store.JobRecord:
    record = job_store.JobRecord.load(_plane().dispatcher.client, job_store.check_id(job_id))
    if record is None:
        raise NotFound(f"unknown job '{job_id}': it never existed, or its result has expired")
    return record


def _status(record: job_store.JobRecord, outcome: job_store.Outcome) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": record.id,
        "kind": record.kind,
        "model_name": record.model,
        "model_version": record.version,
        "status": outcome.status,
        "submitted": job_store.iso(record.submitted),
    }
    if record.kind == job_store.BATCH:
        doc.update(record.detail)  # input, output
        doc["progress"] = {k: record.progress.get(k, 0) for k in job_store.PROGRESS}
    if outcome.done_at:
        doc["finished"] = outcome.done_at
    if outcome.reply is not None and outcome.reply.error is not None:
        doc["error"] = outcome.reply.error.message
    return doc


@bp.post("/v2/models/<model>/jobs")
@bp.post("/v2/models/<model>/versions/<int:version>/jobs")
def submit(model: str, version: int | None = None) -> Response:
    plane = _plane()
    length = request.content_length
    if length is not None and length > plane.settings.max_input_bytes:
        raise too_large(length, plane.settings.max_input_bytes)
    record = plane.submit_job(
        model,
        "" if version is None else str(version),
        request.get_data(cache=False),
        header_length=request.headers.get("Inference-Header-Content-Length"),
        content_encoding=request.headers.get("Content-Encoding"),
    )
    location = f"/v2/jobs/{record.id}"
    return _json(
        _status(record, job_store.Outcome(job_store.PENDING)), 202, headers={"Location": location}
    )


@bp.post("/v2/models/<model>/batch")
@bp.post("/v2/models/<model>/versions/<int:version>/batch")
def submit_batch(model: str, version: int | None = None) -> Response:
    """An offline batch job: JSONL of infer requests in S3 in, JSONL of responses out."""
    plane = _plane()
    entry = plane.catalog.serving(model)
    if version is not None:
        entry.resolve_version(str(version))
    if entry.backend == ensemble_graph.ENSEMBLE:
        raise Unsupported(
            f"model '{model}' is an ensemble, which runs in the gateway; batch jobs run on a "
            "model's queue: submit a job per step model"
        )
    if (request.content_length or 0) > MAX_BATCH_SPEC_BYTES:
        raise InvalidArgument(f"a batch job request is at most {MAX_BATCH_SPEC_BYTES} bytes")
    record = batch_job.submit(
        plane.dispatcher.client,
        entry,
        "" if version is None else str(version),
        request.get_data(cache=False),
        plane.settings.job_ttl_s,
    )
    return _json(
        _status(record, job_store.Outcome(job_store.PENDING)),
        202,
        headers={"Location": f"/v2/jobs/{record.id}"},
    )


@bp.get("/v2/jobs/<job_id>")
def status(job_id: str) -> Response:
    record = _record(job_id)
    return _json(_status(record, job_store.read(_plane().dispatcher.client, record.id)))


@bp.delete("/v2/jobs/<job_id>")
def cancel(job_id: str) -> Response:
    """Cancel a job that has not finished: a queued request never runs; a batch job stops
    sending lines (those already queued still run) and uploads nothing."""
    record = _record(job_id)
    client = _plane().dispatcher.client
    if not job_store.cancel(client, record.id, _plane().settings.job_ttl_s):
        outcome = job_store.read(client, record.id)
        raise InvalidArgument(f"job {record.id} has already finished ({outcome.status})")
    return _json(_status(record, job_store.read(client, record.id)))


@bp.get("/v2/jobs/<job_id>/result")
def result(job_id: str) -> Response:
    """The infer response once the job is done (or its error); 202 and the status before.

    ``?wait=S`` holds the call up to S seconds for the job to finish (long polling).
    """
    record = _record(job_id)
    client = _plane().dispatcher.client
    try:
        wait = float(request.args.get("wait", 0))
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= MAX_WAIT_S:
        raise InvalidArgument(f"'wait' must be a number of seconds from 0 to {MAX_WAIT_S}")
    outcome = job_store.wait(client, record.id, wait) if wait else job_store.read(client, record.id)
    if outcome.status in (job_store.PENDING, job_store.STARTED):
        return _json(_status(record, outcome), 202, headers={"Retry-After": "1"})
    if record.kind == job_store.BATCH:  # its result is the output object; this says where
        if outcome.reply is not None and outcome.reply.error is not None:
            raise outcome.reply.error
        return _json(_status(record, outcome))
    body, headers = _plane().job_result(
        record, outcome.reply, request.headers.get("Accept-Encoding")
    )
    return Response(body, status=200, headers=headers)
