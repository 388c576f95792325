"""HTTP routes of async and batch jobs: submit, poll the status, fetch the result, cancel.

The submit body is exactly an infer request body (JSON or binary tensors), and the
result is exactly the infer response, so a client switches between waiting and polling
by changing the URL. Triton has no such extension; the names follow its style. The
jobs themselves are the data plane's (``DataPlane.submit_job`` and the rest); these
routes only frame them in HTTP.

Restricted APIs: async jobs are the ``jobs`` group, offline batch jobs (which read and
write S3) the ``batch`` group. A job's status, result and cancel routes serve both, so
they check the group of the job's kind once they have found it.
"""

from __future__ import annotations

from typing import Any

import orjson
from flask import Blueprint, Response, request

from conch.core.errors import InvalidArgument
from conch.core.restricted_apis import ApiGroup
from conch.frontend.dataplane import CollectedOutcome, JobState
from conch.frontend.http import http_codec
from conch.frontend.http.api_groups import BY_JOB_KIND, api_group, refuse
from conch.frontend.http.fast_path import decode_call, too_large
from conch.frontend.http.routes import plane
from conch.wire import job_store

bp = Blueprint("jobs", __name__)
MAX_BATCH_SPEC_BYTES = 8192
_GROUP_OF_KIND = {job_store.INFER: ApiGroup.JOBS, job_store.BATCH: ApiGroup.BATCH}


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(obj), status=status, headers=headers, mimetype="application/json")


def _status(state: JobState) -> dict[str, Any]:
    record, outcome = state.record, state.outcome
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


def _accepted(state: JobState) -> Response:
    return _json(_status(state), 202, headers={"Location": f"/v2/jobs/{state.record.id}"})


def _allow(job_id: str) -> None:
    """Refuse the call unless it may see this job (its kind's group is open, or the
    call has that group's header); the job is looked up only when that matters."""
    rules = plane().settings.http_restricted_api
    if rules.get(ApiGroup.JOBS) or rules.get(ApiGroup.BATCH):
        kind = plane().job_status(job_id).record.kind
        refuse(rules, _GROUP_OF_KIND[kind], request.headers.get)


@bp.post("/v2/models/<model>/jobs")
@bp.post("/v2/models/<model>/versions/<int:version>/jobs")
@api_group(ApiGroup.JOBS)
def submit(model: str, version: int | None = None) -> Response:
    data_plane = plane()
    length = request.content_length
    if length is not None and length > data_plane.settings.max_input_bytes:
        limit = data_plane.settings.max_input_bytes
        raise too_large(length, limit, request.headers.get(http_codec.HEADER_LENGTH))
    to, infer_request = decode_call(
        data_plane,
        model,
        "" if version is None else str(version),
        request.get_data(cache=False),
        request.headers.get,
        endpoint="",  # a decoupled model's job collects its responses
    )
    traceparent = request.headers.get("traceparent", "")
    return _accepted(data_plane.submit_job(to, infer_request, traceparent))


@bp.post("/v2/models/<model>/batch")
@bp.post("/v2/models/<model>/versions/<int:version>/batch")
@api_group(ApiGroup.BATCH)
def submit_batch(model: str, version: int | None = None) -> Response:
    """An offline batch job: JSONL of infer requests in S3 in, JSONL of responses out."""
    if (request.content_length or 0) > MAX_BATCH_SPEC_BYTES:
        raise InvalidArgument(f"a batch job request is at most {MAX_BATCH_SPEC_BYTES} bytes")
    try:
        spec = orjson.loads(request.get_data(cache=False))
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(spec, dict) or set(spec) - {"input", "output"}:
        raise InvalidArgument(
            'a batch job is {"input": "s3://bucket/in.jsonl", "output": "s3://bucket/out.jsonl"}'
        )
    state = plane().submit_batch(
        model, "" if version is None else str(version), spec.get("input"), spec.get("output")
    )
    return _accepted(state)


@bp.get("/v2/jobs/<job_id>")
@api_group(BY_JOB_KIND)
def status(job_id: str) -> Response:
    _allow(job_id)
    return _json(_status(plane().job_status(job_id)))


@bp.delete("/v2/jobs/<job_id>")
@api_group(BY_JOB_KIND)
def cancel(job_id: str) -> Response:
    """Cancel a job that has not finished (``DataPlane.cancel_job``)."""
    _allow(job_id)
    return _json(_status(plane().cancel_job(job_id)))


@bp.get("/v2/jobs/<job_id>/result")
@api_group(BY_JOB_KIND)
def result(job_id: str) -> Response:
    """The infer response once the job is done (or its error); 202 and the status before.

    ``?wait=S`` holds the call up to S seconds for the job to finish (long polling).
    """
    try:
        wait = float(request.args.get("wait", 0))
    except ValueError:
        wait = -1.0
    _allow(job_id)
    state, outcome = plane().job_result(job_id, wait)
    if not state.done:
        return _json(_status(state), 202, headers={"Retry-After": "1"})
    if outcome is None:  # a batch job: its result is the output object; this says where
        return _json(_status(state))
    accept = request.headers.get("Accept-Encoding")
    if isinstance(outcome, CollectedOutcome):  # a decoupled model's: every response
        body, headers = http_codec.encode_collected(outcome, accept)
    else:
        body, headers = http_codec.encode_outcome(outcome, accept)
    return Response(body, status=200, headers=headers)
