"""The OpenAPI 3.1 document of the gateway's HTTP API, built once from the tables here.

It describes every route the app serves: Triton's v2 routes (health, metadata, config,
statistics, the repository API, infer), conch's async and offline batch jobs, and this
document with its docs page. The gateway serves it at ``GET /v2/openapi.json``; the test
suite fuzzes the real server against it (schemathesis), and a unit test checks that the
app's routes and the document's paths are the same set. Where a fact has a home in the
code (the datatypes, the statistics fields, the job states, the limits), the document
takes it from there rather than repeating it.

Prometheus metrics are not here: they are served on the metrics port (``--metrics-port``),
not under ``/v2``, in Prometheus' text format, as Triton serves them; so is conch's
``GET /queue-depth`` (the work owed, in JSON, for KEDA: ``conch.wire.work_owed``).
"""

from __future__ import annotations

import copy
import dataclasses
from functools import cache
from typing import Any

from conch import server_log
from conch.core import trace_config
from conch.core.datatypes import WIRE_TO_NUMPY
from conch.frontend import v2_json
from conch.frontend.dataplane import MAX_JOB_WAIT_S
from conch.frontend.http import openai_routes
from conch.frontend.http.http_codec import HEADER_LENGTH
from conch.frontend.http.job_routes import MAX_BATCH_SPEC_BYTES
from conch.settings import LogFormat
from conch.version import __version__
from conch.wire import job_store, statistics, traffic_split, worker_reports

Schema = dict[str, Any]

DOCUMENT_PATH = "/v2/openapi.json"
DOCS_PATH = "/v2/docs"

# Statuses any operation may answer, whatever it is: a malformed request (400), an API
# restricted by --http-restricted-api without its header (403), a URI or header block
# too long (414, 431), and the broker out of reach (503). Each carries the error body.
GENERIC_ERRORS = {
    "400": "The request is malformed or refers to something the server refuses.",
    "403": "The API is restricted (`--http-restricted-api`) and the request lacks its header.",
    "414": "The request URI is too long.",
    "431": "The request's header fields are too large.",
    "503": "The service is unavailable: the broker cannot be reached, a queue is full, "
    "or the model is not available.",
}
# Statuses only some operations answer.
_NOT_FOUND = {"404": "No such model version, or no such job."}
_MODEL_FAILED = {"500": "The model failed while running the request (its INTERNAL error)."}
_UNSUPPORTED = {"501": "The request is valid but conch does not support it for this model."}


def _ref(kind: str, name: str) -> Schema:
    return {"$ref": f"#/components/{kind}/{name}"}


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


_STR = {"type": "string"}


def _object(properties: Schema, *required: str, **extra: Any) -> Schema:
    """An object schema: its properties, the names it must have, and anything else."""
    out: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        out["required"] = list(required)
    return out


def _uint(description: str = "") -> Schema:
    out: Schema = {"type": "integer", "minimum": 0}
    if description:
        out["description"] = description
    return out


_EMPTY = {"description": "Success; the body is empty."}
_BINARY_BODY = {
    "type": "string",
    "format": "binary",
    "description": f"The JSON document ({HEADER_LENGTH} bytes long), then the binary tensors.",
}


def _schemas() -> dict[str, Schema]:
    datatype = {
        "type": "string",
        "enum": list(WIRE_TO_NUMPY),
        "description": "A tensor datatype. FP16 and BF16 travel only as binary data.",
    }
    duration = {
        "type": "object",
        "required": ["count", "ns"],
        "properties": {"count": _uint(), "ns": _uint("Total nanoseconds.")},
    }
    tensor_meta = {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": {"type": "string"},
            "datatype": _ref("schemas", "Datatype"),
            "shape": {
                "type": "array",
                "items": {"type": "integer", "minimum": -1},
                "description": "-1 for a variable dimension (the batch one included).",
            },
        },
    }
    scalar = [{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}]
    return {
        "Error": _object(
            {"error": _STR}, "error", description="Every error answer has this body (Triton's)."
        ),
        "GenerateRequest": {
            "type": "object",
            "description": "Triton's generate extension: each field named after one of the "
            "model's inputs is that input (a scalar or a flat list), any other a request "
            "parameter (string, integer, boolean or number); `parameters` holds more of "
            "either; `id` is the request's id.",
            "properties": {
                "id": _STR,
                "parameters": {"type": "object", "additionalProperties": True},
            },
            "additionalProperties": True,
        },
        "GenerateResponse": {
            "type": "object",
            "description": "One response: `id` (when the request had one), `model_name`, "
            "`model_version`, and each output by name (a one-element output as its value, "
            "others as a flat list).",
            "required": ["model_name", "model_version"],
            "properties": {"id": _STR, "model_name": _STR, "model_version": _STR},
            "additionalProperties": True,
        },
        "Datatype": datatype,
        "ServerMetadata": _object(
            {"name": _STR, "version": _STR, "extensions": {"type": "array", "items": _STR}},
            "name",
            "version",
            "extensions",
        ),
        "TensorMetadata": tensor_meta,
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "versions", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _ref("schemas", "TensorMetadata")},
                "outputs": {"type": "array", "items": _ref("schemas", "TensorMetadata")},
            },
        },
        "ModelConfig": {
            "type": "object",
            "description": "The completed model configuration as Triton's JSON (the "
            "ModelConfig protobuf's field names, int64 fields as numbers).",
            "additionalProperties": True,
        },
        "Duration": duration,
        "ModelStatistics": {
            "type": "object",
            "required": [
                "name",
                "version",
                "last_inference",
                "inference_count",
                "execution_count",
                "inference_stats",
                "response_stats",
                "batch_stats",
                "memory_usage",
            ],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "last_inference": _uint("Milliseconds since the epoch; 0 before any."),
                "inference_count": _uint("Batch elements inferred."),
                "execution_count": _uint("Model executions."),
                "inference_stats": {
                    "type": "object",
                    "required": list(statistics.DURATIONS),
                    "properties": {d: _ref("schemas", "Duration") for d in statistics.DURATIONS},
                },
                "response_stats": {"type": "object"},
                "batch_stats": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["batch_size", *statistics.BATCH_PHASES],
                        "properties": {
                            "batch_size": _uint(),
                            **{p: _ref("schemas", "Duration") for p in statistics.BATCH_PHASES},
                        },
                    },
                },
                "memory_usage": {"type": "array", "items": {"type": "object"}},
            },
        },
        "StatisticsResponse": {
            "type": "object",
            "required": ["model_stats"],
            "properties": {
                "model_stats": {"type": "array", "items": _ref("schemas", "ModelStatistics")}
            },
        },
        "InferParameters": {
            "type": "object",
            "description": "Request parameters: the reserved ones below, and custom ones "
            "(a string, number or boolean each). Keys starting 'triton_' are refused.",
            "properties": {
                "sequence_id": {"oneOf": [_uint(), {"type": "string"}]},
                "sequence_start": {"type": "boolean"},
                "sequence_end": {"type": "boolean"},
                "priority": _uint("0 is the model's default level; 1 the highest."),
                "timeout": _uint("Queue timeout in microseconds."),
                "binary_data_output": {
                    "type": "boolean",
                    "description": "Outputs not listed in 'outputs' come as binary data.",
                },
                "headers": {"type": "object"},
            },
            "additionalProperties": {"anyOf": scalar},
        },
        "InferInput": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "description": "Exactly one of 'data' and 'parameters.binary_data_size'.",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "shape": {"type": "array", "items": _uint()},
                "datatype": _ref("schemas", "Datatype"),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "binary_data_size": _uint(
                            f"Bytes of this tensor after the JSON (see {HEADER_LENGTH})."
                        )
                    },
                },
                "data": {
                    "type": "array",
                    "description": "The elements in row-major order, flat or nested; "
                    "BYTES elements as strings.",
                    "items": {"anyOf": [*scalar, {"type": "array"}]},
                },
            },
        },
        "InferRequestedOutput": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "parameters": {
                    "type": "object",
                    "properties": {
                        "binary_data": {"type": "boolean"},
                        "classification": _uint("Return the top N classes instead."),
                    },
                },
            },
        },
        "InferRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": _ref("schemas", "InferParameters"),
                "inputs": {
                    "type": "array",
                    "minItems": 1,
                    "items": _ref("schemas", "InferInput"),
                },
                "outputs": {"type": "array", "items": _ref("schemas", "InferRequestedOutput")},
            },
            "example": {
                "id": "42",
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
                ],
                "outputs": [{"name": "OUTPUT0"}],
            },
        },
        "InferOutput": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "description": "'data', or (a binary output) 'parameters.binary_data_size'.",
            "properties": {
                "name": {"type": "string"},
                "datatype": _ref("schemas", "Datatype"),
                "shape": {"type": "array", "items": _uint()},
                "parameters": {
                    "type": "object",
                    "required": ["binary_data_size"],
                    "properties": {"binary_data_size": _uint()},
                },
                "data": {"type": "array"},
            },
        },
        "InferResponse": _object(
            {
                "id": _STR,
                "model_name": _STR,
                "model_version": _STR,
                "parameters": {"type": "object"},
                "outputs": {"type": "array", "items": _ref("schemas", "InferOutput")},
            },
            "model_name",
            "model_version",
            "outputs",
        ),
        "LogSettings": _object(
            _log_settings_properties(),
            *_LOG_SETTINGS,
            description="Triton's log settings (`--log-*` flags), as this process has them.",
        ),
        "LogSettingsRequest": _object(
            _log_settings_properties(),
            additionalProperties=False,
            description="The log settings to change in every process; `log_file` only "
            "as it is (each process's own is its `--log-file`).",
        ),
        "TraceSettings": _object(
            _trace_settings_properties(),
            *trace_config.API_KEYS[:-1],
            description="Triton's trace settings (`--trace-config`, then the trace "
            "extension's changes), for every model or for one.",
        ),
        "TraceSettingsRequest": _object(
            {k: {"anyOf": [v, {"type": "null"}]} for k, v in _trace_settings_properties().items()},
            additionalProperties=False,
            description="The trace settings to change in every process; `null` sends a "
            "model's setting back to the one for every model.",
        ),
        "RepositoryIndexRequest": {
            "type": "object",
            "properties": {
                "ready": {"type": "boolean", "description": "Only the versions ready now."}
            },
        },
        "RepositoryIndexEntry": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "state": {
                    "type": "string",
                    "enum": [
                        worker_reports.READY,
                        worker_reports.UNAVAILABLE,
                        worker_reports.LOADING,
                        "UNLOADING",
                        "UNKNOWN",
                    ],
                },
                "reason": {"type": "string"},
            },
        },
        "LoadRequest": {
            "type": "object",
            "properties": {
                "parameters": {
                    "type": "object",
                    "properties": {
                        "config": {
                            "type": "string",
                            "description": "The model configuration as JSON, in place of "
                            "the repository's config.pbtxt.",
                        }
                    },
                    "patternProperties": {
                        "^file:": {
                            "type": "string",
                            "contentEncoding": "base64",
                            "description": "'file:<version>/<path>': a file of a model "
                            "directory given in the request (needs 'config').",
                        }
                    },
                }
            },
        },
        "UnloadRequest": {
            "type": "object",
            "properties": {
                "parameters": {
                    "type": "object",
                    "properties": {"unload_dependents": {"type": "boolean"}},
                }
            },
        },
        "TrafficSplit": {
            "type": "object",
            "additionalProperties": False,
            "description": "conch's traffic split across a model's versions: requests that "
            "name no version go to a version drawn by weight among these that are ready "
            "(none: the latest); a shadow's share of them also sends a copy to its version, "
            "whose answer is recorded (Redis stream `conch.shadow.<model>`), not returned. "
            "No weights and no shadow: no split.",
            "properties": {
                "weights": {
                    "type": ["object", "null"],
                    "propertyNames": {"pattern": f"^{traffic_split.VERSION_PATTERN}$"},
                    "additionalProperties": {"type": "number", "minimum": 0},
                    "description": "Version -> weight (at least one above 0, each version "
                    "ready now).",
                },
                "shadow": {
                    "type": ["object", "null"],
                    "additionalProperties": False,
                    "required": ["version", "share"],
                    "properties": {
                        "version": {"type": "integer", "minimum": 1},
                        "share": {"type": "number", "minimum": 0, "maximum": 1},
                    },
                },
            },
            "example": {"weights": {"1": 90, "2": 10}, "shadow": {"version": 3, "share": 0.1}},
        },
        "BatchJobRequest": {
            "type": "object",
            "required": ["input", "output"],
            "additionalProperties": False,
            "properties": {
                "input": {
                    "type": "string",
                    "description": "s3://bucket/key of a JSONL file, one infer request a line.",
                },
                "output": {
                    "type": "string",
                    "description": "s3://bucket/key where the JSONL responses go.",
                },
            },
            "example": {"input": "s3://bucket/in.jsonl", "output": "s3://bucket/out.jsonl"},
        },
        "Job": {
            "type": "object",
            "required": ["id", "kind", "model_name", "model_version", "status", "submitted"],
            "properties": {
                "id": {"type": "string", "pattern": f"^{job_store.JOB_ID.pattern}$"},
                "kind": {"type": "string", "enum": [job_store.INFER, job_store.BATCH]},
                "model_name": {"type": "string"},
                "model_version": {
                    "type": "string",
                    "description": "The version asked for; empty for the latest.",
                },
                "status": {
                    "type": "string",
                    "enum": [
                        job_store.PENDING,
                        job_store.STARTED,
                        job_store.SUCCESS,
                        job_store.FAILURE,
                        job_store.REVOKED,
                    ],
                },
                "submitted": {"type": "string", "format": "date-time"},
                "finished": {"type": "string", "format": "date-time"},
                "error": {"type": "string"},
                "input": {"type": "string", "description": "A batch job's input object."},
                "output": {"type": "string", "description": "A batch job's output object."},
                "progress": {
                    "type": "object",
                    "description": "A batch job's lines sent, and those that failed.",
                    "required": list(job_store.PROGRESS),
                    "properties": {k: _uint() for k in job_store.PROGRESS},
                },
            },
        },
    }


_INFER_HEADERS = {
    HEADER_LENGTH: {"description": "Bytes of JSON before the binary outputs.", "schema": _uint()}
}


def _responses() -> dict[str, Schema]:
    return {
        "Error": {"description": "An error.", "content": _json(_ref("schemas", "Error"))},
        "Infer": {
            "description": "The outputs. With any binary output the body is the JSON "
            f"document then the tensors' bytes, and {HEADER_LENGTH} gives the JSON's length.",
            "headers": _INFER_HEADERS,
            "content": {
                "application/json": {"schema": _ref("schemas", "InferResponse")},
                "application/octet-stream": {"schema": _BINARY_BODY},
            },
        },
        "Job": {
            "description": "The job and where it stands.",
            "content": _json(_ref("schemas", "Job")),
        },
        "JobAccepted": {
            "description": "The job is queued; its status is at Location.",
            "headers": {"Location": {"schema": {"type": "string"}}},
            "content": _json(_ref("schemas", "Job")),
        },
    }


def _parameters() -> dict[str, Schema]:
    return {
        "model": {
            "name": "model",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": "^[^/]+$"},
        },
        "version": {
            "name": "version",
            "in": "path",
            "required": True,
            "schema": {"type": "integer", "minimum": 0, "format": "int64"},
        },
        "job_id": {
            "name": "job_id",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": f"^{job_store.JOB_ID.pattern}$"},
        },
        "stream_id": {
            "name": "stream_id",
            "in": "path",
            "required": True,
            "description": "A kept stream's id: the last part of its Content-Location.",
            "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        },
        "last_event_id": {
            "name": "Last-Event-ID",
            "in": "header",
            "description": "The id of the last event received (<run>-<seq>): the stream "
            "resumes after it. Without it, the stream is read from its start.",
            "schema": {"type": "string", "pattern": "^[0-9]{1,10}-[0-9]{1,19}$"},
        },
        "header_length": {
            "name": HEADER_LENGTH,
            "in": "header",
            "description": "Binary tensor extension: bytes of JSON at the start of the body; "
            "the rest is the binary inputs, in the order the JSON lists them.",
            "schema": _uint(),
        },
        "content_encoding": {
            "name": "Content-Encoding",
            "in": "header",
            "schema": {"type": "string", "enum": ["gzip", "deflate", "identity"]},
        },
        "accept_encoding": {
            "name": "Accept-Encoding",
            "in": "header",
            "description": "gzip or deflate: the response comes compressed.",
            "schema": {"type": "string"},
        },
        "wait": {
            "name": "wait",
            "in": "query",
            "description": "Hold the call up to this many seconds for the job to finish "
            "(long polling).",
            "schema": {"type": "number", "minimum": 0, "maximum": MAX_JOB_WAIT_S},
        },
        "path": {
            "name": "path",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "minLength": 1},
        },
    }


_LOG_SETTINGS = tuple(f.name for f in dataclasses.fields(server_log.LogSettings))


def _log_settings_properties() -> Schema:
    return {
        "log_file": _STR,
        "log_info": {"type": "boolean"},
        "log_warning": {"type": "boolean"},
        "log_error": {"type": "boolean"},
        "log_verbose_level": {**_uint(), "maximum": 2**32 - 1},
        "log_format": {"enum": [str(f) for f in LogFormat]},
    }


def _trace_settings_properties() -> Schema:
    number = {"type": "string", "pattern": "^-?[0-9]+$"}
    return {
        "trace_level": {"type": "array", "items": {"enum": list(trace_config.LEVELS)}},
        "trace_rate": number,
        "trace_count": number,
        "log_frequency": {"enum": ["0"]},
        "trace_mode": {"enum": ["opentelemetry"]},
        "trace_file": _STR,
    }


def _trace_paths() -> dict[str, Schema]:
    """``v2/trace/setting`` and its per-model twin."""
    out: dict[str, Schema] = {}
    for path, scope, suffix, params in (
        ("/v2/trace/setting", "every model", "", ()),
        ("/v2/models/{model}/trace/setting", "one model", "Model", ("model",)),
    ):
        errors = (_NOT_FOUND,) if params else ()
        out[path] = {
            "get": _op(
                f"traceSettings{suffix}",
                "trace",
                f"The trace settings for {scope}",
                _ok("TraceSettings", "The trace settings."),
                errors=errors,
            ),
            "post": _op(
                f"updateTraceSettings{suffix}",
                "trace",
                f"Change the trace settings for {scope}, in every process",
                _ok("TraceSettings", "The trace settings that follow."),
                errors=errors,
                body=_json_body("TraceSettingsRequest", True),
            ),
            **({"parameters": [_ref("parameters", p) for p in params]} if params else {}),
        }
    return out


def _op(
    op_id: str,
    tag: str,
    summary: str,
    ok: dict[str, Schema],
    *,
    errors: tuple[dict[str, str], ...] = (),
    body: Schema | None = None,
    params: tuple[str, ...] = (),
    down: bool = False,
) -> Schema:
    """One operation: its answers, and every generic error answer beside them. ``down``:
    a health check, whose 400 (not live, not ready) has an empty body, as Triton's."""
    responses = dict(ok)
    if down:
        responses["400"] = {"description": "Not live (not ready): the body is empty."}
    for group in (GENERIC_ERRORS, *errors):
        for status, text in group.items():
            responses.setdefault(status, {**_ref("responses", "Error"), "description": text})
    out: Schema = {
        "operationId": op_id,
        "tags": [tag],
        "summary": summary,
        "responses": dict(sorted(responses.items())),
    }
    if params:
        out["parameters"] = [_ref("parameters", p) for p in params]
    if body is not None:
        out["requestBody"] = body
    return out


def _path(method: str, op: Schema, path_params: tuple[str, ...] = ()) -> Schema:
    item: Schema = {method: op}
    if path_params:
        item["parameters"] = [_ref("parameters", p) for p in path_params]
    return item


def _per_version(suffix: str, method: str, op: Schema) -> dict[str, Schema]:
    """A model route and its ``/versions/{version}`` twin, which names one version."""
    versioned = copy.deepcopy(op)
    versioned["operationId"] = op["operationId"] + "Version"
    versioned["summary"] = op["summary"] + " (one version)"
    return {
        f"/v2/models/{{model}}{suffix}": _path(method, op, ("model",)),
        f"/v2/models/{{model}}/versions/{{version}}{suffix}": _path(
            method, versioned, ("model", "version")
        ),
    }


def _json_body(schema: str, required: bool) -> Schema:
    return {"required": required, "content": _json(_ref("schemas", schema))}


def _ok(schema: str, text: str) -> dict[str, Schema]:
    return {"200": {"description": text, "content": _json(_ref("schemas", schema))}}


_INFER_BODY = {
    "required": True,
    "description": "An infer request: its JSON, or (binary tensor extension) its JSON "
    f"followed by the input tensors' bytes, with {HEADER_LENGTH} set.",
    "content": {
        "application/json": {"schema": _ref("schemas", "InferRequest")},
        "application/octet-stream": {"schema": _BINARY_BODY},
    },
}
_INFER_PARAMS = ("header_length", "content_encoding", "accept_encoding")


def _server_paths() -> dict[str, Schema]:
    """The routes that name no model: health, metadata, the repository, jobs, docs."""
    return {
        "/v2/health/live": _path(
            "get",
            _op("serverLive", "health", "Is the server live?", {"200": _EMPTY}, down=True),
        ),
        "/v2/health/ready": _path(
            "get",
            _op("serverReady", "health", "Is it ready for requests?", {"200": _EMPTY}, down=True),
        ),
        "/v2": _path(
            "get",
            _op(
                "serverMetadata",
                "metadata",
                "Server name, version and extensions",
                _ok("ServerMetadata", "The server's metadata."),
            ),
        ),
        "/v2/models/stats": _path(
            "get",
            _op(
                "allModelStatistics",
                "statistics",
                "Statistics of every loaded model",
                _ok("StatisticsResponse", "One entry per model version."),
            ),
        ),
        "/v2/repository/index": _path(
            "post",
            _op(
                "repositoryIndex",
                "model-repository",
                "Every model in the repository, with its state",
                {
                    "200": {
                        "description": "One entry per model version (per model when none).",
                        "content": _json(
                            {"type": "array", "items": _ref("schemas", "RepositoryIndexEntry")}
                        ),
                    }
                },
                body=_json_body("RepositoryIndexRequest", False),
            ),
        ),
        "/v2/repository/models/{model}/load": _path(
            "post",
            _op(
                "repositoryModelLoad",
                "model-repository",
                "Load or reload a model (--model-control-mode explicit)",
                {"200": _EMPTY},
                body=_json_body("LoadRequest", False),
            ),
            ("model",),
        ),
        "/v2/repository/models/{model}/unload": _path(
            "post",
            _op(
                "repositoryModelUnload",
                "model-repository",
                "Unload a model (--model-control-mode explicit)",
                {"200": _EMPTY},
                body=_json_body("UnloadRequest", False),
            ),
            ("model",),
        ),
        "/v2/repository/models/{model}/traffic": {
            "parameters": [_ref("parameters", "model")],
            "get": _op(
                "repositoryModelTraffic",
                "model-repository",
                "The model's traffic split across its versions (conch's own)",
                _ok("TrafficSplit", "The split (no weights: none)."),
            ),
            "post": _op(
                "repositoryModelTrafficSet",
                "model-repository",
                "Set the model's traffic split, for every gateway",
                _ok("TrafficSplit", "The split that follows."),
                body=_json_body("TrafficSplit", True),
            ),
            "delete": _op(
                "repositoryModelTrafficClear",
                "model-repository",
                "Clear the model's traffic split: requests go to the latest version",
                _ok("TrafficSplit", "No split."),
            ),
        },
        "/v2/logging": {
            "get": _op(
                "logSettings",
                "logging",
                "The log settings",
                _ok("LogSettings", "This process's log settings."),
            ),
            "post": _op(
                "updateLogSettings",
                "logging",
                "Change the log settings of every process",
                _ok("LogSettings", "The log settings that follow."),
                body=_json_body("LogSettingsRequest", True),
            ),
        },
        "/v2/jobs/{job_id}": {
            "parameters": [_ref("parameters", "job_id")],
            **{
                method: _op(
                    op_id, "jobs", summary, {"200": _ref("responses", "Job")}, errors=(_NOT_FOUND,)
                )
                for method, op_id, summary in (
                    ("get", "jobStatus", "Where a job stands"),
                    ("delete", "jobCancel", "Cancel a job that has not finished"),
                )
            },
        },
        "/v2/jobs/{job_id}/result": _path(
            "get",
            _op(
                "jobResult",
                "jobs",
                "A job's result: the infer response, once it is done",
                {
                    "200": {
                        "description": "An infer job's response, as infer answers it; "
                        "a batch job's status (its result is its output object).",
                        "headers": _INFER_HEADERS,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "oneOf": [
                                        _ref("schemas", "InferResponse"),
                                        _ref("schemas", "Job"),
                                    ]
                                }
                            },
                            "application/octet-stream": {"schema": _BINARY_BODY},
                        },
                    },
                    "202": {
                        "description": "Not finished yet; ask again after Retry-After seconds.",
                        "headers": {"Retry-After": {"schema": _uint()}},
                        "content": _json(_ref("schemas", "Job")),
                    },
                },
                errors=(_NOT_FOUND, _MODEL_FAILED, _UNSUPPORTED),
                params=("wait", "accept_encoding"),
            ),
            ("job_id",),
        ),
        "/v2/streams/{stream_id}": _path(
            "get",
            _op(
                "streamResume",
                "inference",
                "conch's own: a decoupled model's generate_stream read again, after the "
                "Last-Event-ID, by a client whose connection dropped",
                {
                    "200": {
                        "description": "The events after Last-Event-ID, then the rest as "
                        "they come, as generate_stream sends them.",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    }
                },
                errors=(_NOT_FOUND,),
                params=("last_event_id",),
            ),
            ("stream_id",),
        ),
        DOCUMENT_PATH: _path(
            "get",
            _op(
                "openapiDocument",
                "docs",
                "This document",
                {"200": {"description": "The OpenAPI document.", "content": _json({})}},
            ),
        ),
        DOCS_PATH: _path(
            "get",
            _op(
                "docsPage",
                "docs",
                "A browsable page of this document",
                {
                    "200": {
                        "description": "The page (Swagger UI).",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            ),
        ),
        f"{DOCS_PATH}/{{path}}": _path(
            "get",
            _op(
                "docsFile",
                "docs",
                "A file of the docs page (script, style sheet, icon)",
                {
                    "200": {
                        "description": "The file.",
                        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
                    }
                },
                errors=({"404": "No such file."},),
            ),
            ("path",),
        ),
    }


def _model_paths() -> dict[str, Schema]:
    """The routes under /v2/models/{model}, each with its /versions/{version} twin."""
    found = (_NOT_FOUND,)
    accepted = {"202": _ref("responses", "JobAccepted")}
    job_errors = (_NOT_FOUND, _UNSUPPORTED)
    stats = _ok("StatisticsResponse", "One entry per version.")
    ops = [
        (
            "",
            "get",
            _op(
                "modelMetadata",
                "metadata",
                "A model's metadata",
                _ok("ModelMetadata", "The model's metadata."),
                errors=found,
            ),
        ),
        (
            "/config",
            "get",
            _op(
                "modelConfig",
                "model-config",
                "A model's configuration",
                _ok("ModelConfig", "The configuration."),
                errors=found,
            ),
        ),
        (
            "/stats",
            "get",
            _op("modelStatistics", "statistics", "A model's statistics", stats, errors=found),
        ),
        (
            "/ready",
            "get",
            _op(
                "modelReady",
                "health",
                "Is the model ready? (400: it is not)",
                {"200": _EMPTY},
                errors=found,
            ),
        ),
        (
            "/infer",
            "post",
            _op(
                "modelInfer",
                "inference",
                "Run an inference request",
                {"200": _ref("responses", "Infer")},
                errors=(_NOT_FOUND, _MODEL_FAILED, _UNSUPPORTED),
                body=_INFER_BODY,
                params=_INFER_PARAMS,
            ),
        ),
        (
            "/generate",
            "post",
            _op(
                "modelGenerate",
                "inference",
                "Triton's generate extension: one JSON answer (a model that sends other "
                "than one response is refused)",
                _ok("GenerateResponse", "The model's one response."),
                errors=(_NOT_FOUND, _MODEL_FAILED, _UNSUPPORTED),
                body=_json_body("GenerateRequest", False),
            ),
        ),
        (
            "/generate_stream",
            "post",
            _op(
                "modelGenerateStream",
                "inference",
                "Triton's generate extension, streamed: one Server-Sent Event per response",
                {
                    "200": {
                        "description": "One `data: {...}` event per response as it comes "
                        '(a GenerateResponse, or `{"error": "..."}` for an error after the '
                        "first); the status is the first response's. A decoupled model's "
                        "stream is kept: Content-Location names where to read it again, "
                        "each event has an id, and `event: restart` comes before the "
                        "responses of a run that replaced one lost with its worker.",
                        "headers": {"Content-Location": {"schema": {"type": "string"}}},
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    }
                },
                errors=(_NOT_FOUND, _MODEL_FAILED, _UNSUPPORTED),
                body=_json_body("GenerateRequest", False),
            ),
        ),
        (
            "/jobs",
            "post",
            _op(
                "modelJobSubmit",
                "jobs",
                "Queue an infer request as an async job (below online requests)",
                accepted,
                errors=job_errors,
                body=_INFER_BODY,
                params=_INFER_PARAMS[:2],
            ),
        ),
        (
            "/batch",
            "post",
            _op(
                "modelBatchSubmit",
                "jobs",
                "Start an offline batch job: JSONL of requests in S3 in, responses out",
                accepted,
                errors=job_errors,
                body={
                    "required": True,
                    "description": f"At most {MAX_BATCH_SPEC_BYTES} bytes.",
                    "content": _json(_ref("schemas", "BatchJobRequest")),
                },
            ),
        ),
    ]
    paths: dict[str, Schema] = {}
    for suffix, method, op in ops:
        paths.update(_per_version(suffix, method, op))
    return paths


_SHM_DISABLED = {
    "403": "Shared memory is off (`--allow-client-shm`), or the API is restricted "
    "(`--http-restricted-api shared-memory:...`) and the request lacks its header."
}
_SHM_REGION = {
    "name": "region",
    "in": "path",
    "required": True,
    "description": "The region's name.",
    "schema": {"type": "string", "pattern": "^[^/]+$"},
}


def _shared_memory_paths() -> dict[str, Schema]:
    """Triton's shared-memory extension: system regions' status, register and
    unregister, and the CUDA twins (refused: conch has no CUDA shared memory)."""
    system_region = _object(
        {"name": _STR, "key": _STR, "offset": _uint(), "byte_size": _uint()},
        "name",
        "key",
        "offset",
        "byte_size",
    )
    cuda_region = _object(
        {"name": _STR, "device_id": _uint(), "byte_size": _uint()}, "name", "byte_size"
    )
    register = {
        "required": True,
        "content": _json(
            _object(
                {
                    "key": {**_STR, "description": "A POSIX shared-memory name: /dev/shm<key>."},
                    "offset": _uint("Where the region starts in the object, in bytes."),
                    "byte_size": _uint("The region's size in bytes."),
                },
                "key",
                "offset",
                "byte_size",
            )
        ),
    }
    cuda_register = {
        "required": True,
        "content": _json(
            _object(
                {
                    "raw_handle": _object({"b64": _STR}),
                    "device_id": _uint(),
                    "byte_size": _uint(),
                }
            )
        ),
    }
    out: dict[str, Schema] = {}
    for kind, name, region, register_body in (
        ("system", "system", system_region, register),
        ("cuda", "CUDA", cuda_region, cuda_register),
    ):
        base = f"/v2/{kind}sharedmemory"
        listed = {
            "200": {
                "description": "The regions registered (one when a region is named).",
                "content": _json({"type": "array", "items": region}),
            }
        }
        not_found = {"404": "No region of that name is registered."}
        tag = "shared-memory"
        out[f"{base}/status"] = _path(
            "get",
            _op(
                f"{kind}SharedMemoryStatus",
                tag,
                f"Every {name} shared-memory region",
                listed,
                errors=(_SHM_DISABLED,),
            ),
        )
        out[f"{base}/region/{{region}}/status"] = {
            "parameters": [_SHM_REGION],
            "get": _op(
                f"{kind}SharedMemoryRegionStatus",
                tag,
                f"One {name} shared-memory region",
                listed,
                errors=(_SHM_DISABLED, not_found),
            ),
        }
        out[f"{base}/region/{{region}}/register"] = {
            "parameters": [_SHM_REGION],
            "post": _op(
                f"{kind}SharedMemoryRegister",
                tag,
                f"Register a {name} shared-memory region"
                + (" (refused: conch has no CUDA shared memory)" if kind == "cuda" else ""),
                {"200": _EMPTY},
                errors=(_SHM_DISABLED,),
                body=register_body,
            ),
        }
        out[f"{base}/unregister"] = _path(
            "post",
            _op(
                f"{kind}SharedMemoryUnregisterAll",
                tag,
                f"Unregister every {name} region",
                {"200": _EMPTY},
                errors=(_SHM_DISABLED,),
            ),
        )
        out[f"{base}/region/{{region}}/unregister"] = {
            "parameters": [_SHM_REGION],
            "post": _op(
                f"{kind}SharedMemoryUnregister",
                tag,
                f"Unregister a {name} region",
                {"200": _EMPTY},
                errors=(_SHM_DISABLED,),
            ),
        }
    return out


@cache
def document() -> dict[str, Any]:
    """The whole document (built once; callers must not change it)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "conch HTTP API",
            "version": __version__,
            "description": "NVIDIA Triton's HTTP/REST protocol (KServe v2 and Triton's "
            "extensions), plus conch's async and offline batch jobs. Every error answer is "
            '`{"error": "..."}` with Triton\'s status code. JSON bodies nest at most '
            f"{v2_json.MAX_JSON_DEPTH} levels. Prometheus metrics (GET /metrics) and the work "
            "owed to each model's workers (GET /queue-depth, JSON) are served on the metrics "
            "port (`--metrics-port`), not here.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [
            {"name": "health"},
            {"name": "metadata"},
            {"name": "inference"},
            {"name": "model-config"},
            {"name": "statistics"},
            {"name": "model-repository"},
            {"name": "logging"},
            {
                "name": "shared-memory",
                "description": "Triton's shared-memory extension (`--allow-client-shm`).",
            },
            {"name": "trace", "description": "Triton's trace extension (OpenTelemetry)."},
            {"name": "jobs", "description": "conch's async and offline batch jobs."},
            {"name": "openai", "description": "OpenAI's API, where conch has the model for it."},
            {"name": "docs"},
        ],
        "paths": {
            **_server_paths(),
            **_model_paths(),
            **_trace_paths(),
            **_shared_memory_paths(),
            **openai_routes.openapi_paths(GENERIC_ERRORS, _ref("schemas", "Error")),
        },
        "components": {
            "schemas": _schemas(),
            "responses": _responses(),
            "parameters": _parameters(),
        },
    }


__all__ = ["DOCS_PATH", "DOCUMENT_PATH", "GENERIC_ERRORS", "MAX_BATCH_SPEC_BYTES", "document"]
