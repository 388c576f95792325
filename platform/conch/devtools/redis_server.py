"""Finding a Redis to use, or starting a private one.

``conch serve`` and the tests need a broker on machines that may have none: use
``REDIS_URL`` when given, else a Redis answering on the local URL (``Settings.local_redis_url``,
``CONCH_LOCAL_REDIS_URL``, by default the default local port), else start ``redis-server``
on a free port in a private folder that goes away with it. The caller, which has the
Settings, passes both URLs in.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import redis

from conch.devtools.processes import wait_until


class RedisNotFound(RuntimeError):
    pass


@dataclass
class PrivateRedis:
    url: str
    process: subprocess.Popen
    folder: tempfile.TemporaryDirectory

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.folder.cleanup()


def answers(url: str, timeout: float = 0.5) -> bool:
    try:
        return bool(
            redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout).ping()
        )
    except (redis.RedisError, OSError):
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or next(
        (
            p
            for p in (
                "/usr/bin/redis-server",
                "/usr/sbin/redis-server",
                "/usr/local/bin/redis-server",
            )
            if os.path.exists(p)
        ),
        None,
    )
    if not found:
        raise RedisNotFound(
            "no Redis answers and redis-server is not installed: set REDIS_URL to a Redis you run, "
            "or install one (Debian/Ubuntu: apt-get install redis-server; `make serve` does this for you)"
        )
    return found


def start_private(port: int | None = None, *, unix_socket: bool = False) -> PrivateRedis:
    """A redis-server on loopback that keeps nothing on disk.

    With ``unix_socket`` it listens only on a Unix socket in its private folder, which
    only this user may open (mode 700), and on no TCP port: it has no password, and any
    user of the host could reach a loopback port. Processes on this host also skip the
    TCP stack on every round trip.
    """
    binary = redis_server_binary()
    port = 0 if unix_socket else port or free_port()
    folder = tempfile.TemporaryDirectory(prefix="conch-redis-")
    log = Path(folder.name) / "redis.log"
    sock = Path(folder.name) / "redis.sock"
    unix = ["--unixsocket", str(sock), "--unixsocketperm", "700"] if unix_socket else []
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            folder.name,
            "--logfile",
            str(log),
            "--daemonize",
            "no",
            *unix,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"unix://{sock}?db=0" if unix_socket else f"redis://127.0.0.1:{port}/0"
    wait_answering(proc, url, log)
    return PrivateRedis(url, proc, folder)


def wait_answering(proc: subprocess.Popen, url: str, log: Path, timeout: float = 15) -> None:
    """Wait until the redis-server ``proc`` answers at ``url`` (its dataset loaded)."""

    def watch() -> None:
        if proc.poll() is not None:
            raise RuntimeError(
                f"redis-server exited with {proc.returncode}: {log.read_text() if log.exists() else ''}"
            )

    if not wait_until(lambda: answers(url, 0.2), timeout, watch=watch, every=0.05):
        proc.kill()
        raise RuntimeError(f"redis-server did not answer within {timeout:.0f} s")


def resolve(
    url: str | None, local_url: str, *, unix_socket: bool = False
) -> tuple[str, PrivateRedis | None]:
    """The Redis to use: ``url`` if given, else ``local_url`` if a Redis answers there,
    else a private one (the second item: stop it when done), on a Unix socket if asked."""
    if url:
        if not answers(url, 2.0):
            raise RedisNotFound(f"no Redis answers at {url} (REDIS_URL / --redis-url)")
        return url, None
    if answers(local_url):
        return local_url, None
    private = start_private(unix_socket=unix_socket)
    return private.url, private
