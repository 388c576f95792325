"""The inference data plane: HTTP bytes in, HTTP bytes out, independent of any framework.

The Flask route and the WSGI fast path are thin adapters over ``DataPlane.infer``; it
decodes (codec), checks against the config (validation), applies the queue policy
(scheduling), waits on the dispatcher and encodes the reply.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from conch.core import ensemble_graph, inference, validation
from conch.core.errors import ConchError, InvalidArgument, Unavailable, Unsupported
from conch.core.repository import ModelEntry
from conch.frontend import calls, ensemble_runner, v2_codec
from conch.frontend.model_view import ModelView
from conch.frontend.producer import Dispatcher
from conch.settings import Settings
from conch.wire import job_store, statistics
from conch.wire.messages import Reply, WireTensor

# Triton's infer route: a model name without "/", an optional numeric version.
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer/?")


@dataclass
class Prepared:
    """A decoded, checked request and the call that will carry it."""

    entry: ModelEntry
    request: inference.InferRequest
    call: calls.Call


class DataPlane:
    def __init__(self, settings: Settings, catalog: ModelView, dispatcher: Dispatcher) -> None:
        self.settings = settings
        self.catalog = catalog
        self.dispatcher = dispatcher

    def infer(
        self,
        model: str,
        version: str,
        body: bytes,
        *,
        header_length: str | None,
        content_encoding: str | None,
        accept_encoding: str | None,
    ) -> tuple[bytes, dict[str, str]]:
        p = self.prepare(model, version, body, header_length, content_encoding)
        entry, msg, v = p.entry, p.call.msg, p.call.version
        now = msg.enqueued
        if entry.backend == ensemble_graph.ENSEMBLE:
            inputs = {t.name: (t.datatype, tuple(t.shape), t.raw) for t in p.request.inputs}
            rows = (
                p.request.inputs[0].shape[0]
                if entry.config.max_batch_size > 0 and p.request.inputs
                else 1
            )
            run = statistics.Execution(v, batch_size=rows)
            try:
                produced = ensemble_runner.execute(
                    entry,
                    inputs,
                    msg.outputs,
                    msg,
                    resolve=self.catalog.serving,
                    dispatcher=self.dispatcher,
                    check=self.catalog.check_available,
                )
            except ConchError:
                run.fail, run.fail_ns = 1, int((time.time() - now) * 1e9)
                statistics.record_now(self.dispatcher.client, model, run)
                raise
            run.success, run.rows = 1, rows
            run.success_ns = run.infer_ns = int((time.time() - now) * 1e9)
            statistics.record_now(self.dispatcher.client, model, run)
            results = [(name, *produced[name]) for name in msg.outputs]
        else:
            reply = self.dispatcher.call(msg, max_queue_size=p.call.max_queue_size)
            if reply.error is not None:
                raise reply.error
            results = list(reply.outputs or ())
            v = reply.version if reply.version > 0 else v
        return self.respond(entry, p.request, v, results, accept_encoding)

    def submit_job(
        self,
        model: str,
        version: str,
        body: bytes,
        *,
        header_length: str | None,
        content_encoding: str | None,
    ) -> job_store.JobRecord:
        """Queue an infer request as an async job, below every online request."""
        p = self.prepare(model, version, body, header_length, content_encoding, calls.Lane.ASYNC)
        if p.entry.backend == ensemble_graph.ENSEMBLE:
            raise Unsupported(
                f"model '{model}' is an ensemble, which runs in the gateway; async jobs run "
                "on a model's queue: submit the ensemble's steps, or call infer"
            )
        msg, req = p.call.msg, p.request
        msg.job_ttl = self.settings.job_ttl_s
        record = job_store.JobRecord(
            id=msg.id,
            model=model,
            version=version,
            submitted=msg.enqueued,
            detail={
                "id": req.id,
                "outputs": None
                if req.outputs is None
                else [[o.name, o.binary, o.class_count] for o in req.outputs],
                "binary_data_output": req.binary_data_output,
            },
        )
        client = self.dispatcher.client
        pipe = client.pipeline(transaction=False)
        record.save(pipe, msg.job_ttl)
        pipe.execute()
        limit = self.settings.max_queued_jobs
        if not self.dispatcher.publisher.publish(
            model,
            msg.to_dict(),
            task_id=msg.id,
            priority=msg.priority,
            reply_to=None,
            max_queue_size=limit,
        ):
            client.delete(job_store.record_key(msg.id))
            raise Unavailable(
                f"Exceeds maximum queue size: model '{model}' already has {limit} async jobs "
                "waiting (CONCH_MAX_QUEUED_JOBS); retry later"
            )
        return record

    def job_result(
        self, record: job_store.JobRecord, reply: Reply, accept_encoding: str | None
    ) -> tuple[bytes, dict[str, str]]:
        """A finished job's result, encoded as its infer call would have been answered."""
        if reply.error is not None:
            raise reply.error
        asked = record.detail
        request = inference.InferRequest(
            id=asked["id"],
            inputs=[],
            outputs=None
            if asked["outputs"] is None
            else [inference.RequestedOutput(n, bool(b), int(k)) for n, b, k in asked["outputs"]],
            binary_data_output=bool(asked["binary_data_output"]),
            parameters={},
        )
        entry = self.catalog.serving(record.model)
        return self.respond(
            entry, request, reply.version, list(reply.outputs or ()), accept_encoding
        )

    def prepare(
        self,
        model: str,
        version: str,
        body: bytes,
        header_length: str | None,
        content_encoding: str | None,
        lane: calls.Lane = calls.Lane.ONLINE,
    ) -> Prepared:
        """Decode and check a request against its model: every 4xx is raised here."""
        settings = self.settings
        entry = self.catalog.serving(model)
        to = calls.target(entry, version)
        if len(body) > settings.max_input_bytes:
            raise too_large(len(body), settings.max_input_bytes)
        req = v2_codec.decode_request(
            body, header_length, content_encoding, max_body_bytes=settings.max_input_bytes
        )
        validation.validate_request(req, entry.config, model_name=model)
        self.catalog.check_available(model)
        call = calls.build(to, req, lane=lane, default_timeout_s=settings.request_timeout_s)
        return Prepared(entry, req, call)

    def respond(
        self,
        entry: ModelEntry,
        request: inference.InferRequest,
        version: int,
        results: list[WireTensor],
        accept_encoding: str | None,
    ) -> tuple[bytes, dict[str, str]]:
        """The HTTP body and headers of an infer response, as ``request`` asked for it."""
        wire_types = self.catalog.output_types(entry)
        outputs = [
            inference.OutputTensor(name, wire_types.get(name, dt), tuple(shape), raw)
            for name, dt, shape, raw in results
        ]
        labels = entry.labels() if any(o.class_count for o in (request.outputs or ())) else None
        return v2_codec.encode_response(
            model_name=entry.name,
            model_version=str(version),
            request_id=request.id,
            outputs=outputs,
            request=request,
            labels=labels,
            batched=entry.config.max_batch_size > 0,
            accept_encoding=accept_encoding,
        )


def too_large(length: int, limit: int) -> InvalidArgument:
    return InvalidArgument(
        f"request body of {length} bytes exceeds the {limit}-byte limit (--http-max-input-size)"
    )


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def serve_infer(
    plane: DataPlane,
    match: re.Match[str],
    *,
    length: int,
    read: Callable[[int], bytes],
    header: Callable[[str], str | None],
) -> tuple[int, list[tuple[str, str]], bytes]:
    """One infer call, whatever server carries it: (status, headers, body), never raises.

    ``length`` is the Content-Length (0 when absent), ``read`` reads the body and
    ``header`` looks a request header up by name.
    """
    try:
        limit = plane.settings.max_input_bytes
        if length > limit:
            raise too_large(length, limit)
        body = read(length) if length else read(limit + 1)
        payload, headers = plane.infer(
            match.group(1),
            match.group(2) or "",
            body,
            header_length=header("Inference-Header-Content-Length"),
            content_encoding=header("Content-Encoding"),
            accept_encoding=header("Accept-Encoding"),
        )
        status = 200
    except ConchError as exc:
        status, payload = exc.status, orjson.dumps({"error": exc.message})
        headers = {"Content-Type": "application/json"}
    except Exception as exc:  # never a bare 500 page: Triton's error body, always
        status, payload = 500, orjson.dumps({"error": f"internal error: {exc}"})
        headers = {"Content-Type": "application/json"}
    return status, [*headers.items(), ("Content-Length", str(len(payload)))], payload


def status_line(status: int) -> str:
    return f"{status} {_REASONS.get(status, 'Error')}"


class InferFastPath:
    """WSGI middleware: infer calls go straight to the data plane, the rest to Flask.

    Flask's per-request machinery (contexts, routing, wrappers) costs the gateway more
    CPU than the rest of an infer call; the other routes keep it.
    """

    def __init__(self, app: Callable, plane: DataPlane) -> None:
        self.app = app
        self.plane = plane

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        match = INFER_PATH.fullmatch(environ.get("PATH_INFO", ""))
        if match is None or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        status, headers, payload = serve_infer(
            self.plane,
            match,
            length=length,
            read=environ["wsgi.input"].read,
            header=lambda name: environ.get("HTTP_" + name.upper().replace("-", "_")),
        )
        start_response(status_line(status), headers)
        return [payload]
