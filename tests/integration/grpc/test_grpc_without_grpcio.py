"""``conch grpc`` serves with no grpcio in its process: grpcio is a client's dependency
(tritonclient's), not the server's. The server here runs with ``grpc`` and
``grpc_health`` made unimportable, and the stock clients drive it over the network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conch.core.extras import install_command

from harness import conch, start_grpc, wait_grpc_model_ready

# Loaded by ``site`` at the server's start, before conch: ``import grpc`` fails there.
BLOCKER = """
import sys

class _NoGrpc:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("grpc", "grpc_health"):
            raise ModuleNotFoundError(f"no module named {name!r} (blocked by the test)")

sys.meta_path.insert(0, _NoGrpc())
"""


def _without_grpcio(folder: Path) -> dict[str, str]:
    """The environment of a process in which ``import grpc`` fails (checked here)."""
    (folder / "sitecustomize.py").write_text(BLOCKER)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    tried = subprocess.run([sys.executable, "-c", "import grpc"], env=env, capture_output=True)
    assert tried.returncode != 0 and b"blocked by the test" in tried.stderr
    return env


def test_the_h2_server_runs_without_grpcio(backend, tmp_path: Path, log_dir: Path) -> None:
    repo, db = backend
    env = _without_grpcio(tmp_path)
    server, url = start_grpc(repo, db, log_dir, env={"PYTHONPATH": env["PYTHONPATH"]})
    try:
        wait_grpc_model_ready(url, "add", 60, server)
        client = grpcclient.InferenceServerClient(url)
        a = np.arange(4, dtype=np.float32).reshape(1, 4)
        inputs = [grpcclient.InferInput(name, [1, 4], "FP32") for name in ("A", "B")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        assert client.infer("add", inputs).as_numpy("OUT").tolist() == [[0.0, 2.0, 4.0, 6.0]]
        assert client.get_model_metadata("add").name == "add"
        with grpc.insecure_channel(url) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            answer = health.Check(health_pb2.HealthCheckRequest(service="add"), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        client.close()
    finally:
        server.stop()


def test_the_grpcio_transport_says_which_extra_it_needs(backend, tmp_path: Path) -> None:
    repo, db = backend
    env = _without_grpcio(tmp_path)
    done = subprocess.run(
        conch(
            "grpc",
            "--model-repository",
            str(repo),
            "--redis-url",
            db,
            "--grpc-transport",
            "grpcio",
            "--grpc-port",
            "0",
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert install_command("grpcio") in done.stderr
