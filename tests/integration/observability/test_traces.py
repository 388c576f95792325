"""Traces on the real path: a gateway and a worker (separate processes) send their spans
over OTLP/HTTP to a collector this test runs on loopback, which decodes each export
with the OTLP protobuf messages.

- A client's ``traceparent`` (an HTTP header, gRPC metadata) is continued: the gateway's ``infer`` span is its child,
  the worker's ``queue`` and ``compute`` spans are the infer span's children, and the
  compute span links to it: one trace across the queue.
- An async job's spans are the children of its submission's ``job`` span (an ensemble's:
  of the worker's ``ensemble_job`` span that runs its graph); a batch job is
  one trace, its ``batch_job`` span the parent of every line's spans.
- The log lines about a traced request name its trace, in the gateway and the worker.
- An ensemble's steps are the children of its request's span; a BLS call made by a
  Python model is the child of the batch that made it.
- A batch is one ``compute`` span linked to every request it served.
- A client's unsampled ``traceparent`` (flags 00) is followed: nothing is exported.
- The trace extension: ``v2/trace/setting`` shows the flags' settings; a change POSTed to
  one gateway process holds in the other (requests it samples stop being traced), a
  ``null`` restores the flag's; per model too; wrong values and unknown models are 400s.
"""

from __future__ import annotations

import gzip
import json
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from harness import (
    fresh_db,
    start_gateway,
    start_grpc,
    start_worker,
    wait_model_ready,
    wait_until,
)
from models import add_inputs, add_model, python_model


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent: str
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    start_ns: int
    end_ns: int
    attributes: tuple[tuple[str, str], ...]


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}/v1/traces"

    def about(self, request_id: str) -> list[Span]:
        """The spans of the request the client called ``request_id``."""
        with self.lock:
            return [s for s in self.spans if ("request.id", request_id) in s.attributes]

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


class _Receive(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource in export.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                spans += [
                    Span(
                        attrs.get("service.name", ""),
                        s.name,
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                        s.start_time_unix_nano,
                        s.end_time_unix_nano,
                        tuple((a.key, a.value.string_value) for a in s.attributes),
                    )
                    for s in scope.spans
                ]
        with self.server.lock:
            self.server.spans += spans
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


TENSOR = "data_type: TYPE_FP32 dims: [ 4 ]"
# add, twice: OUT = (A + B) + (A + B), two steps on add's queue.
ADD_TWICE = f"""
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "A" {TENSOR} }}, {{ name: "B" {TENSOR} }} ]
output [ {{ name: "OUT" {TENSOR} }} ]
ensemble_scheduling {{ step [
  {{ model_name: "add" model_version: -1 input_map {{ key: "A" value: "A" }}
     input_map {{ key: "B" value: "B" }} output_map {{ key: "OUT" value: "SUM" }} }},
  {{ model_name: "add" model_version: -1 input_map {{ key: "A" value: "SUM" }}
     input_map {{ key: "B" value: "SUM" }} output_map {{ key: "OUT" value: "OUT" }} }}
] }}
"""
BLS_ADD_CONFIG = f"""
backend: "python"
max_batch_size: 8
input [ {{ name: "A" {TENSOR} }}, {{ name: "B" {TENSOR} }} ]
output [ {{ name: "OUT" {TENSOR} }} ]
"""
# add, called through BLS from a Python model.
BLS_ADD = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("A", "B")]
            answer = pb_utils.InferenceRequest(
                model_name="add", requested_output_names=["OUT"], inputs=inputs
            ).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""


@dataclass
class Stack:
    url: str
    grpc_url: str
    collector: Collector
    logs: dict[str, Path]

    def lines(self, process: str) -> list[dict[str, object]]:
        """``process``'s JSON log lines (``--log-format json``)."""
        return [json.loads(line) for line in self.logs[process].read_text().splitlines()]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path, s3_endpoint: str
) -> Iterator[Stack]:
    repo = tmp_path_factory.mktemp("traces") / "models"
    # A 300 ms queue delay: requests sent together run as one batch.
    add_model(repo / "add", delay_us=300_000)
    (repo / "add_twice" / "1").mkdir(parents=True)
    (repo / "add_twice" / "config.pbtxt").write_text(ADD_TWICE)
    python_model(repo / "bls_add", BLS_ADD_CONFIG, BLS_ADD)
    collector = Collector()
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    flags = [
        *("--trace-config", "mode=opentelemetry"),
        *("--trace-config", f"opentelemetry,url={collector.url}"),
        *("--trace-config", "rate=1"),
        *("--trace-config", "level=TIMESTAMPS"),
    ]
    db = fresh_db(redis_url, 11)
    logs = {name: repo.parent / f"{name}.log" for name in ("worker", "gateway")}

    def logging(name: str) -> list[str]:
        return ["--log-format", "json", "--log-file", str(logs[name]), "--log-verbose", "1"]

    s3 = {"AWS_ENDPOINT_URL": s3_endpoint}  # batch jobs' objects
    worker = start_worker(repo, db, log_dir, *flags, *logging("worker"), env=s3)
    # Two gateway processes: a trace setting changed through one holds in the other.
    gateway, url = start_gateway(repo, db, log_dir, *flags, *logging("gateway"), workers=2)
    grpc, grpc_url = start_grpc(repo, db, log_dir, *flags)
    try:
        for model in ("add", "add_twice", "bls_add"):
            wait_model_ready(url, model, 90, worker, gateway)
        yield Stack(url, grpc_url, collector, logs)
    finally:
        for service in (grpc, gateway, worker):
            service.stop()
        collector.shutdown()


def _infer(url: str, traceparent: str = "", request_id: str = "", model: str = "add") -> None:
    client = httpclient.InferenceServerClient(url)
    headers = {"traceparent": traceparent} if traceparent else {}
    try:
        out = client.infer(
            model, add_inputs(np.ones((1, 4), np.float32)), headers=headers, request_id=request_id
        ).as_numpy("OUT")
        assert out.tolist() == [[4.0 if model == "add_twice" else 2.0] * 4]
    finally:
        client.close()


def _new_parent(sampled: bool = True) -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


def _spans(stack: Stack, trace_id: str, names: set[str]) -> dict[str, list[Span]]:
    """The trace's spans by name, once each of ``names`` has arrived."""

    def complete() -> bool:
        return names <= {s.name for s in stack.collector.trace(trace_id)}

    wait_until(complete, 20, f"spans {sorted(names)} of trace {trace_id}")
    out: dict[str, list[Span]] = {}
    for span in stack.collector.trace(trace_id):
        out.setdefault(span.name, []).append(span)
    return out


def test_client_traceparent_is_one_trace_across_the_queue(stack: Stack) -> None:
    traceparent, trace_id, client_span = _new_parent()
    _infer(stack.url, traceparent)
    spans = _spans(stack, trace_id, {"infer", "queue", "compute"})
    [infer], [queued], [compute] = spans["infer"], spans["queue"], spans["compute"]
    assert (infer.service, infer.parent) == ("conch-gateway", client_span)
    assert (queued.service, queued.parent) == ("conch-worker", infer.span_id)
    assert (compute.service, compute.parent) == ("conch-worker", infer.span_id)
    assert compute.links == ((trace_id, infer.span_id),)
    # Queued first, then computed, all within the gateway's span (which waits for the reply).
    assert infer.start_ns <= queued.start_ns <= queued.end_ns <= compute.start_ns
    assert compute.end_ns <= infer.end_ns


def _wait_computes(stack: Stack, trace_id: str, count: int) -> None:
    def arrived() -> bool:
        return len([s for s in stack.collector.trace(trace_id) if s.name == "compute"]) == count

    wait_until(arrived, 20, f"{count} compute spans in trace {trace_id}")


def _model(span: Span) -> str:
    return dict(span.attributes).get("model", "")


def test_an_ensembles_steps_nest_under_its_request(stack: Stack) -> None:
    traceparent, trace_id, _ = _new_parent()
    _infer(stack.url, traceparent, model="add_twice")
    _wait_computes(stack, trace_id, 2)
    spans = _spans(stack, trace_id, {"infer", "queue", "compute"})
    [infer] = spans["infer"]
    assert _model(infer) == "add_twice"
    steps = spans["queue"] + spans["compute"]
    assert len(steps) == 4  # each step queued, then computed
    assert {(s.parent, _model(s)) for s in steps} == {(infer.span_id, "add")}


def test_a_bls_call_nests_under_its_callers_batch(stack: Stack) -> None:
    traceparent, trace_id, _ = _new_parent()
    _infer(stack.url, traceparent, model="bls_add")

    def by_model(name: str) -> dict[str, Span]:
        return {_model(s): s for s in stack.collector.trace(trace_id) if s.name == name}

    wait_until(lambda: len(by_model("compute")) == 2, 20, "the caller's and add's compute spans")
    [infer] = _spans(stack, trace_id, {"infer"})["infer"]
    queued, computed = by_model("queue"), by_model("compute")
    assert queued["bls_add"].parent == computed["bls_add"].parent == infer.span_id
    # The call made while bls_add's batch ran is that batch's child: queued, then computed.
    caller = computed["bls_add"]
    assert queued["add"].parent == computed["add"].parent == caller.span_id
    assert caller.start_ns <= queued["add"].start_ns <= computed["add"].end_ns <= caller.end_ns


ONES = {"datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}
LINE = {"inputs": [{"name": "A", **ONES}, {"name": "B", **ONES}]}


def _submit_job(stack: Stack, model: str) -> tuple[str, str]:
    """An async job on ``model`` with a new sampled traceparent: its trace and span ids."""
    traceparent, trace_id, client_span = _new_parent()
    answer = requests.post(
        f"http://{stack.url}/v2/models/{model}/jobs",
        json=LINE,
        headers={"traceparent": traceparent},
        timeout=10,
    )
    assert answer.status_code == 202, answer.text
    return trace_id, client_span


def test_an_async_jobs_spans_nest_under_its_submission(stack: Stack) -> None:
    trace_id, client_span = _submit_job(stack, "add")
    spans = _spans(stack, trace_id, {"job", "queue", "compute"})
    [job], [queued], [compute] = spans["job"], spans["queue"], spans["compute"]
    assert (job.service, job.parent) == ("conch-gateway", client_span)
    assert queued.parent == compute.parent == job.span_id


def test_an_async_ensemble_jobs_steps_nest_under_its_driver(stack: Stack) -> None:
    trace_id, _ = _submit_job(stack, "add_twice")
    _wait_computes(stack, trace_id, 2)
    spans = _spans(stack, trace_id, {"job", "ensemble_job", "queue", "compute"})
    [job], [driver] = spans["job"], spans["ensemble_job"]
    assert (driver.service, driver.parent) == ("conch-worker", job.span_id)
    steps = spans["queue"] + spans["compute"]
    assert len(steps) == 4 and {(s.parent, _model(s)) for s in steps} == {(driver.span_id, "add")}


@pytest.mark.parametrize(("model", "steps"), [("add", 1), ("add_twice", 2)])
def test_a_batch_jobs_lines_are_one_trace(stack: Stack, s3: object, model: str, steps: int) -> None:
    """A model's lines, or an ensemble's (whose graphs run in the driver's threads)."""
    bucket = f"traces-{secrets.token_hex(6)}"
    s3.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    body = "".join(json.dumps({**LINE, "id": f"line-{k}"}) + "\n" for k in range(3))
    s3.put_object(Bucket=bucket, Key="in.jsonl", Body=body.encode())  # type: ignore[attr-defined]
    spec = {"input": f"s3://{bucket}/in.jsonl", "output": f"s3://{bucket}/out.jsonl"}
    answer = requests.post(f"http://{stack.url}/v2/models/{model}/batch", json=spec, timeout=10)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]

    def job_span() -> list[Span]:
        with stack.collector.lock:
            return [s for s in stack.collector.spans if ("job.id", job_id) in s.attributes]

    wait_until(lambda: job_span(), 30, f"batch job {job_id}'s span")
    [job] = job_span()
    assert (job.service, job.name, job.parent) == ("conch-worker", "batch_job", "")

    def queued() -> list[Span]:
        return [s for s in stack.collector.trace(job.trace_id) if s.name == "queue"]

    # The three lines go as one request of three rows (line_packing): one queue span per
    # step, under the job's span.
    wait_until(lambda: len(queued()) >= steps, 20, "a queue span for the lines' request")
    time.sleep(0.5)  # a span per line would have come by now
    assert len(queued()) == steps
    assert {s.parent for s in queued()} == {job.span_id}


def test_log_lines_about_a_traced_request_name_its_trace(stack: Stack) -> None:
    traceparent, trace_id, _ = _new_parent()
    _infer(stack.url, traceparent, request_id="logged-traced")
    _spans(stack, trace_id, {"infer", "queue", "compute"})
    for process in ("gateway", "worker"):
        about = [
            line
            for line in stack.lines(process)
            if line.get("request_id") == "logged-traced"
            or "logged-traced" in (line.get("request_id") or [])
        ]
        assert about, process
        for line in about:
            ids, traces = line["request_id"], line["trace_id"]
            assert (traces if isinstance(ids, str) else traces[ids.index("logged-traced")]) == (
                trace_id
            )


def test_a_grpc_clients_traceparent_is_continued(stack: Stack) -> None:
    traceparent, trace_id, client_span = _new_parent()
    client = grpcclient.InferenceServerClient(stack.grpc_url)
    try:
        inputs = []
        for name in ("A", "B"):
            tensor = grpcclient.InferInput(name, [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            inputs.append(tensor)
        client.infer("add", inputs, headers={"traceparent": traceparent})
    finally:
        client.close()
    spans = _spans(stack, trace_id, {"infer", "queue", "compute"})
    [infer] = spans["infer"]
    assert (infer.service, infer.parent) == ("conch-gateway", client_span)
    assert spans["queue"][0].parent == infer.span_id


def test_a_batch_is_one_compute_span_linked_to_each_request(stack: Stack) -> None:
    parents = [_new_parent() for _ in range(3)]
    with ThreadPoolExecutor(len(parents)) as pool:
        list(pool.map(lambda p: _infer(stack.url, p[0]), parents))
    infers = {}
    computes = []
    for _, trace_id, _ in parents:
        spans = _spans(stack, trace_id, {"infer", "queue"})
        infers[trace_id] = spans["infer"][0].span_id
        computes += spans.get("compute", [])
    # The batch's span sits in the first request's trace and links to all three.
    wait_until(
        lambda: any(
            s.name == "compute" and len(s.links) == 3
            for trace_id in infers
            for s in stack.collector.trace(trace_id)
        ),
        20,
        "one compute span linked to the three requests",
    )
    [batch] = [
        s
        for trace_id in infers
        for s in stack.collector.trace(trace_id)
        if s.name == "compute" and len(s.links) == 3
    ]
    assert set(batch.links) == set(infers.items())
    assert batch.parent in infers.values()


def test_an_unsampled_client_trace_is_not_exported(stack: Stack) -> None:
    traceparent, trace_id, _ = _new_parent(sampled=False)
    _infer(stack.url, traceparent)
    sampled, sampled_id, _ = _new_parent()
    _infer(stack.url, sampled)  # exported after the first: once it is here, so is all
    _spans(stack, sampled_id, {"infer", "queue", "compute"})
    time.sleep(1.0)  # a batch export of both processes' spans
    assert stack.collector.trace(trace_id) == []


def _settings(stack: Stack, model: str = "") -> dict[str, object]:
    path = f"v2/models/{model}/trace/setting" if model else "v2/trace/setting"
    return requests.get(f"http://{stack.url}/{path}", timeout=10).json()


def _post(stack: Stack, body: object, model: str = "") -> requests.Response:
    path = f"v2/models/{model}/trace/setting" if model else "v2/trace/setting"
    return requests.post(f"http://{stack.url}/{path}", json=body, timeout=10)


def _traced(stack: Stack, request_ids: list[str]) -> set[str]:
    """Which of these requests (sent without a traceparent) the gateways sampled, known
    once a sampled request sent after them has been exported."""
    for request_id in request_ids:
        _infer(stack.url, request_id=request_id)
    marker, marker_id, _ = _new_parent()
    _infer(stack.url, marker)
    _spans(stack, marker_id, {"infer", "queue", "compute"})
    time.sleep(1.0)  # both gateway processes' exports
    return {r for r in request_ids if stack.collector.about(r)}


FLAGS = {
    "trace_level": ["TIMESTAMPS"],
    "trace_rate": "1",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_mode": "opentelemetry",
}


def test_trace_settings_change_sampling_in_every_process(stack: Stack) -> None:
    assert _settings(stack) == FLAGS
    before = [f"before-{k}" for k in range(6)]
    assert _traced(stack, before) == set(before)  # rate=1: every request is traced
    try:
        answer = _post(stack, {"trace_level": ["OFF"]})
        assert answer.status_code == 200 and answer.json()["trace_level"] == ["OFF"]
        # Each fresh connection may reach either gateway process: both say OFF.
        wait_until(
            lambda: all(_settings(stack)["trace_level"] == ["OFF"] for _ in range(8)),
            10,
            "every gateway process to take trace_level OFF",
        )
        off = [f"off-{k}" for k in range(6)]
        assert _traced(stack, off) == set()
    finally:
        assert _post(stack, {"trace_level": None}).json() == FLAGS  # back to the flag's
    wait_until(
        lambda: all(_settings(stack) == FLAGS for _ in range(8)), 10, "the flags' settings again"
    )


def test_a_models_own_trace_settings(stack: Stack) -> None:
    try:
        answer = _post(stack, {"trace_rate": "2", "trace_count": "3"}, model="add")
        assert answer.json() == {**FLAGS, "trace_rate": "2", "trace_count": "3"}
        assert _settings(stack) == FLAGS  # the others keep the settings for every model
    finally:
        cleared = _post(stack, {"trace_rate": None, "trace_count": None}, model="add")
    assert cleared.json() == FLAGS
    missing = _post(stack, {"trace_rate": "2"}, model="no_such_model")
    assert missing.status_code == 400  # Triton's answer for a model it does not serve
    assert "unknown model: 'no_such_model'" in missing.json()["error"]
    for bad, says in (
        ({"trace_rate": "0"}, "at least 1"),
        ({"trace_level": ["TENSORS"]}, "OFF or TIMESTAMPS"),
        ({"trace_file": "/tmp/t.json"}, "OTLP"),
        ({"trace_mode": "triton"}, "cannot be changed"),
        ({"sample_everything": True}, "unknown trace setting"),
        ([1, 2], "JSON object"),
    ):
        answer = _post(stack, bad)
        assert answer.status_code == 400 and says in answer.json()["error"], (bad, answer.text)
    assert _settings(stack) == FLAGS
