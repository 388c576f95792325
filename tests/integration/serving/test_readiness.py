"""/v2/health/ready as Triton's --strict-readiness has it: ready when the broker answers
and every model that should be loaded is served by a live worker; with
--strict-readiness=false, as soon as the broker answers."""

from __future__ import annotations

from pathlib import Path

import requests

from harness import Service, fresh_db, start_gateway, start_worker, wait_model_ready, wait_until
from models import add_model, offset_model


def _ready(url: str) -> int:
    """The status of /v2/health/ready: 200 ready, 400 not (Triton's, with no body)."""
    return requests.get(f"http://{url}/v2/health/ready", timeout=30).status_code


def _becomes(url: str, status: int, *services: Service) -> None:
    wait_until(lambda: _ready(url) == status, 60, f"/v2/health/ready to be {status}", *services)


def test_ready_when_every_model_is_served(tmp_path: Path, redis_url: str, log_dir: Path) -> None:
    repo = tmp_path / "models"
    add_model(repo / "add")
    offset_model(repo / "offset", 1, 1.0)
    offset_model(repo / "offset", 2, 2.0)
    (repo / "offset" / "config.pbtxt").write_text(
        (repo / "offset" / "config.pbtxt").read_text() + "version_policy { all { } }\n"
    )
    db = fresh_db(redis_url, 13)
    strict, url = start_gateway(repo, db, log_dir)
    lax, lax_url = start_gateway(repo, db, log_dir, "--strict-readiness=false")
    services = [strict, lax]
    try:
        assert _ready(url) == 400  # no worker serves anything yet
        assert _ready(lax_url) == 200  # the broker answers: enough without strictness
        services.append(start_worker(repo, db, log_dir, "--models", "add"))
        wait_model_ready(url, "add", 90, *services)
        assert _ready(url) == 400  # 'offset' has no worker yet
        services.append(start_worker(repo, db, log_dir, "--models", "offset"))
        _becomes(url, 200, *services)  # both versions of 'offset' too
        # A worker that goes away takes its models' readiness with it.
        services.pop().stop()
        _becomes(url, 400, *services)
        assert _ready(lax_url) == 200
    finally:
        for s in reversed(services):
            s.stop()


def test_only_the_models_that_should_be_loaded_count(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    """Explicit mode: the models loaded at start or through the API count; an unloaded
    one, or one never asked for (even a broken one), does not. A model that is asked for
    and cannot be served keeps the server not ready, as in Triton."""
    repo = tmp_path / "models"
    add_model(repo / "add")
    offset_model(repo / "offset", 1, 1.0)
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text("max_batch_size: [ oops\n")
    db = fresh_db(redis_url, 14)
    flags = ("--model-control-mode", "explicit", "--load-model", "add")
    gateway, url = start_gateway(repo, db, log_dir, *flags)
    services = [gateway]
    try:
        assert _ready(url) == 400  # 'add' is to be loaded at start, and no worker has it
        services.append(start_worker(repo, db, log_dir, *flags))
        _becomes(url, 200, *services)  # 'broken' and 'offset' were never asked for
        requests.post(f"http://{url}/v2/repository/models/offset/load", timeout=60)
        _becomes(url, 200, *services)
        r = requests.post(f"http://{url}/v2/repository/models/broken/load", timeout=60)
        assert r.status_code == 400, r.text
        assert _ready(url) == 400  # asked for and broken
        requests.post(f"http://{url}/v2/repository/models/broken/unload", timeout=60)
        _becomes(url, 200, *services)  # unloaded is fine
    finally:
        for s in reversed(services):
            s.stop()
