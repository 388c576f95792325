"""What the gRPC modules share: a worker serving Triton's ``add`` example."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import fresh_db, start_worker
from models import add_model


@pytest.fixture(scope="module")
def backend(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[tuple[Path, str]]:
    """(a repository with ``add``, the Redis URL of a worker serving it)."""
    repo = tmp_path_factory.mktemp("grpc-add") / "models"
    add_model(repo / "add")
    db = fresh_db(redis_url, 15)
    worker = start_worker(repo, db, log_dir, "--models", "add")
    try:
        yield repo, db
    finally:
        worker.stop()
