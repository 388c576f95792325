"""The job drivers' Celery tasks, which a worker process hosts: batch jobs, and the async
jobs of ensembles. Producer-role code (the drivers send their work to the model queues as
a gateway would), registered on the worker's Celery app by its composition root, so the
worker room itself names one frontend module for its jobs."""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore

from conch.core import tracing
from conch.core.errors import ConchError
from conch.core.repository import ModelRepository
from conch.frontend import bls
from conch.frontend.jobs import batch_job, ensemble_job
from conch.settings import Settings


def register(
    app: Celery, settings: Settings, client: redis.Redis, repository: ModelRepository
) -> None:
    """Register both tasks on ``app``; ``repository`` is the worker's own view."""
    # Ensembles' jobs run their graphs here, as BLS runs one: steps on the model queues.
    graph = bls.BlsClient(settings, repository, client=client).graph_runner()

    # A job's own errors (a bad input object, an unwritable output, a model gone) are
    # the client's to read in the job's state; Celery logs them without a traceback.
    @app.task(name=batch_job.TASK_NAME, throws=(ConchError,))
    def run_batch_job(payload: dict[str, Any]) -> dict[str, Any]:
        # One trace per job (sampled as a request is): its lines' spans are its children.
        job_id = str(payload.get("id", "")) if isinstance(payload, dict) else ""
        try:
            with tracing.span("batch_job", job_id=job_id):
                return batch_job.run_task(settings, client, repository, payload, graph)
        except batch_job.JobCancelled:
            raise Ignore() from None  # Celery keeps the REVOKED state run_task wrote

    # An ensemble's async job writes its result as a model's job does (job_store): Celery
    # keeps no state of its own for it, so nothing it writes overwrites that result.
    @app.task(name=ensemble_job.TASK_NAME, ignore_result=True, track_started=False)
    def run_ensemble_job(payload: dict[str, Any]) -> None:
        ensemble_job.run_task(settings, client, graph, payload)
