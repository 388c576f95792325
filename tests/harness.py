"""Real processes for tests: redis-server, conch workers and gateways, each with a log."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import redis
import tritonclient.http as httpclient

from conch.devtools import perf_analyzer, processes
from conch.devtools.processes import conch
from conch.devtools.redis_server import answers, free_port, redis_server_binary, wait_answering
from conch.settings import GrpcTransport, Settings
from conch.wire import worker_reports
from conch.wire.work_owed import work_owed

ROOT = Path(__file__).resolve().parents[1]

# The shipped models' numpy references live beside the script that builds them.
sys.path.insert(0, str(ROOT / "functions"))
from build_models import reference_mlp  # noqa: E402

__all__ = [
    "HERE",
    "ROOT",
    "DurableRedis",
    "Place",
    "Service",
    "conch",
    "connect",
    "fresh_db",
    "grpc_transport",
    "read_response",
    "reference_mlp",
    "run_perf_analyzer",
    "serving",
    "start_gateway",
    "start_grpc",
    "start_redis",
    "start_serve",
    "start_worker",
    "wait_grpc_model_ready",
    "wait_model_ready",
    "wait_until",
    "worker_requests",
]


class Place(Protocol):
    """Where a service runs: this machine (``HERE``), or a host of ``netns.Network``."""

    @property
    def address(self) -> str:
        """The address its services listen on, and others reach them at."""
        ...

    def command(self, argv: list[str]) -> list[str]:
        """``argv``, made to run there."""
        ...

    def env(self) -> dict[str, str]:
        """What the place adds to a service's environment."""
        ...


class _ThisMachine:
    address = "127.0.0.1"

    def command(self, argv: list[str]) -> list[str]:
        return argv

    def env(self) -> dict[str, str]:
        return {}


HERE: Place = _ThisMachine()


class Service:
    """A child process whose output goes to a log file the test can read."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        on: Place = HERE,
    ) -> None:
        self.name = name
        self.metrics_url = ""  # gateways: host:port of their metrics port
        self.log_path = log_dir / f"{name}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **on.env(), **(env or {})}
        self.proc = subprocess.Popen(
            on.command(cmd),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def send(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.proc.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.alive():
            self.send(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.send(signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


class DurableRedis:
    """A redis-server that logs every write to an append-only file in ``folder``, on a
    port of its own: SIGKILL it, start it again on the same port from the same file."""

    def __init__(self, folder: Path, *, appendfsync: str = "everysec") -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        """Start it (again) and wait until it answers, its dataset read back."""
        log = self.folder / "redis.log"
        self.proc = subprocess.Popen(
            [
                redis_server_binary(),
                *("--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *("--appendonly", "yes", "--appendfsync", self.appendfsync),
                *("--dir", str(self.folder), "--logfile", str(log)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_answering(self.proc, self.url, log)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def start_redis(log_dir: Path, *, on: Place = HERE, port: int = 0) -> tuple[Service, str]:
    """A redis-server that keeps nothing, on ``on``'s address and ``port`` (a free one
    when 0); its URL once it answers."""
    port = port or free_port()
    svc = Service(
        "redis",
        [
            redis_server_binary(),
            *("--port", str(port), "--bind", on.address, "--protected-mode", "no"),
            *("--save", "", "--appendonly", "no"),
        ],
        log_dir,
        on=on,
    )
    url = f"redis://{on.address}:{port}/0"
    wait_until(lambda: answers(url, 0.2), 15, f"redis-server at {url}", svc)
    return svc, url


def start_worker(
    repo: Path,
    redis_url: str,
    log_dir: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    on: Place = HERE,
) -> Service:
    return Service(
        "worker",
        conch("worker", "--model-repository", str(repo), "--redis-url", redis_url, *extra),
        log_dir,
        env,
        on,
    )


def start_gateway(
    repo: Path,
    redis_url: str,
    log_dir: Path,
    *extra: str,
    workers: int = 1,
    threads: int = 16,
    env: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    port: int = 0,
    metrics_port: int = 0,
    on: Place = HERE,
) -> tuple[Service, str]:
    """A gateway on ``on``, at ``port`` and ``metrics_port`` (free ones when 0); its URL
    once live (asked with ``headers``: those a restricted health API needs)."""
    port, metrics_port = port or free_port(), metrics_port or free_port()
    svc = Service(
        "gateway",
        conch(
            "gateway",
            "--model-repository",
            str(repo),
            "--redis-url",
            redis_url,
            "--http-address",
            on.address,
            "--http-port",
            str(port),
            "--http-workers",
            str(workers),
            "--http-thread-count",
            str(threads),
            "--metrics-port",
            str(metrics_port),
            *extra,
        ),
        log_dir,
        env,
        on,
    )
    svc.metrics_url = f"{on.address}:{metrics_port}"
    url = f"{on.address}:{port}"
    wait_until(lambda: _live(url, headers), 60, f"gateway on {url} to go live", svc)
    return svc, url


def start_serve(
    repo: Path,
    redis_url: str | None,
    log_dir: Path,
    *extra: str,
    name: str = "serve",
    env: dict[str, str] | None = None,
    argv: tuple[str, ...] | None = None,
) -> tuple[Service, str, str]:
    """``conch serve`` (what ``make serve`` runs) on free loopback ports: the process, its
    HTTP URL and its gRPC URL; not yet ready. No ``redis_url``: serve finds or starts
    its own Redis, as ``make serve`` does. ``argv``: a launch line of its own in place of
    ``--model-repository repo`` (the ports and Redis follow it)."""
    port, grpc_port = free_port(), free_port()
    redis_args = ["--redis-url", redis_url] if redis_url else []
    svc = Service(
        name,
        conch(
            "serve",
            *(argv if argv is not None else ("--model-repository", str(repo))),
            *redis_args,
            "--http-address",
            "127.0.0.1",
            "--http-port",
            str(port),
            "--http-workers",
            "1",
            "--metrics-port",
            str(free_port()),
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            str(grpc_port),
            *extra,
        ),
        log_dir,
        env=env,
    )
    return svc, f"127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"


def run_perf_analyzer(*args: str) -> tuple[str, list[float]]:
    """Triton's perf_analyzer (``conch.devtools.perf_analyzer``) with 1 s windows: its
    output, and the throughput of each concurrency it measured (from its CSV); the test
    fails if it fails.

    These tests check that it runs, not how steadily: at 200% any three windows count
    as stable (none can be more than 3x their mean), so a shared, busy machine never
    fails them for instability."""
    with tempfile.TemporaryDirectory() as tmp:
        pa = perf_analyzer.run(
            perf_analyzer.binary(),
            [*args, "--measurement-interval", "1000", "--stability-percentage", "200"],
            Path(tmp) / "pa.csv",
            timeout_s=240,
        )
    assert pa.code == 0, pa.output[-6000:]
    assert pa.lines[0].startswith("Concurrency"), pa.lines
    return pa.output, [float(row["Inferences/Second"]) for row in pa.rows]


def grpc_transport() -> GrpcTransport:
    """What ``conch grpc`` serves on in these tests: ``CONCH_GRPC_TRANSPORT`` (which every
    server process inherits, so ``CONCH_GRPC_TRANSPORT=h2 pytest ...`` runs the gRPC
    tests on h2), else the default."""
    return Settings.from_env().grpc_transport


def start_grpc(
    repo: Path,
    redis_url: str,
    log_dir: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    port: int = 0,
    client_options: dict[str, object] | None = None,
    on: Place = HERE,
) -> tuple[Service, str]:
    """A gRPC server (``conch grpc``) on ``on``, at ``port`` (a free one when 0); its URL once live
    (so not under a restricted health group), as a client made with ``client_options``
    (e.g. TLS files) sees it."""
    import tritonclient.grpc as grpcclient

    port = port or free_port()
    svc = Service(
        "grpc",
        conch(
            "grpc",
            "--model-repository",
            str(repo),
            "--redis-url",
            redis_url,
            "--grpc-address",
            on.address,
            "--grpc-port",
            str(port),
            *extra,
        ),
        log_dir,
        env,
        on,
    )
    url = f"{on.address}:{port}"
    client = grpcclient.InferenceServerClient(url, **(client_options or {}))

    def live() -> bool:
        try:
            return client.is_server_live(client_timeout=2)
        except Exception:
            return False

    wait_until(live, 60, f"gRPC server on {url} to go live", svc)
    client.close()
    return svc, url


def _live(url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        return httpclient.InferenceServerClient(url).is_server_live(headers=headers)
    except Exception:
        return False


def wait_until(pred: Callable[[], bool], timeout: float, what: str, *services: Service) -> None:
    """Until ``pred`` holds; the test fails with the log of any of ``services`` that exits
    meanwhile, or with all their logs after ``timeout`` seconds."""

    def watch() -> None:
        for s in services:
            if not s.alive():
                raise AssertionError(
                    f"{s.name} exited ({s.proc.returncode}) while waiting for {what}:\n{s.log()[-4000:]}"
                )

    if not processes.wait_until(pred, timeout, watch=watch):
        logs = "\n".join(f"--- {s.name}\n{s.log()[-4000:]}" for s in services)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


def wait_model_ready(
    url: str,
    model: str,
    timeout: float = 60,
    *services: Service,
    headers: dict[str, str] | None = None,
) -> None:
    client = httpclient.InferenceServerClient(url)

    def ready() -> bool:
        try:
            return client.is_model_ready(model, headers=headers)
        except Exception:
            return False

    wait_until(ready, timeout, f"model {model} ready at {url}", *services)


def worker_requests(client: redis.Redis, model: str) -> dict[str, int]:
    """Requests each live worker ran for ``model``, by worker id (as of its last beat)."""
    return {
        r["id"]: r.get("stats", {}).get(model, {}).get("requests", 0)
        for r in worker_reports.snapshot(client)
    }


def wait_grpc_model_ready(url: str, model: str, timeout: float = 60, *services: Service) -> None:
    """Until the gRPC server at ``url`` says ``model`` is ready."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)

    def ready() -> bool:
        try:
            return client.is_model_ready(model)
        except Exception:
            return False

    try:
        wait_until(ready, timeout, f"model {model} ready over gRPC at {url}", *services)
    finally:
        client.close()


def connect(url: str) -> socket.socket:
    host, port = url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def read_response(
    sock: socket.socket, buf: bytearray, *, to_head: bool = False
) -> tuple[str, dict[str, str], bytes]:
    """One response off the socket (``to_head``: to a HEAD request, so with no body);
    bytes after it stay in ``buf``."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a full response: {bytes(buf)!r}"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if to_head else int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a body"
        rest += chunk
    buf[:] = rest[length:]
    return lines[0], headers, rest[:length]


def waiting(redis_url: str, model: str) -> int:
    """Requests in the model's queue, every priority step (``conch.wire.work_owed``)."""
    return work_owed(redis.Redis.from_url(redis_url), [model])[model].waiting


def fresh_db(redis_url: str, index: int) -> str:
    """The URL of database ``index`` on the test Redis, emptied: one per test module."""
    url = redis_url.rsplit("/", 1)[0] + f"/{index}"
    redis.Redis.from_url(url).flushdb()
    return url


@contextmanager
def serving(
    repo: Path,
    db: str,
    log_dir: Path,
    models: tuple[str, ...],
    *,
    threads: int = 16,
    worker_env: dict[str, str] | None = None,
    flags: tuple[str, ...] = (),
) -> Iterator[tuple[str, Service, Service]]:
    """A worker serving ``models`` and a gateway (both given ``flags`` too), until every
    model is ready: (gateway URL, worker, gateway); both are stopped on the way out."""
    worker = start_worker(repo, db, log_dir, "--models", ",".join(models), *flags, env=worker_env)
    gateway, url = start_gateway(repo, db, log_dir, *flags, threads=threads)
    try:
        for m in models:
            wait_model_ready(url, m, 90, worker, gateway)
        yield url, worker, gateway
    finally:
        gateway.stop()
        worker.stop()
