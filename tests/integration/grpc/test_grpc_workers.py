"""``conch grpc --grpc-workers N``: N server processes on one port (SO_REUSEPORT), under
a supervisor that checks the port first and stops them all on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conch.devtools.redis_server import free_port

from harness import (
    Service,
    conch,
    start_grpc,
    wait_grpc_model_ready,
    wait_until,
)

LISTEN, ESTABLISHED = "0A", "01"  # TCP states as /proc/net/tcp writes them


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def _sockets(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _tcp(port: int, state: str) -> set[int]:
    """The inodes of this host's TCP sockets on local port ``port`` in ``state``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == state:
                inodes.add(int(cols[9]))
    return inodes


def _add(client: grpcclient.InferenceServerClient) -> np.ndarray:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    inputs = []
    for name in ("A", "B"):
        inp = grpcclient.InferInput(name, [1, 4], "FP32")
        inp.set_data_from_numpy(a)
        inputs.append(inp)
    return client.infer("add", inputs).as_numpy("OUT")


def test_two_processes_share_the_port_and_stop_on_sigterm(backend, log_dir: Path) -> None:
    repo, db = backend
    server, url = start_grpc(repo, db, log_dir, "--grpc-workers", "2")
    port = int(url.rsplit(":", 1)[1])
    try:
        wait_until(lambda: len(_children(server.pid)) == 2, 30, "two gRPC processes", server)
        children = _children(server.pid)
        for child in children:  # each has the port open itself (the supervisor does not)
            wait_until(
                lambda pid=child: _sockets(pid) & _tcp(port, LISTEN),
                60,
                f"{child} to listen",
                server,
            )
        assert not _sockets(server.pid) & _tcp(port, LISTEN)
        wait_grpc_model_ready(url, "add", 60, server)

        # Connections spread over both processes (the kernel hashes each to one of them:
        # all 32 to one is a chance of 2**-31). A channel of its own pool of subchannels
        # makes a connection of its own; grpcio shares one among like channels otherwise.
        own = [("grpc.use_local_subchannel_pool", 1)]
        clients = [grpcclient.InferenceServerClient(url, channel_args=own) for _ in range(32)]
        try:
            for c in clients:
                assert _add(c).tolist() == [[0.0, 2.0, 4.0, 6.0]]
            held = _tcp(port, ESTABLISHED)
            served = [len(_sockets(child) & held) for child in children]
            assert all(served) and sum(served) == 32, served
        finally:
            for c in clients:
                c.close()

        os.kill(server.pid, signal.SIGTERM)  # the supervisor alone: it forwards the signal
        assert server.proc.wait(timeout=60) == 0, server.log()[-3000:]
        assert not any(Path(f"/proc/{child}").exists() for child in children)
    finally:
        server.stop()


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "so_reuseport"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_another_process_listens_on_stops_the_start(
    tmp_path: Path, redis_url: str, workers: int, shared: bool
) -> None:
    """Even a listener that allows SO_REUSEPORT (as the processes of --grpc-workers do)
    is not joined: the port is taken."""
    port = free_port()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, int(shared))
        holder.bind(("127.0.0.1", port))
        holder.listen()
        done = subprocess.run(
            conch(
                "grpc",
                "--model-repository",
                str(tmp_path),
                "--redis-url",
                redis_url,
                "--grpc-address",
                "127.0.0.1",
                "--grpc-port",
                str(port),
                "--grpc-workers",
                str(workers),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode != 0
    assert f"conch grpc: cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr[-3000:]


def test_a_child_that_fails_stops_the_rest(tmp_path: Path, redis_url: str) -> None:
    """A start that fails in the servers (a missing TLS file) ends the supervisor too,
    with an error, and leaves no process behind."""
    server = Service(
        "grpc-bad",
        conch(
            "grpc",
            "--model-repository",
            str(tmp_path),
            "--redis-url",
            redis_url,
            "--grpc-port",
            str(free_port()),
            "--grpc-workers",
            "2",
            "--grpc-use-ssl=true",
            "--grpc-server-cert",
            str(tmp_path / "missing.pem"),
            "--grpc-server-key",
            str(tmp_path / "missing.key"),
        ),
        tmp_path,
    )
    try:
        assert server.proc.wait(timeout=120) != 0
        assert "--grpc-server-key" in server.log()
        with pytest.raises(ProcessLookupError):  # its process group is empty
            os.killpg(server.pid, 0)
    finally:
        server.stop()
