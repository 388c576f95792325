"""Shared fixtures: a private redis-server and a moto S3 server per test session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import redis

from conch.devtools.redis_server import free_port, start_private


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    server = start_private()
    yield server.url
    server.stop()


@pytest.fixture()
def rclient(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from models import build_repository

    return build_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server process on a free loopback port, and dummy AWS settings for boto3."""
    saved = dict(os.environ)
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp_path_factory.mktemp("aws") / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path_factory.mktemp("aws") / "none"),
    )
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(var, None)
    port = free_port()
    log_file = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"moto server did not start: {log_file.read_text()}"
                    ) from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def s3(s3_endpoint: str):
    return boto3.client("s3", endpoint_url=s3_endpoint)
