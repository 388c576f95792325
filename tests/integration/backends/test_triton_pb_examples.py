"""Triton's own python_backend examples, run unchanged against conch.

The models and client scripts under ``tests/third_party/triton_python_backend_examples``
are NVIDIA's files, byte for byte (see the README there). The repository is laid out here
as each example's README tells a Triton user to lay it out; a real worker and gateway
(gunicorn) serve it; each client script runs with this interpreter as a subprocess and
must exit 0 and print its ``PASS`` line.

The scripts talk to ``localhost:8000`` (and the metrics port, ``localhost:8002``; the
decoupled examples' gRPC streams ``localhost:8001``, served by ``conch grpc``). When all
three ports are free the servers take them and the vendored scripts run in place; when
another process holds one, each script runs from a temporary copy in which only those
addresses are rewritten to the servers' ports (the test says which it did).
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from harness import (
    ROOT,
    Service,
    fresh_db,
    start_gateway,
    start_grpc,
    start_worker,
    wait_model_ready,
)

VENDORED = ROOT / "tests" / "third_party" / "triton_python_backend_examples"
EXAMPLES = VENDORED / "examples"
TRITON_HTTP_PORT, TRITON_GRPC_PORT, TRITON_METRICS_PORT = 8000, 8001, 8002

# The repository, as the examples' READMEs build it: model -> (model file, config or None).
REPOSITORY = {
    "add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
    "pytorch": ("pytorch/model.py", "pytorch/config.pbtxt"),
    "jax": ("jax/model.py", "jax/config.pbtxt"),
    "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt"),
    "bls_async": ("bls/async_model.py", "bls/async_config.pbtxt"),
    # No config.pbtxt: auto_complete_config in the model file supplies it.
    "nobatch_auto_complete": ("auto_complete/nobatch_model.py", None),
    "batch_auto_complete": ("auto_complete/batch_model.py", None),
    "custom_metrics": ("custom_metrics/model.py", "custom_metrics/config.pbtxt"),
    # Decoupled: any number of responses a request, on a gRPC stream.
    "repeat_int32": ("decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
    "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
    # BLS calls to square_int32 with exec(decoupled=True) and async_exec(decoupled=True).
    "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
}

# client script -> the lines it must print (its PASS line last).
CLIENTS = {
    "add_sub/client.py": ["PASS: add_sub"],
    "pytorch/client.py": ["PASS: pytorch"],
    "jax/client.py": ["PASS: jax"],
    # The third request names a model that does not exist: the script prints the error it
    # gets, and passes whatever it is, so the test checks that error names that model.
    "bls/sync_client.py": ["'pytorch' model result", "undefined_model", "PASS: BLS Sync"],
    "bls/async_client.py": ["PASS: BLS Async"],
    "auto_complete/client.py": [
        "'nobatch_auto_complete' configuration matches the expected auto complete configuration",
        "'batch_auto_complete' configuration matches the expected auto complete configuration",
        "PASS: auto_complete",
    ],
    "custom_metrics/client.py": [
        'found pattern \'requests_process_latency_ns{model="custom_metrics",version="1"}\'',
        "PASS: custom_metrics",
    ],
    "decoupled/repeat_client.py": ["PASS: repeat_int32"],
    "decoupled/square_client.py": ["PASS: square_int32"],
    "bls_decoupled/sync_client.py": [
        "The square value of [4] is [16]",
        "The square value of [0] is [0]",
        "PASS: BLS Decoupled Sync",
    ],
    "bls_decoupled/async_client.py": [
        "Two times the square value of [4] is [32]",
        "Two times the square value of [0] is [0]",
        "PASS: BLS Decoupled Async",
    ],
}


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the gateway binds
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@dataclass
class Served:
    http_port: int
    metrics_port: int
    grpc_port: int
    worker: Service
    gateway: Service

    @property
    def on_triton_ports(self) -> bool:
        ours = (self.http_port, self.grpc_port, self.metrics_port)
        return ours == (TRITON_HTTP_PORT, TRITON_GRPC_PORT, TRITON_METRICS_PORT)


def build_repository(root: Path) -> Path:
    for model, (model_file, config) in REPOSITORY.items():
        (root / model / "1").mkdir(parents=True)
        shutil.copyfile(EXAMPLES / model_file, root / model / "1" / "model.py")
        if config is not None:
            shutil.copyfile(EXAMPLES / config, root / model / "config.pbtxt")
    return root


@pytest.fixture(scope="module")
def served(
    redis_url: str, log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    repo = build_repository(tmp_path_factory.mktemp("pb_examples") / "models")
    db = fresh_db(redis_url, 14)
    worker = start_worker(repo, db, log_dir)
    gateway = grpc = None
    try:
        triton_ports = all(map(_free, (TRITON_HTTP_PORT, TRITON_GRPC_PORT, TRITON_METRICS_PORT)))
        grpc, grpc_url = start_grpc(repo, db, log_dir, port=TRITON_GRPC_PORT if triton_ports else 0)
        ports = {"port": TRITON_HTTP_PORT, "metrics_port": TRITON_METRICS_PORT}
        if triton_ports:
            try:
                gateway, url = start_gateway(repo, db, log_dir, **ports)
            except AssertionError:  # another process took one between the check and the bind
                gateway = None
        if gateway is None:
            gateway, url = start_gateway(repo, db, log_dir)
        for model in REPOSITORY:
            wait_model_ready(url, model, 120, worker, gateway)
        shipped = url.endswith(f":{TRITON_HTTP_PORT}")
        print(f"serving on {url}: client scripts run {'as shipped' if shipped else 'from copies'}")
        yield Served(
            int(url.rsplit(":", 1)[1]),
            int(gateway.metrics_url.rsplit(":", 1)[1]),
            int(grpc_url.rsplit(":", 1)[1]),
            worker,
            gateway,
        )
    finally:
        if gateway is not None:
            gateway.stop()
        if grpc is not None:
            grpc.stop()
        worker.stop()


def _script(served: Served, client: str, tmp_path: Path) -> Path:
    """The vendored script itself on Triton's ports; else a copy aimed at the gateway's."""
    original = EXAMPLES / client
    if served.on_triton_ports:
        return original
    text = original.read_text()
    for triton_port, ours in (
        (TRITON_HTTP_PORT, served.http_port),
        (TRITON_GRPC_PORT, served.grpc_port),
        (TRITON_METRICS_PORT, served.metrics_port),
    ):
        text = text.replace(f"localhost:{triton_port}", f"localhost:{ours}")
    copy = tmp_path / original.name
    copy.write_text(text)
    return copy


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_example_client_passes(served: Served, client: str, tmp_path: Path) -> None:
    script = _script(served, client, tmp_path)
    where = (
        "as shipped" if script.is_relative_to(EXAMPLES) else "from a copy with its ports rewritten"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{client} ({where}) exited {done.returncode}:\n{output}"
    position = 0
    for line in CLIENTS[client]:
        found = done.stdout.find(line, position)
        assert found >= 0, f"{client} ({where}) did not print {line!r} (in order):\n{output}"
        position = found + len(line)


def test_custom_metric_is_current_when_the_reply_arrives(served: Served) -> None:
    """The custom_metrics model's counter (one metric, shared by its three instances) is on
    the metrics port with each request's time already added when the client has its reply:
    the worker sends it with the replies, not only on its next heartbeat."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.http_port}")
    sample = 'requests_process_latency_ns{model="custom_metrics",version="1"} '
    seen = []
    for _ in range(3):
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = httpclient.InferInput(name, [4], "FP32")
            tensor.set_data_from_numpy(np.ones(4, np.float32))
            inputs.append(tensor)
        client.infer("custom_metrics", inputs)
        text = urllib.request.urlopen(f"http://127.0.0.1:{served.metrics_port}/metrics").read()
        lines = [ln for ln in text.decode().splitlines() if ln.startswith(sample)]
        assert len(lines) == 1, lines
        seen.append(float(lines[0][len(sample) :]))
    assert seen[0] > 0 and seen[0] < seen[1] < seen[2], seen


def test_vendored_files_are_upstreams() -> None:
    """Nothing under the vendored folder was edited: every file there is listed in UPSTREAM
    with the git blob id it has at the recorded upstream commit, and still has it."""
    listed = {}
    for line in (VENDORED / "UPSTREAM").read_text().splitlines():
        if line and not line.startswith("#"):
            blob, path = line.split()
            listed[path] = blob
    ours = {"README.md", "UPSTREAM"}  # the only files here that are conch's
    present = {str(p.relative_to(VENDORED)) for p in VENDORED.rglob("*") if p.is_file()}
    assert set(listed) == present - ours
    for path, blob in listed.items():
        data = (VENDORED / path).read_bytes()
        got = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        assert got == blob, f"{path} differs from upstream"
