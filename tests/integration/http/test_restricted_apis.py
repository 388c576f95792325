"""Triton's ``--http-restricted-api`` and conch's ``--allow-model-upload``, through real
gateways, stock tritonclient, plain HTTP and raw sockets.

Two gateways share one Redis and the one worker of ``conch serve``:

- ``locked`` (``start_gateway``, gevent worker): every group restricted, each with a
  header and value of its own; no uploads. Infer calls reach it through the keep-alive
  loop and through gunicorn's parser;
- ``admin`` (``conch serve``'s own gateway, gthread worker: infer calls through the WSGI
  fast path, the rest through Flask): Triton's admin example, ``inference`` and
  ``model-repository`` behind one header, everything else open; uploads allowed. The
  restriction is given to ``conch serve`` in ``$CONCH_HTTP_RESTRICTED_API`` and reaches its
  gateway the same way (``Settings.child_env``), the upload flag as an argument.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.core.restricted_apis import ApiGroup
from conch.devtools.redis_server import free_port
from conch.job_client import JobClient

from harness import (
    Service,
    conch,
    connect,
    fresh_db,
    read_response,
    start_gateway,
    wait_model_ready,
    wait_until,
)
from models import add_inputs, add_model, offset_model

G = ApiGroup
KEY = {g: f"key-{g.value}" for g in G}
SECRET = {g: f"s3cret-{g.value}" for g in G}
ADMIN_SECRET = "adm1n-s3cret"
MODEL_FLAGS = ("--model-control-mode", "explicit", "--load-model", "add")
ADD_BODY = json.dumps(
    {
        "inputs": [
            {"name": n, "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
            for n in ("A", "B")
        ]
    }
).encode()
ONNX_CONFIG = {
    "platform": "onnxruntime_onnx",
    "max_batch_size": 8,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}],
}


def key(group: ApiGroup) -> dict[str, str]:
    """The header that opens ``group`` on the locked gateway."""
    return {KEY[group]: SECRET[group]}


def admin() -> dict[str, str]:
    """The header that opens the admin gateway's restricted groups (a new dict each
    time: tritonclient adds its own headers to the dict it is given)."""
    return {"admin-key": ADMIN_SECRET}


def refusal(header: str) -> dict[str, str]:
    return {"error": f"This API is restricted, expecting header '{header}'"}


@dataclass
class Stack:
    locked: str
    admin: str
    locked_metrics: str
    serve: Service
    gateway: Service
    repo: Path


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path
) -> Iterator[Stack]:
    repo = tmp_path_factory.mktemp("restricted") / "models"
    add_model(repo / "add")
    offset_model(repo / "offset", 1, 1.0)
    db = fresh_db(redis_url, 1)
    port = free_port()
    # Batch jobs the tests submit fail fast in the worker: S3 is a port nothing answers.
    s3_nowhere = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    serve = Service(
        "serve-restricted",
        conch(
            "serve",
            *("--model-repository", str(repo), "--redis-url", db),
            *("--http-address", "127.0.0.1", "--http-port", str(port)),
            *("--http-workers", "1", "--http-thread-count", "4"),
            *("--metrics-port", str(free_port()), "--log-verbose", "1"),
            *MODEL_FLAGS,
            "--allow-model-upload",
            "--allow-grpc=false",
        ),
        log_dir,
        env={
            **s3_nowhere,
            "CONCH_HTTP_WORKER_CLASS": "gthread",
            # The restriction from the environment, so no command line holds the secret.
            "CONCH_HTTP_RESTRICTED_API": f"inference,model-repository:admin-key={ADMIN_SECRET}",
        },
    )
    admin = f"127.0.0.1:{port}"
    gateway = None
    try:
        wait_model_ready(admin, "add", 90, serve)
        gateway, locked = start_gateway(
            repo,
            db,
            log_dir,
            *MODEL_FLAGS,
            "--log-verbose",
            "1",
            *(f"--http-restricted-api={g}:{KEY[g]}={SECRET[g]}" for g in G),
            headers=key(G.HEALTH),
        )
        wait_model_ready(locked, "add", 60, serve, gateway, headers=key(G.HEALTH))
        yield Stack(locked, admin, gateway.metrics_url, serve, gateway, repo)
    finally:
        if gateway is not None:
            gateway.stop()
        assert serve.stop() == 0, serve.log()[-3000:]


# Every route of the gateway: (its group, method, path, body, its status once let through).
ROUTES = [
    (G.HEALTH, "GET", "/v2/health/live", None, 200),
    (G.HEALTH, "GET", "/v2/health/ready", None, 200),
    (G.HEALTH, "GET", "/v2/models/add/ready", None, 200),
    (G.HEALTH, "GET", "/v2/models/add/versions/1/ready", None, 200),
    (G.METADATA, "GET", "/v2", None, 200),
    (G.METADATA, "GET", "/v2/models/add", None, 200),
    (G.METADATA, "GET", "/v2/models/add/versions/1", None, 200),
    (G.MODEL_CONFIG, "GET", "/v2/models/add/config", None, 200),
    (G.STATISTICS, "GET", "/v2/models/stats", None, 200),
    (G.STATISTICS, "GET", "/v2/models/add/stats", None, 200),
    (G.MODEL_REPOSITORY, "POST", "/v2/repository/index", b"", 200),
    # Let through, these reach model control: no such model to load; nothing to unload.
    (G.MODEL_REPOSITORY, "POST", "/v2/repository/models/nope/load", b"", 400),
    (G.MODEL_REPOSITORY, "POST", "/v2/repository/models/nope/unload", b"", 200),
    (G.INFERENCE, "POST", "/v2/models/add/infer", ADD_BODY, 200),
    (G.INFERENCE, "POST", "/v2/models/add/versions/1/infer", ADD_BODY, 200),
    (G.JOBS, "POST", "/v2/models/add/jobs", ADD_BODY, 202),
    (G.BATCH, "POST", "/v2/models/add/batch", b"{}", 400),  # through: a bad spec
]


def _call(url: str, method: str, path: str, body: bytes | None, headers: dict[str, str]):
    return requests.request(method, f"http://{url}{path}", data=body, headers=headers, timeout=60)


@pytest.mark.parametrize(
    ("group", "method", "path", "body", "status"), ROUTES, ids=[r[2] for r in ROUTES]
)
def test_each_group_opens_only_with_its_own_header_and_value(
    stack: Stack, group: ApiGroup, method: str, path: str, body: bytes | None, status: int
) -> None:
    def call(headers: dict[str, str]) -> requests.Response:
        return _call(stack.locked, method, path, body, headers)

    other = next(g for g in G if g is not group)
    for headers in (
        {},
        {KEY[group]: "wrong"},
        {KEY[group]: SECRET[group] + "x"},
        {KEY[group]: SECRET[group][:-1]},
        {KEY[group]: ""},
        key(other),  # another group's header opens only that group
        {KEY[other]: SECRET[group]},
    ):
        r = call(headers)
        assert r.status_code == 403, (headers, r.status_code, r.text)
        assert r.json() == refusal(KEY[group])
    r = call(key(group))
    assert r.status_code == status, r.text
    # Header names are case-insensitive, as in HTTP (and Triton).
    assert call({KEY[group].upper(): SECRET[group]}).status_code == status


@pytest.mark.parametrize(
    ("group", "method", "path", "body", "status"), ROUTES, ids=[r[2] for r in ROUTES]
)
def test_groups_left_open_need_no_header(
    stack: Stack, group: ApiGroup, method: str, path: str, body: bytes | None, status: int
) -> None:
    """The admin gateway restricts inference and model-repository only (one header for
    both, Triton's admin example); the other groups answer anyone."""
    r = _call(stack.admin, method, path, body, {})
    if group in (G.INFERENCE, G.MODEL_REPOSITORY):
        assert (r.status_code, r.json()) == (403, refusal("admin-key")), r.text
        assert _call(stack.admin, method, path, body, {"admin-key": "x"}).status_code == 403
        r = _call(stack.admin, method, path, body, admin())
    assert r.status_code == status, r.text


@pytest.mark.parametrize("server", ["locked", "admin"])
def test_tritonclient_infers_only_with_the_header(stack: Stack, server: str) -> None:
    """The stock client, with its ``headers`` argument: the gevent worker's keep-alive
    loop (locked) and the WSGI fast path (admin, gthread)."""
    url, header = (stack.locked, key(G.INFERENCE)) if server == "locked" else (stack.admin, admin())
    client = httpclient.InferenceServerClient(url)
    expected = next(iter(header))
    with pytest.raises(InferenceServerException, match=f"expecting header '{expected}'") as e:
        client.infer("add", add_inputs(np.arange(4, dtype=np.float32).reshape(1, 4)))
    assert e.value.status() == "403"
    with pytest.raises(InferenceServerException, match="restricted"):
        client.infer(
            "add",
            add_inputs(np.arange(4, dtype=np.float32).reshape(1, 4)),
            headers={expected: "nope"},
        )
    got = client.infer(
        "add", add_inputs(np.arange(4, dtype=np.float32).reshape(1, 4)), headers=header
    ).as_numpy("OUT")
    np.testing.assert_array_equal(got, 2 * np.arange(4, dtype=np.float32).reshape(1, 4))


def _infer_request(target: str = "/v2/models/add/infer", headers: str = "") -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(ADD_BODY)}\r\n{headers}\r\n"
    ).encode() + ADD_BODY


@pytest.mark.parametrize("server", ["locked", "admin"])
@pytest.mark.parametrize(
    "target",
    ["/v2/models/add/infer", "/v2/models/add/infer?x=1", "/v2/models/%61dd/infer"],
    ids=["plain", "query", "percent-encoded"],
)
def test_infer_is_checked_on_every_path_of_a_keep_alive_connection(
    stack: Stack, server: str, target: str
) -> None:
    """One connection: refused, served, refused again. Under gevent a plain infer call is
    read by the worker's own loop, one with a query or a percent-encoded path by
    gunicorn's parser; under gthread both go through WSGI."""
    url, (name, value) = (
        (stack.locked, (KEY[G.INFERENCE], SECRET[G.INFERENCE]))
        if server == "locked"
        else (stack.admin, ("admin-key", ADMIN_SECRET))
    )
    with connect(url) as sock:
        buf = bytearray()
        sock.sendall(
            _infer_request(target)
            + _infer_request(target, f"{name}: {value}\r\n")
            + _infer_request(target, f"{name}: {value}0\r\n")
        )
        for expected in ("403 Forbidden", "200 OK", "403 Forbidden"):
            status, headers, body = read_response(sock, buf)
            assert status == f"HTTP/1.1 {expected}", body
            assert headers["connection"] == "keep-alive"
            if expected != "200 OK":
                assert json.loads(body) == refusal(name)


@pytest.mark.parametrize("server", ["locked", "admin"])
def test_a_restricted_api_refuses_before_it_says_the_method_is_wrong(
    stack: Stack, server: str
) -> None:
    """As Triton checks the restriction first: no header, a 403 whatever the method; with
    the header, the route's own 405."""
    url, header = (stack.locked, key(G.INFERENCE)) if server == "locked" else (stack.admin, admin())
    for path in ("/v2/models/add/infer", "/v2/repository/index"):
        r = _call(url, "GET", path, None, {})
        assert r.status_code == 403, r.text
    assert _call(url, "GET", "/v2/models/add/infer", None, header).status_code == 405
    # Locked: the health group too. Unknown paths are no API: 404 for anyone.
    if server == "locked":
        assert _call(url, "POST", "/v2/health/live", b"", {}).status_code == 403
        assert _call(url, "POST", "/v2/health/live", b"", key(G.HEALTH)).status_code == 405
    assert _call(url, "GET", "/v2/nothing/here", None, {}).status_code == 404


def test_the_metrics_port_is_no_api_group(stack: Stack) -> None:
    r = requests.get(f"http://{stack.locked_metrics}/metrics", timeout=30)
    assert r.status_code == 200 and "nv_inference_count" in r.text


def _wait_done(url: str, job: str, header: dict[str, str]) -> dict:
    done: dict = {}

    def finished() -> bool:
        done.update(_call(url, "GET", f"/v2/jobs/{job}", None, header).json())
        return done["status"] not in ("PENDING", "STARTED")

    wait_until(finished, 60, f"job {job} to finish")
    return done


def test_a_job_is_reached_with_its_kind_group_header(stack: Stack) -> None:
    """Status, result and cancel serve both kinds of job: each checks the group of the
    job it found (``jobs`` for an async job, ``batch`` for a batch job)."""
    url = stack.locked
    r = _call(url, "POST", "/v2/models/add/jobs", ADD_BODY, key(G.JOBS))
    assert r.status_code == 202, r.text
    infer_job = r.json()["id"]
    r = _call(
        url,
        "POST",
        "/v2/models/add/batch",
        b'{"input": "s3://bucket/in.jsonl", "output": "s3://bucket/out.jsonl"}',
        key(G.BATCH),
    )
    assert r.status_code == 202, r.text
    batch_job = r.json()["id"]
    for job, group in ((infer_job, G.JOBS), (batch_job, G.BATCH)):
        other = G.BATCH if group is G.JOBS else G.JOBS
        for method, path in (
            ("GET", f"/v2/jobs/{job}"),
            ("GET", f"/v2/jobs/{job}/result"),
            ("DELETE", f"/v2/jobs/{job}"),
        ):
            for headers in ({}, key(other), {KEY[group]: "wrong"}):
                r = _call(url, method, path, None, headers)
                assert (r.status_code, r.json()) == (403, refusal(KEY[group])), (path, headers)
        assert _call(url, "GET", f"/v2/jobs/{job}", None, key(group)).status_code == 200
    assert _wait_done(url, infer_job, key(G.JOBS))["status"] == "SUCCESS"
    r = _call(url, "GET", f"/v2/jobs/{infer_job}/result", None, key(G.JOBS))
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 4, 6, 8]
    # Its header lets a cancel through, to cancel's own answer (the job has finished).
    r = _call(url, "DELETE", f"/v2/jobs/{infer_job}", None, key(G.JOBS))
    assert r.status_code == 400 and "already finished" in r.json()["error"]
    # The batch job: cancelled, or failed already (no S3 here): either way, let through.
    r = _call(url, "DELETE", f"/v2/jobs/{batch_job}", None, key(G.BATCH))
    assert r.status_code in (200, 400), r.text
    # An unknown job is a 404 whatever the headers: there is no kind to check.
    assert _call(url, "GET", f"/v2/jobs/{uuid.uuid4().hex}", None, {}).status_code == 404
    # JobClient (and conch batch) send the header with every call.
    jobs = JobClient(url, headers=key(G.JOBS))
    assert jobs.status(infer_job)["status"] == "SUCCESS"
    with pytest.raises(InferenceServerException, match="key-jobs"):
        JobClient(url).status(infer_job)


def test_conch_batch_sends_the_header_it_is_given(stack: Stack) -> None:
    args = [
        *conch("batch", "-m", "add", "-u", stack.locked, "--no-wait"),
        *("--input", "s3://bucket/in.jsonl", "--output", "s3://bucket/out2.jsonl"),
    ]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "refused (403)" in refused.stderr and KEY[G.BATCH] in refused.stderr
    ok = subprocess.run(
        [*args, "-H", f"{KEY[G.BATCH]}: {SECRET[G.BATCH]}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout.strip()) == 32  # the job id


def _fresh_load(url: str, headers: dict[str, str], onnx: bytes) -> requests.Response:
    config = json.dumps({"name": "fresh", **ONNX_CONFIG})
    params = {"config": config, "file:1/model.onnx": base64.b64encode(onnx).decode()}
    return requests.post(
        f"http://{url}/v2/repository/models/fresh/load",
        json={"parameters": params},
        headers=headers,
        timeout=120,
    )


def test_model_upload_is_refused_unless_allowed(stack: Stack) -> None:
    """``file:`` parameters bring code a worker runs: off unless --allow-model-upload.
    A config override alone is Triton's own API and stays allowed."""
    onnx = (stack.repo / "offset" / "1" / "model.onnx").read_bytes()
    locked = httpclient.InferenceServerClient(stack.locked)
    repo_key = key(G.MODEL_REPOSITORY)
    r = _fresh_load(stack.locked, repo_key, onnx)
    assert r.status_code == 403, r.text
    assert "--allow-model-upload" in r.json()["error"] and "fresh" in r.json()["error"]
    index = locked.get_model_repository_index(headers=repo_key)
    assert "fresh" not in {m["name"] for m in index}  # nothing reached a worker
    # The same refusal through tritonclient's load_model.
    with pytest.raises(InferenceServerException, match="--allow-model-upload"):
        locked.load_model(
            "fresh",
            config=json.dumps({"name": "fresh", **ONNX_CONFIG}),
            files={"file:1/model.onnx": onnx},
            headers=repo_key,
        )
    # A config override with no files: allowed.
    locked.load_model(
        "offset", config=json.dumps({"name": "offset", **ONNX_CONFIG}), headers=repo_key
    )
    assert locked.is_model_ready("offset", headers=key(G.HEALTH))
    # The admin gateway has --allow-model-upload (through conch serve): the same load works.
    assert _fresh_load(stack.admin, {}, onnx).status_code == 403  # still restricted
    r = _fresh_load(stack.admin, admin(), onnx)
    assert r.status_code == 200, r.text
    x = httpclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    got = httpclient.InferenceServerClient(stack.admin).infer("fresh", [x], headers=admin())
    np.testing.assert_array_equal(got.as_numpy("Y"), np.full((1, 4), 2.0, np.float32))


def test_no_secret_is_ever_logged(stack: Stack) -> None:
    """After everything above, at --log-verbose 1: conch serve with its worker and
    gateway, and the locked gateway, never wrote a secret (only header names)."""
    logs = stack.serve.log() + stack.gateway.log()
    assert "GET /v2/health/live" in logs or "Booting worker" in logs  # logs there are
    assert ADMIN_SECRET not in logs
    for g in G:
        assert SECRET[g] not in logs, g


def test_no_command_line_shows_the_secret_conch_serve_was_given(stack: Stack) -> None:
    """conch serve passes its restriction to its gateway through the environment:
    any user of the host can read a command line (ps), not another user's environment."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # the process is gone
    gateways = [
        line for line in lines if "conch gateway" in line and stack.admin.split(":")[1] in line
    ]
    assert gateways, "conch serve's gateway is not among the processes"
    assert not [line for line in lines if ADMIN_SECRET in line]
