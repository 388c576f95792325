"""The data plane: every operation of Triton's v2 protocol, on protocol-neutral types.

A frontend is an adapter over it: it decodes its protocol into these calls and their
arguments (``core.inference.InferRequest`` for an infer call), and encodes what comes
back. The HTTP frontend (``frontend.http``) is one; the gRPC frontend (``frontend.grpc``)
another, with no second copy of the checks, the dispatch or the job handling. Nothing here
knows bytes on a wire, headers or a web framework, and frontends never reach Redis
themselves: the model view, the dispatcher and the job store are reached through here.

``DataPlane`` is the one façade the frontends (and ``conch.Server``, connected) hold;
each concern has a module of its own, which it hands its calls to:

- inference (``target``, ``infer``, ``infer_stream``): ``frontend.inference``;
- async and batch jobs: ``frontend.job_plane``;
- statistics, metrics, the work owed and the workers' reports: ``frontend.monitoring``;
- the model repository (index, load, unload): ``frontend.repository_api``;
- the logging and trace extensions: ``frontend.live_settings``;
- traffic splits: ``frontend.traffic``.

Health and metadata are answered here. Errors are ``ConchError``s, which carry Triton's
status; each adapter maps them to its protocol once. A Redis outage is one too: every
operation raises ``BrokerUnavailable`` (503, ``Retry-After``) for it
(``outage.translate_outages``), never a Redis error.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Unpack

from conch.core.inference import InferRequest
from conch.frontend import calls
from conch.frontend.inference import (
    CallOptions,
    Inference,
    InferOutcome,
    InferStream,
    StreamOptions,
)
from conch.frontend.job_plane import MAX_JOB_WAIT_S, CollectedOutcome, JobPlane, JobState
from conch.frontend.live_settings import LiveSettings
from conch.frontend.model_view import ModelView
from conch.frontend.monitoring import ModelMetrics, Monitoring
from conch.frontend.producer import Dispatcher
from conch.frontend.repository_api import RepositoryApi
from conch.frontend.response_cache import ResponseCache
from conch.frontend.sequence_route import SequenceRoute
from conch.frontend.shared_memory import SharedMemory
from conch.frontend.traffic import Traffic
from conch.settings import Settings
from conch.version import __version__
from conch.wire import broker, outage
from conch.wire.messages import InferMessage, WireTensor
from conch.wire.work_owed import JobsWork, ModelWork

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig
    from conch.core.repository import ModelEntry

log = logging.getLogger(__name__)

# What GET /v2 lists, in Triton's order; conch's own last.
EXTENSIONS = [
    "classification",
    "model_repository",  # the index; load and unload in explicit mode, as in Triton
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "logging",  # GET/POST v2/logging, applied to every process (wire.log_control)
    "trace",  # GET/POST v2[/models/<m>]/trace/setting, every process (wire.trace_control)
    "async_jobs",  # conch's own: /v2/models/<m>/jobs and /v2/jobs/<id> (http.job_routes)
]
FOLLOWER_STOP_S = 2.0  # a follower notices its stop within its one-second poll


@outage.translate_outages
class DataPlane:
    """Triton's v2 operations, for any frontend (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        view: ModelView,
        dispatcher: Dispatcher,
        cache: ResponseCache | None = None,
    ) -> None:
        self.settings = settings
        self.view = view
        self.dispatcher = dispatcher
        self.cache = cache  # --cache-config's; None: no model is cached
        self._client = client = dispatcher.client
        self.sequences = SequenceRoute(client)  # sequence models' mailboxes
        self.traffic = Traffic(settings, view, dispatcher)  # traffic splits across versions
        # --allow-client-shm: the regions clients register, read and written by the codecs.
        self.shared_memory = SharedMemory(client, settings.allow_client_shm)
        # What follows the process-wide settings APIs for this plane (``composition``),
        # stopped with it by ``close``.
        self.followers: list[threading.Thread] = []
        self.inference = Inference(settings, view, dispatcher, cache, self.sequences, self.traffic)
        self.jobs = JobPlane(settings, view, dispatcher, self.sequences, self.inference)
        self.monitoring = Monitoring(settings, view, client, cache, self.sequences)
        self.repository = RepositoryApi(settings, view, client)
        self.live_settings = LiveSettings(view, client)

    # -- health and metadata -----------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready to take requests: the broker answers (``BrokerUnavailable``, a 503, if
        not) and, with --strict-readiness (the default, as in Triton), every model that
        should be loaded is served."""
        self._client.ping()
        if not self.settings.strict_readiness:
            return True
        why = self.view.not_served()
        if why:
            log.debug("not ready: %s", why)
        return why is None

    def close(self) -> None:
        """Stop following the repository and let go of Redis: a data plane inside an
        application (``conch.Server``, connected) ends with it; a frontend process never
        calls this, it just exits. Replies still awaited fail as an outage would."""
        self.view.stop_following()
        for follower in self.followers:
            follower.stop()
        for follower in self.followers:
            follower.join(FOLLOWER_STOP_S)
        self.dispatcher.close()
        self._client.close()

    def server_metadata(self) -> dict[str, Any]:
        extensions = EXTENSIONS + (["system_shared_memory"] if self.shared_memory.enabled else [])
        return {"name": "conch", "version": __version__, "extensions": extensions}

    def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        entry = self.view.serving(model)
        return entry.metadata(entry.resolve_version(version) if version else None)

    def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        entry = self.view.serving(model)
        entry.resolve_version(version)
        return entry.to_json()

    def model_ready(self, model: str, version: str = "") -> bool:
        entry = self.view.serving(model)
        return self.view.version_ready(model, entry.resolve_version(version))

    # -- monitoring (``frontend.monitoring``) ------------------------------------------

    def statistics(self, model: str | None = None, version: str = "") -> list[dict[str, Any]]:
        return self.monitoring.statistics(model, version)

    def metrics(self) -> list[ModelMetrics]:
        return self.monitoring.metrics()

    def queue_depth(self, models: list[str]) -> dict[str, ModelWork]:
        return self.monitoring.queue_depth(models)

    def jobs_depth(self) -> JobsWork:
        return self.monitoring.jobs_depth()

    def residency(self) -> dict[str, dict[str, list[str]]]:
        return self.monitoring.residency()

    def hosts(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        return self.monitoring.hosts()

    def custom_metrics(self) -> list[dict[str, Any]]:
        return self.monitoring.custom_metrics()

    def process_instances(self) -> list[dict[str, Any]]:
        return self.monitoring.process_instances()

    # -- logging and tracing (``frontend.live_settings``) ------------------------------

    def log_settings(self) -> dict[str, Any]:
        return self.live_settings.log_settings()

    def update_log_settings(self, changes: Any) -> dict[str, Any]:
        return self.live_settings.update_log_settings(changes)

    def trace_settings(self, model: str = "") -> dict[str, Any]:
        return self.live_settings.trace_settings(model)

    def update_trace_settings(self, changes: Any, model: str = "") -> dict[str, Any]:
        return self.live_settings.update_trace_settings(changes, model)

    # -- the model repository (``frontend.repository_api``) ----------------------------

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.repository.index(ready_only)

    def load(self, model: str, *, config: str | None = None, files: dict[str, bytes]) -> None:
        self.repository.load(model, config=config, files=files)

    def unload(self, model: str, *, unload_dependents: bool = False) -> None:
        self.repository.unload(model, unload_dependents=unload_dependents)

    # -- traffic splits (``frontend.traffic``) -----------------------------------------

    def traffic_split(self, model: str) -> dict[str, Any]:
        """The model's traffic split across its versions; read and cleared for any model
        the repository holds, loaded or not."""
        return self.traffic.read(self.view.entry(model))

    def set_traffic_split(self, model: str, split: Any) -> dict[str, Any]:
        """Set it for every process (checked against the versions ready now); an empty
        one clears it. The split that follows."""
        return self.traffic.set(self.view.serving(model), split)

    def clear_traffic_split(self, model: str) -> dict[str, Any]:
        return self.traffic.clear(self.view.entry(model))

    # -- inference (``frontend.inference``) --------------------------------------------

    def target(self, model: str, version: str = "", *, endpoint: str = "") -> calls.Target:
        return self.inference.target(model, version, endpoint=endpoint)

    def infer(
        self, to: calls.Target, request: InferRequest, **options: Unpack[CallOptions]
    ) -> InferOutcome:
        return self.inference.infer(to, request, **options)

    def infer_stream(
        self, to: calls.Target, request: InferRequest, **options: Unpack[StreamOptions]
    ) -> InferStream:
        return self.inference.infer_stream(to, request, **options)

    def outcome(
        self, entry: ModelEntry, request: InferRequest, version: int, results: list[WireTensor]
    ) -> InferOutcome:
        return self.inference.outcome(entry, request, version, results)

    def _bundling(self, config: ModelConfig, msg: InferMessage) -> broker.Bundling | None:
        return self.inference.bundling(config, msg)

    # -- async and batch jobs (``frontend.job_plane``) ---------------------------------

    def submit_job(
        self, to: calls.Target, request: InferRequest, traceparent: str = ""
    ) -> JobState:
        return self.jobs.submit_job(to, request, traceparent)

    def submit_batch(self, model: str, version: str, source: Any, target: Any) -> JobState:
        return self.jobs.submit_batch(model, version, source, target)

    def job_status(self, job_id: str) -> JobState:
        return self.jobs.job_status(job_id)

    def cancel_job(self, job_id: str) -> JobState:
        return self.jobs.cancel_job(job_id)

    def job_result(
        self, job_id: str, wait_s: float = 0.0
    ) -> tuple[JobState, InferOutcome | CollectedOutcome | None]:
        return self.jobs.job_result(job_id, wait_s)


__all__ = [
    "EXTENSIONS",
    "MAX_JOB_WAIT_S",
    "CollectedOutcome",
    "DataPlane",
    "InferOutcome",
    "InferStream",
    "JobState",
    "ModelMetrics",
]
