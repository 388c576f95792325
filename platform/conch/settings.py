"""Runtime settings shared by the gateway, the worker and ``conch serve``.

Flags win over environment variables (``CONCH_*``, and ``REDIS_URL``), which win over
the defaults here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class ModelControlMode(StrEnum):
    """Triton's ``--model-control-mode``: which models a server serves, and when it looks again.

    none: every model at start, never again; poll: follow the repository as it changes;
    explicit: only what ``--load-model`` and the load/unload API ask for.
    """

    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"

    @property
    def explicit(self) -> bool:
        """Models are loaded and unloaded through the API (and ``--load-model``)."""
        return self is ModelControlMode.EXPLICIT

    @property
    def polls(self) -> bool:
        """The repository is rescanned and followed as it changes."""
        return self is ModelControlMode.POLL

    @property
    def follows_changes(self) -> bool:
        """Anything after start can change what is served (poll or explicit)."""
        return self is not ModelControlMode.NONE


@dataclass
class Settings:
    model_repository: Path = Path("functions")
    redis_url: str = field(default_factory=lambda: os.environ.get("REDIS_URL", ""))
    # Requests with no "timeout" parameter wait this long for their reply.
    request_timeout_s: float = field(
        default_factory=lambda: _env_float("CONCH_REQUEST_TIMEOUT_S", 60.0)
    )
    # Triton's --http-max-input-size default: 64 MiB.
    max_input_bytes: int = field(
        default_factory=lambda: _env_int("CONCH_MAX_INPUT_BYTES", 64 * 1024 * 1024)
    )
    # A message a dead worker held comes back after this long (kombu's default is an hour).
    visibility_timeout_s: float = field(
        default_factory=lambda: _env_float("CONCH_VISIBILITY_TIMEOUT_S", 6.0)
    )
    max_attempts: int = field(default_factory=lambda: _env_int("CONCH_MAX_ATTEMPTS", 3))
    # How long an async job's result (and its record) is kept: Celery's result_expires.
    job_ttl_s: int = field(default_factory=lambda: _env_int("CONCH_JOB_TTL_S", 86_400))
    # Async jobs a model's queue may hold before submissions get a 503 (Redis memory).
    max_queued_jobs: int = field(default_factory=lambda: _env_int("CONCH_MAX_QUEUED_JOBS", 100_000))
    auto_complete: bool = True
    default_max_batch_size: int = 4
    models: list[str] | None = None  # the worker serves these; None = all
    # Triton's model control: none (load all at start), poll (follow the repository),
    # explicit (load and unload through the API; --load-model at start).
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    repository_poll_secs: float = 15.0
    load_models: list[str] = field(default_factory=list)
    log_verbose: int = 0
    # Triton's metrics port: GET /metrics there, with Triton's nv_inference_* names.
    allow_metrics: bool = True
    metrics_port: int = 8002


GEVENT_WORKER = "conch.frontend.http.gevent_worker.GatewayWorker"


def gateway_worker_class() -> str:
    """gunicorn worker class of the gateway (``CONCH_HTTP_WORKER_CLASS``, e.g. gthread)."""
    return os.environ.get("CONCH_HTTP_WORKER_CLASS", GEVENT_WORKER)


def gateway_uses_gevent() -> bool:
    return "gevent" in gateway_worker_class() or gateway_worker_class() == GEVENT_WORKER
