"""Shared fixtures: a private redis-server per test session, and a stack per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from conch.redis_server import start_private


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
