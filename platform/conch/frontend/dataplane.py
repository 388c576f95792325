"""The data plane: every operation of Triton's v2 protocol, on protocol-neutral types.

A frontend is an adapter over it: it decodes its protocol into these calls and their
arguments (``core.inference.InferRequest`` for an infer call), and encodes what comes
back. The HTTP frontend (``frontend.http``) is one; a gRPC frontend would be another,
with no second copy of the checks, the dispatch or the job handling. Nothing here
knows bytes on a wire, headers or a web framework, and frontends never reach Redis
themselves: the model view, the dispatcher and the job store are reached through here.

Errors are ``ConchError``s, which carry Triton's status; each adapter maps them to its
protocol once. A Redis outage is one too: every operation raises ``BrokerUnavailable``
(503, ``Retry-After``) for it (``outage.translate_outages``), never a Redis error.

An infer call is two calls, ``target`` then ``infer``, so that an adapter can ask about
the model and version before it decodes the request: a call to an unknown model says
so whatever its body holds, as Triton answers.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers a request
with any number of responses: ``infer_stream`` hands them out as they come
(``InferStream``), for the adapters that can send many (gRPC's ``ModelStreamInfer``).
An adapter that answers once names itself to ``target`` (``endpoint``), which refuses
such a model in Triton's words.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conch import server_log
from conch.core import (
    custom_metrics,
    ensemble_graph,
    timeline,
    trace_config,
    tracing,
    validation,
)
from conch.core.errors import (
    ConchError,
    Forbidden,
    InvalidArgument,
    NotFound,
    Unavailable,
    Unsupported,
)
from conch.core.inference import InferRequest, OutputTensor, RequestedOutput
from conch.core.repository import ModelEntry
from conch.core.repository_keys import model_name_problem
from conch.core.request_scope import RequestTag, about
from conch.frontend import calls, ensemble_runner, model_control
from conch.frontend.jobs import batch_job, ensemble_job
from conch.frontend.model_view import ModelView
from conch.frontend.producer import Abandonment, Dispatcher, ResponseStream
from conch.frontend.response_cache import ResponseCache
from conch.frontend.sequence_route import SequenceRoute
from conch.frontend.shared_memory import SharedMemory
from conch.frontend.traffic import Traffic
from conch.settings import Settings
from conch.version import __version__
from conch.wire import (
    broker,
    job_store,
    log_control,
    model_metrics,
    outage,
    sequences,
    statistics,
    stream_log,
    trace_control,
    worker_reports,
)
from conch.wire.messages import InferMessage, WireTensor
from conch.wire.work_owed import JobsWork, ModelWork, jobs_owed, work_owed

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

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
MAX_JOB_WAIT_S = 60.0  # the longest a job result call may be held waiting (long polling)
_CONTROL_STATES_MAX_AGE_S = 0.05  # how stale worker states may be while a load waits
FOLLOWER_STOP_S = 2.0  # a follower notices its stop within its one-second poll


@dataclass
class InferOutcome:
    """An answered infer call: what an adapter encodes into its response."""

    model: str
    version: int  # the version that ran
    request: InferRequest  # what was asked: id, outputs wanted (binary, classification)
    outputs: list[OutputTensor]  # raw tensors, with the datatypes the config declares
    labels: dict[str, list[str]] | None  # class labels by output, when classes were asked
    batched: bool  # the first dimension is the batch (classification ranks per row)
    final: bool = True  # the request's last response (a decoupled model sends many)
    # A decoupled model's response that begins a new run of its request (its worker died):
    # the responses before it belong to the run that was lost (``producer``).
    restarted: bool = False

    @property
    def flag_only(self) -> bool:
        """A decoupled model's last response that only says it is done, with no outputs
        (Triton's empty final response, which an adapter may leave unsent)."""
        return self.final and not self.outputs


@dataclass
class CollectedOutcome:
    """A decoupled model's async job, answered: each of its responses as an
    ``InferOutcome``, in order (none when the model sent only its final flag)."""

    model: str
    version: int
    request_id: str
    responses: list[InferOutcome]


class InferStream:
    """A request's responses, each an ``InferOutcome`` as it comes (``DataPlane.
    infer_stream``), the last one ``final``. Iteration raises what ends the request
    early: a reply's error, the deadline (``Unavailable``), an outage, the caller gone
    (``Cancelled``). Iterate to the end or ``close()``: either forgets the request, and
    the replies still to come are dropped."""

    def __init__(
        self,
        plane: DataPlane,
        to: calls.Target,
        request: InferRequest,
        call: calls.Call,
        replies: ResponseStream,
        abandonment: Abandonment | None,
    ) -> None:
        self._plane = plane
        self._to = to
        self._request = request
        self._call = call
        self._replies = replies
        self._abandonment = abandonment
        self.position = stream_log.HEAD  # of the last response handed out

    @property
    def message_id(self) -> str:
        """The request's message id: its stream's id, when it is kept."""
        return self._call.msg.id

    @property
    def kept(self) -> bool:
        """Whether its responses are kept for a client that reconnects."""
        return self._call.msg.keep_s > 0

    def __iter__(self) -> InferStream:
        return self

    def __next__(self) -> InferOutcome:
        try:
            reply = next(self._replies)
        except BaseException:
            self.close()
            raise
        if reply.final:
            self.close()
        version = reply.version if reply.version > 0 else self._call.version
        request = self._request.narrowed(name for name, *_ in reply.outputs or ())
        outcome = self._plane.outcome(self._to.entry, request, version, list(reply.outputs or ()))
        outcome.final = reply.final
        outcome.restarted = reply.restarted
        self.position = stream_log.of(reply)
        return outcome

    def close(self) -> None:
        self._replies.cancel()
        if self._abandonment is not None:
            self._abandonment.done(self._replies)


@dataclass
class JobState:
    """An async or batch job's record and where it stands."""

    record: job_store.JobRecord
    outcome: job_store.Outcome

    @property
    def done(self) -> bool:
        return self.outcome.status not in (job_store.PENDING, job_store.STARTED)


@dataclass
class ModelMetrics:
    """One model's counters and queue, for the metrics endpoint."""

    name: str
    counters: dict[int, dict[str, int]]  # version -> statistics counters
    ready: list[int]  # versions a live worker reports READY
    work: ModelWork | None  # waiting in its queue and in flight; None: an ensemble's
    cached: bool = False  # the frontends keep a response cache and the model uses it
    # version -> phase -> recent latencies (us), for the summaries; None: summaries off
    samples: dict[int, dict[str, list[int]]] | None = None
    own: dict[str, int] = field(default_factory=dict)  # the model's own counters (loads, ...)
    sequence_model: bool = False  # it has sequence_batching (its live sequences count)
    # A sequence model's requests waiting in its sequences' mailboxes, not yet running
    # (its queue, ``work``, holds none).
    sequence_waiting: int = 0

    @property
    def failures(self) -> dict[int, dict[str, int]]:
        """version -> failed requests by Triton's reason (REJECTED, CANCELED, ...)."""
        return {v: statistics.failures_by_reason(c) for v, c in self.counters.items()}


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
        self._client = dispatcher.client
        self.sequences = SequenceRoute(self._client)  # sequence models' mailboxes
        self.traffic = Traffic(settings, view, dispatcher)  # traffic splits across versions
        # --allow-client-shm: the regions clients register, read and written by the codecs.
        self.shared_memory = SharedMemory(self._client, settings.allow_client_shm)
        # What follows the process-wide settings APIs for this plane (``composition``),
        # stopped with it by ``close``.
        self.followers: list[threading.Thread] = []

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

    def statistics(self, model: str | None = None, version: str = "") -> list[dict[str, Any]]:
        """Triton's statistics extension: every loaded model, one model, or one version."""
        view = self.view
        if model is None:
            wanted = {
                name: list(entry.versions)
                for name, entry in sorted(view.entries.items())
                if view.is_loaded(name) and entry.config is not None and not entry.error
            }
        else:
            entry = view.serving(model)
            wanted = {model: [entry.resolve_version(version)] if version else entry.versions}
        if self.cache is not None:
            self.cache.flush()  # this process's cache counters, before they are read
        out = []
        for name, versions in wanted.items():
            counters = statistics.read(self._client, name)
            out.extend(statistics.model_stats(name, v, counters.get(v, {})) for v in versions)
        return out

    def metrics(self) -> list[ModelMetrics]:
        """Every loaded model's counters (summed over all workers, ever) and work owed."""
        view = self.view
        states = view.states()
        served = [
            (name, entry)
            for name, entry in sorted(view.entries.items())
            if entry.config is not None and not entry.error and view.is_loaded(name)
        ]
        work = work_owed(
            self._client, [n for n, e in served if e.backend != ensemble_graph.ENSEMBLE]
        )
        if self.cache is not None:
            self.cache.flush()
        summaries = self.settings.metrics_config.summary_latencies
        since_ms = int((time.time() - statistics.SAMPLES_WINDOW_S) * 1000)
        out = []
        for name, entry in served:
            recorded, own = statistics.read_all(self._client, name)
            queued = entry.backend != ensemble_graph.ENSEMBLE
            versions = states.get(name, {}).get("versions", {})
            sequential = self.sequences.spec(entry.config) is not None
            out.append(
                ModelMetrics(
                    name,
                    {v: recorded.get(v, {}) for v in sorted({*entry.versions, *recorded})},
                    [int(v) for v, st in versions.items() if st == worker_reports.READY],
                    work.get(name),
                    self.cache is not None and self.cache.applies(entry.config),
                    statistics.read_samples(self._client, name, since_ms)
                    if summaries and queued
                    else None,
                    own,
                    sequence_model=sequential,
                    sequence_waiting=sequences.pending_requests(self._client, name)
                    if sequential
                    else 0,
                )
            )
        return out

    def queue_depth(self, models: list[str]) -> dict[str, ModelWork]:
        """The work owed to the workers of each model named (``conch.wire.work_owed``);
        none named: every model the repository holds but ensembles, which have no queue.

        A name the repository does not hold is a 404, not zeros: a scaler pointed at a
        misspelled model says so instead of keeping its workers at zero for good.
        """
        entries = self.view.entries
        if not models:
            models = [n for n, e in sorted(entries.items()) if e.backend != ensemble_graph.ENSEMBLE]
        for name in models:
            problem = model_name_problem(name)
            if problem:
                raise InvalidArgument(f"'{name}' is not a model name: {problem}")
            if name not in entries:
                raise NotFound(f"Request for unknown model: '{name}' is not found")
        return work_owed(self._client, models)

    def jobs_depth(self) -> JobsWork:
        """The work the batch jobs queue owes (``conch.wire.work_owed.jobs_owed``)."""
        return jobs_owed(self._client)

    def residency(self) -> dict[str, dict[str, list[str]]]:
        """Where each model is resident, or on standby (``worker_reports.residency``)."""
        return worker_reports.residency(worker_reports.snapshot(self._client))

    def hosts(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """The live workers' hosts: CPU use per host and GPU use per GPU UUID
        (``worker_reports.hosts``)."""
        return worker_reports.hosts(worker_reports.snapshot(self._client))

    def custom_metrics(self) -> list[dict[str, Any]]:
        """The metric families models defined (``pb_utils.MetricFamily``), each metric
        summed over the live workers that have it (``conch.core.custom_metrics.merge``)."""
        sources = worker_reports.metrics_sources(worker_reports.snapshot(self._client))
        return custom_metrics.merge(model_metrics.read(self._client, sources))

    def process_instances(self) -> list[dict[str, Any]]:
        """The live workers' process instances and their memory
        (``worker_reports.process_instances``)."""
        return worker_reports.process_instances(worker_reports.snapshot(self._client))

    # -- logging -----------------------------------------------------------------------

    def log_settings(self) -> dict[str, Any]:
        """Triton's logging extension: this process's log settings."""
        return server_log.current().to_json()

    def update_log_settings(self, changes: Any) -> dict[str, Any]:
        """Change the log settings of every process (``conch.wire.log_control``); the
        settings that follow here. A wrong value changes nothing anywhere (a 400)."""
        try:
            server_log.current().updated(changes)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        # The log file is each process's own: only an unchanged one gets through the check.
        log_control.publish(self._client, {k: v for k, v in changes.items() if k != "log_file"})
        return server_log.update(changes).to_json()

    # -- tracing -----------------------------------------------------------------------

    def trace_settings(self, model: str = "") -> dict[str, Any]:
        """Triton's trace extension: the settings for ``model`` ("": for every model)."""
        if model:
            self.view.serving(model)  # 404 for a model not served
        return trace_config.to_json(tracing.sampler().configured(model))

    def update_trace_settings(self, changes: Any, model: str = "") -> dict[str, Any]:
        """Change sampling in every process (``conch.wire.trace_control``); the settings
        that follow here. A ``null`` value sends a model's setting back to the one for
        every model (that one, back to the flag's). A wrong value changes nothing."""
        self.trace_settings(model)  # the model's 404 first
        try:
            config = trace_config.updated(tracing.sampler().configured(model), changes)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if config.on and not config.mode:
            raise InvalidArgument(
                "tracing was not set up at start: give --trace-config mode=opentelemetry "
                "(and the collector's opentelemetry,url=...) to every process"
            )
        scoped = {
            f"{model}/{k}" if model else k: v
            for k, v in changes.items()
            if k not in ("trace_mode", "log_frequency")
        }
        if scoped:
            tracing.apply(scoped)
            trace_control.TRACING.publish(self._client, scoped)
        return self.trace_settings(model)

    # -- the model repository ----------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.view.index(ready_only)

    def load(self, model: str, *, config: str | None = None, files: dict[str, bytes]) -> None:
        """Explicit model control: load ``model`` everywhere (``model_control.load``).

        ``files`` (``file:`` parameters) are code and weights a worker will run, from
        whoever can reach the API: refused unless ``--allow-model-upload`` is on. (A
        Python model's ``pb_utils.load_model`` does not come through here: that code
        is the repository's, trusted already.)
        """
        if files and not self.settings.allow_model_upload:
            raise Forbidden(
                f"failed to load '{model}': model file uploads ('file:' parameters) are "
                "disabled; start conch with --allow-model-upload to allow them"
            )
        model_control.load(
            self._client,
            self.settings,
            model,
            config=config,
            files=files,
            states=lambda: self.view.states(max_age=_CONTROL_STATES_MAX_AGE_S),
            refresh=self.view.refresh,
        )

    def unload(self, model: str, *, unload_dependents: bool = False) -> None:
        model_control.unload(
            self._client,
            self.settings,
            model,
            unload_dependents=unload_dependents,
            states=lambda: self.view.states(max_age=_CONTROL_STATES_MAX_AGE_S),
            refresh=self.view.refresh,
        )

    def traffic_split(self, model: str) -> dict[str, Any]:
        """The model's traffic split across its versions (``conch.frontend.traffic``);
        read and cleared for any model the repository holds, loaded or not."""
        return self.traffic.read(self.view.entry(model))

    def set_traffic_split(self, model: str, split: Any) -> dict[str, Any]:
        """Set it for every process (checked against the versions ready now); an empty
        one clears it. The split that follows."""
        return self.traffic.set(self.view.serving(model), split)

    def clear_traffic_split(self, model: str) -> dict[str, Any]:
        return self.traffic.clear(self.view.entry(model))

    # -- inference ---------------------------------------------------------------------

    def target(self, model: str, version: str = "", *, endpoint: str = "") -> calls.Target:
        """The model and version a call names ("" = the latest): every error about them.

        ``endpoint`` names an adapter's call that answers once (Triton's name for it:
        "HTTP end point", "ModelInfer RPC"): it refuses a decoupled model, as Triton does.
        No version named, for a model with a traffic split: a version drawn by its
        weights, and maybe a shadow (``conch.frontend.traffic``).
        """
        to = self.traffic.route(calls.target(self.view.serving(model), version))
        if endpoint and to.decoupled:
            raise _refuse_decoupled(endpoint)
        return to

    def infer(
        self,
        to: calls.Target,
        request: InferRequest,
        *,
        deadline: float = 0.0,
        abandonment: Abandonment | None = None,
        traceparent: str = "",
    ) -> InferOutcome:
        """Check ``request`` against its model, queue it (or run the ensemble's graph)
        and wait for the outputs.

        ``deadline`` (epoch seconds, 0: none) is the caller's own, such as a gRPC
        deadline: the request is never run past it, nor past its ``timeout``. Through
        ``abandonment`` the caller's transport may say it went away (a model's request
        still queued is then never run, nor is an ensemble's next step). A W3C
        ``traceparent`` from the client is continued by the call's ``infer`` span.
        A decoupled model is refused (``infer_stream`` is its call).
        """
        if to.decoupled:
            raise _refuse_decoupled("this endpoint")
        with tracing.span("infer", traceparent, model=to.entry.name, request_id=request.id) as span:
            return self._infer(to, request, deadline, abandonment, span)

    def infer_stream(
        self,
        to: calls.Target,
        request: InferRequest,
        *,
        deadline: float = 0.0,
        abandonment: Abandonment | None = None,
        traceparent: str = "",
        keep: bool = False,
    ) -> InferStream:
        """Check ``request``, queue it, and return its responses to iterate as they come:
        a decoupled model's many (``InferStream``), or any other model's one. The
        arguments are ``infer``'s; the ``deadline`` bounds the whole stream. The request
        is watched: it is cancelled when its caller goes away (``close`` before the end,
        or ``abandonment``). With ``keep`` (and ``--stream-keep-secs`` above 0) its
        responses are kept for a client that reconnects, and the caller gets
        ``--stream-grace-secs`` to come back before it is cancelled
        (``conch.wire.stream_log``).

        Every error about the request (a 4xx, a full queue) is raised here, before
        anything is queued; what ends it later is raised by the iteration. The response
        cache does not apply (Triton refuses it for decoupled models), and an ensemble
        is refused: conch does not stream an ensemble's steps.
        """
        entry = to.entry
        if entry.backend == ensemble_graph.ENSEMBLE:
            raise Unsupported(
                f"ensemble '{entry.name}' has a decoupled step: conch does not stream "
                "an ensemble's responses"
            )
        caller = calls.Caller(deadline=deadline) if deadline else calls.CLIENT
        with tracing.span("infer", traceparent, model=entry.name, request_id=request.id) as span:
            with about(RequestTag(request.id)):
                call = self._prepare(to, request, calls.Lane.ONLINE, caller)
            msg = call.msg
            msg.watched = True
            msg.keep_s = self.settings.stream_keep_s if keep else 0
            span.set_attribute("conch.id", msg.id)
            with about(RequestTag(request.id, msg.id, tracing.trace_id(msg.traceparent))):
                log.debug("infer stream: model '%s' version %s", entry.name, call.version)
                spec = self.sequences.spec(entry.config) if msg.sequence is not None else None
                replies = self.dispatcher.stream(
                    msg,
                    max_queue_size=call.max_queue_size,
                    version=call.version,
                    route=None if spec is None else self.sequences.route(spec),
                    grace_s=self.settings.stream_grace_s,
                )
        if abandonment is not None:
            abandonment.watch(replies)
        return InferStream(self, to, request, call, replies, abandonment)

    def _infer(
        self,
        to: calls.Target,
        request: InferRequest,
        deadline: float,
        abandonment: Abandonment | None,
        span: tracing.Span,
    ) -> InferOutcome:
        caller = calls.Caller(deadline=deadline) if deadline else calls.CLIENT
        with about(RequestTag(request.id)):
            call = self._prepare(to, request, calls.Lane.ONLINE, caller)
            self.traffic.shadow(to, request, call)  # a copy to the split's shadow, if any
        span.set_attribute("conch.id", call.msg.id)
        trace_id = tracing.trace_id(call.msg.traceparent)
        with about(RequestTag(request.id, call.msg.id, trace_id)):
            log.debug("infer: model '%s' version %s", to.entry.name, call.version)
            try:
                cache = self.cache
                if cache is not None and cache.applies(to.entry.config):
                    return self._infer_cached(cache, to, request, call, abandonment)
                version, results = self._run(to, request, call, abandonment)
                log.debug("infer: answered by version %s", version)
            except ConchError as exc:
                log.debug("infer: failed (%s): %s", exc.code, exc.message)
                raise
            return self.outcome(to.entry, request, version, results)

    def _run(
        self,
        to: calls.Target,
        request: InferRequest,
        call: calls.Call,
        abandonment: Abandonment | None,
    ) -> tuple[int, list[WireTensor]]:
        """Queue the call (or run the ensemble's graph): the version that ran, and the outputs."""
        entry, msg = to.entry, call.msg
        if entry.backend == ensemble_graph.ENSEMBLE:
            return call.version, self._run_ensemble(entry, request, msg, call.version, abandonment)
        spec = self.sequences.spec(entry.config) if msg.sequence is not None else None
        reply = self.dispatcher.call(
            msg,
            max_queue_size=call.max_queue_size,
            version=call.version,
            abandonment=abandonment,
            route=None if spec is None else self.sequences.route(spec),
            bundling=self._bundling(entry.config, msg) if spec is None else None,
        )
        if reply.error is not None:
            raise reply.error
        return reply.version if reply.version > 0 else call.version, list(reply.outputs or ())

    def _bundling(self, config: ModelConfig, msg: InferMessage) -> broker.Bundling | None:
        """Whether ``msg`` may share its message with others (``broker.Bundling``): an
        online request for a model that batches dynamically, which runs a batch's worth
        of requests on one instance anyway, and does not preserve ordering (its worker
        takes one ticket a message)."""
        if not self.settings.bundle_requests or msg.job_ttl or msg.priority >= broker.ONLINE_STEPS:
            return None
        if config.model_transaction_policy.decoupled:  # never: its replies are a stream's
            return None
        if config.max_batch_size <= 0 or not config.HasField("dynamic_batching"):
            return None
        if config.dynamic_batching.preserve_ordering:
            return None
        shape = msg.inputs[0][2] if msg.inputs else ()
        rows = max(1, shape[0]) if shape else 1
        nbytes = sum(len(raw) for *_, raw in msg.inputs)
        return broker.Bundling(rows, config.max_batch_size, nbytes)

    def _infer_cached(
        self,
        cache: ResponseCache,
        to: calls.Target,
        request: InferRequest,
        call: calls.Call,
        abandonment: Abandonment | None,
    ) -> InferOutcome:
        """``infer`` for a model that uses the response cache: a hit is answered here,
        never queued; a miss runs, and its answer is stored (``frontend.response_cache``)."""
        since = time.perf_counter_ns()
        msg = call.msg
        lookup = cache.lookup(to.entry.name, to.version, msg.inputs, msg.outputs, msg.params)
        if lookup.found is not None:
            version, results = lookup.found
            cache.hit(lookup, since)
        else:
            version, results = self._run(to, request, call, abandonment)
            cache.store_answer(lookup, version, results)
        return self.outcome(to.entry, request, version, results)

    def _prepare(
        self,
        to: calls.Target,
        request: InferRequest,
        lane: calls.Lane,
        caller: calls.Caller = calls.CLIENT,
    ) -> calls.Call:
        """Every 4xx about the request is raised here, before anything is queued."""
        entry = to.entry
        validation.validate_request(request, entry.config, model_name=entry.name)
        timeline.stamp("gateway.validated")
        spec = self.sequences.spec(entry.config)
        if spec is not None and lane is not calls.Lane.ONLINE:
            raise self.sequences.refuse_job(entry.name)
        self.view.check_available(entry.name)
        default_s = self.settings.request_timeout_s
        if entry.backend == ensemble_graph.ENSEMBLE:
            default_s += ensemble_runner.steps_hold_s(entry, self.view.serving)
        call = calls.build(to, request, lane=lane, caller=caller, default_timeout_s=default_s)
        rows = (
            request.inputs[0].shape[0] if entry.config.max_batch_size > 0 and request.inputs else 1
        )
        self.sequences.mark(spec, entry.name, request, rows, call.msg)
        return call

    def _run_ensemble(
        self,
        entry: ModelEntry,
        request: InferRequest,
        msg: InferMessage,
        version: int,
        abandonment: Abandonment | None = None,
    ) -> list[WireTensor]:
        """Run the graph here, each step on its model's queue."""
        inputs = {t.name: (t.datatype, tuple(t.shape), t.raw) for t in request.inputs}
        produced = ensemble_runner.execute_counted(
            self._client,
            entry,
            inputs,
            msg,
            version,
            resolve=self.view.serving,
            dispatcher=self.dispatcher,
            check=self.view.check_available,
            abandonment=abandonment,
            cache=self.cache,
        )
        return [(name, *produced[name]) for name in msg.outputs]

    def outcome(
        self, entry: ModelEntry, request: InferRequest, version: int, results: list[WireTensor]
    ) -> InferOutcome:
        """A reply's tensors as the answer to ``request``, typed as the config says."""
        wire_types = self.view.output_types(entry)
        outputs = [
            OutputTensor(name, wire_types.get(name, dt), tuple(shape), raw)
            for name, dt, shape, raw in results
        ]
        labels = entry.labels() if any(o.class_count for o in (request.outputs or ())) else None
        return InferOutcome(
            entry.name, version, request, outputs, labels, entry.config.max_batch_size > 0
        )

    # -- async and batch jobs ----------------------------------------------------------

    def submit_job(
        self, to: calls.Target, request: InferRequest, traceparent: str = ""
    ) -> JobState:
        """Queue an infer request as an async job, below every online request. Its
        ``job`` span (the submission) is the parent of the worker's spans for it."""
        with tracing.span("job", traceparent, model=to.entry.name, request_id=request.id):
            return self._submit_job(to, request)

    def _submit_job(self, to: calls.Target, request: InferRequest) -> JobState:
        call = self._prepare(to, request, calls.Lane.ASYNC)
        model = to.entry.name
        msg = call.msg
        msg.job_ttl = self.settings.job_ttl_s
        msg.collect = to.decoupled  # its result holds every response, in order
        record = job_store.JobRecord(
            id=msg.id,
            model=model,
            version="" if to.latest else str(to.version),
            submitted=msg.enqueued,
            detail={
                "id": request.id,
                "outputs": None
                if request.outputs is None
                else [[o.name, o.binary, o.class_count] for o in request.outputs],
                "binary_data_output": request.binary_data_output,
            },
        )
        limit = self.settings.max_queued_jobs
        if to.entry.backend == ensemble_graph.ENSEMBLE:  # a worker's job driver runs its graph
            ensemble_job.submit(self._client, record, msg, limit)
            self._count_job(model, job_store.INFER)
            return JobState(record, job_store.Outcome(job_store.PENDING))
        pipe = self._client.pipeline(transaction=False)
        record.save(pipe, msg.job_ttl)
        pipe.execute()
        if not self.dispatcher.publisher.publish(
            model,
            msg.to_dict(),
            task_id=msg.id,
            priority=msg.priority,
            reply_to=None,
            max_queue_size=limit,
        ):
            self._client.delete(job_store.record_key(msg.id))
            statistics.record_failure(self._client, model, call.version, statistics.REJECTED)
            raise Unavailable(
                f"Exceeds maximum queue size: model '{model}' already has {limit} async jobs "
                "waiting (CONCH_MAX_QUEUED_JOBS); retry later"
            )
        self._count_job(model, job_store.INFER)
        return JobState(record, job_store.Outcome(job_store.PENDING))

    def _count_job(self, model: str, kind: str) -> None:
        """One more ``kind`` job submitted for ``model`` (``conch_jobs_total``)."""
        pipe = self._client.pipeline(transaction=False)
        statistics.count_model(pipe, model, statistics.job_field(kind, statistics.JOB_SUBMITTED))
        pipe.execute()

    def submit_batch(self, model: str, version: str, source: Any, target: Any) -> JobState:
        """An offline batch job: JSONL of infer requests at ``source`` (an s3:// URI),
        JSONL of responses to ``target``."""
        entry = self.view.serving(model)
        if version:
            entry.resolve_version(version)
        if self.sequences.spec(entry.config) is not None:
            raise self.sequences.refuse_job(model)
        record = batch_job.submit(
            self._client, entry, version, source, target, self.settings.job_ttl_s
        )
        return JobState(record, job_store.Outcome(job_store.PENDING))

    def job_status(self, job_id: str) -> JobState:
        record = self._record(job_id)
        return JobState(record, job_store.read(self._client, record.id))

    def cancel_job(self, job_id: str) -> JobState:
        """Cancel a job that has not finished: a queued request never runs; a batch job
        stops sending lines (those already queued still run) and uploads nothing."""
        record = self._record(job_id)
        if not job_store.cancel(self._client, record, self.settings.job_ttl_s):
            outcome = job_store.read(self._client, record.id)
            raise InvalidArgument(f"job {record.id} has already finished ({outcome.status})")
        return JobState(record, job_store.read(self._client, record.id))

    def job_result(
        self, job_id: str, wait_s: float = 0.0
    ) -> tuple[JobState, InferOutcome | CollectedOutcome | None]:
        """Where the job stands, held up to ``wait_s`` for it to finish; a finished infer
        job's outcome as its infer call would have been answered (a decoupled model's:
        one per response, in order; None for a batch job, whose result is its output
        object). A failed job raises its error."""
        record = self._record(job_id)
        if not 0 <= wait_s <= MAX_JOB_WAIT_S:
            raise InvalidArgument(f"'wait' must be a number of seconds from 0 to {MAX_JOB_WAIT_S}")
        outcome = (
            job_store.wait(self._client, record.id, wait_s)
            if wait_s
            else job_store.read(self._client, record.id)
        )
        state = JobState(record, outcome)
        if not state.done:
            return state, None
        reply = outcome.reply
        if reply is not None and reply.error is not None:
            raise reply.error
        if record.kind == job_store.BATCH or reply is None:
            return state, None
        asked = record.detail
        request = InferRequest(
            id=asked["id"],
            inputs=[],
            outputs=None
            if asked["outputs"] is None
            else [RequestedOutput(n, bool(b), int(k)) for n, b, k in asked["outputs"]],
            binary_data_output=bool(asked["binary_data_output"]),
            parameters={},
        )
        entry = self.view.serving(record.model)
        if reply.responses is not None:
            responses = [
                self.outcome(entry, request.narrowed(t[0] for t in outputs), reply.version, outputs)
                for outputs in reply.responses
            ]
            return state, CollectedOutcome(entry.name, reply.version, request.id, responses)
        return state, self.outcome(entry, request, reply.version, list(reply.outputs or ()))

    def _record(self, job_id: str) -> job_store.JobRecord:
        record = job_store.JobRecord.load(self._client, job_store.check_id(job_id))
        if record is None:
            raise NotFound(f"unknown job '{job_id}': it never existed, or its result has expired")
        return record


def _refuse_decoupled(endpoint: str) -> Unsupported:
    """Triton's answer where a decoupled model cannot be served (its HTTP and ModelInfer
    words, with the endpoint's name)."""
    return Unsupported(f"{endpoint} doesn't support models with decoupled transaction policy")


__all__ = [
    "EXTENSIONS",
    "CollectedOutcome",
    "DataPlane",
    "InferOutcome",
    "InferStream",
    "JobState",
    "ModelMetrics",
]
