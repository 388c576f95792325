"""The data plane's inference: a call's target, its checks, the cache, and its route.

``DataPlane`` hands its infer calls here. An infer call is two calls, ``target`` then
``infer`` (or ``infer_stream``), so that an adapter can ask about the model and version
before it decodes the request: a call to an unknown model says so whatever its body
holds, as Triton answers.

Both calls go one way up to the queue (``Inference._route``), in a span: every 4xx raised
before anything is queued (``prepare``), the request's log tags, and its route (a
sequence model's mailbox, or its model's queue). ``infer`` then looks the request up in
the response cache (``response_cache.consult``) and waits for one answer;
``infer_stream`` hands out a decoupled model's many as they come (``InferStream``). An
adapter that answers once names itself to ``target`` (``endpoint``), which refuses a
decoupled model in Triton's words.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, Unpack

from conch.core import ensemble_graph, timeline, tracing, validation
from conch.core.errors import ConchError, Unsupported
from conch.core.inference import InferRequest, OutputTensor
from conch.core.repository import ModelEntry
from conch.core.request_scope import RequestTag, about
from conch.frontend import calls, ensemble_runner, response_cache
from conch.frontend.model_view import ModelView
from conch.frontend.producer import Abandonment, Dispatcher, ResponseStream
from conch.frontend.sequence_route import SequenceRoute
from conch.frontend.traffic import Traffic
from conch.settings import Settings
from conch.wire import broker, stream_log
from conch.wire.messages import InferMessage, WireTensor

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)


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


class InferStream:
    """A request's responses, each an ``InferOutcome`` as it comes (``DataPlane.
    infer_stream``), the last one ``final``. Iteration raises what ends the request
    early: a reply's error, the deadline (``Unavailable``), an outage, the caller gone
    (``Cancelled``). Iterate to the end or ``close()``: either forgets the request, and
    the replies still to come are dropped."""

    def __init__(
        self,
        inference: Inference,
        to: calls.Target,
        request: InferRequest,
        call: calls.Call,
        replies: ResponseStream,
        abandonment: Abandonment | None,
    ) -> None:
        self._inference = inference
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
        outputs = list(reply.outputs or ())
        outcome = self._inference.outcome(self._to.entry, request, version, outputs)
        outcome.final = reply.final
        outcome.restarted = reply.restarted
        self.position = stream_log.of(reply)
        return outcome

    def close(self) -> None:
        self._replies.cancel()
        if self._abandonment is not None:
            self._abandonment.done(self._replies)


class CallOptions(TypedDict, total=False):
    """What an adapter may say of an infer call besides its request, the keywords of
    ``infer`` and ``infer_stream`` alike, each optional."""

    # Epoch seconds (0, the default: none), the caller's own, such as a gRPC deadline:
    # the request is never run past it, nor past its ``timeout``.
    deadline: float
    # Through it the caller's transport may say it went away: a model's request still
    # queued is then never run, nor is an ensemble's next step.
    abandonment: Abandonment | None
    # A W3C ``traceparent`` from the client, continued by the call's ``infer`` span.
    traceparent: str


class StreamOptions(CallOptions, total=False):
    """``infer_stream``'s options: ``infer``'s, and whether to keep the stream."""

    # Its responses kept for a client that reconnects (with --stream-keep-secs above 0).
    keep: bool


@dataclass(slots=True)
class Routed:
    """A request checked and built (``call``), with where it goes: its sequence's
    mailbox (``route``), or its model's queue (None); and the ids its log lines carry."""

    call: calls.Call
    route: Callable[[InferMessage], None] | None
    tag: RequestTag


@dataclass(eq=False)
class Inference:
    """The infer calls of one data plane (see the module docstring)."""

    settings: Settings
    view: ModelView
    dispatcher: Dispatcher
    cache: response_cache.ResponseCache | None
    sequences: SequenceRoute
    traffic: Traffic

    def target(self, model: str, version: str = "", *, endpoint: str = "") -> calls.Target:
        """The model and version a call names ("" = the latest): every error about them.

        ``endpoint`` names an adapter's call that answers once (Triton's name for it:
        "HTTP end point", "ModelInfer RPC"): it refuses a decoupled model, as Triton does.
        No version named, for a model with a traffic split: a version drawn by its
        weights, and maybe a shadow (``conch.frontend.traffic``).
        """
        to = self.traffic.route(calls.target(self.view.serving(model), version))
        if endpoint and to.decoupled:
            raise refuse_decoupled(endpoint)
        return to

    def infer(
        self, to: calls.Target, request: InferRequest, **options: Unpack[CallOptions]
    ) -> InferOutcome:
        """Check ``request`` against its model, queue it (or run the ensemble's graph)
        and wait for the outputs, within what the caller says (``CallOptions``).

        A decoupled model is refused (``infer_stream`` is its call). A model that uses
        the response cache is answered from it when it can, and its answer kept when not.
        """
        if to.decoupled:
            raise refuse_decoupled("this endpoint")
        abandonment = options.get("abandonment")
        with self._span(to, request, options) as span:
            routed = self._route(to, request, options, span, "infer")
            call = routed.call
            with about(routed.tag):
                self.traffic.shadow(to, request, call)  # a copy to the split's shadow, if any
                try:
                    visit = response_cache.consult(
                        self.cache, to.entry.config, to.entry.name, to.version, call.msg
                    )
                    if visit is not None and visit.found is not None:
                        version, results = visit.found
                    else:
                        version, results = self._run(to, request, routed, abandonment)
                        log.debug("infer: answered by version %s", version)
                        if visit is not None:
                            visit.keep(version, results)
                except ConchError as exc:
                    log.debug("infer: failed (%s): %s", exc.code, exc.message)
                    raise
                return self.outcome(to.entry, request, version, results)

    def infer_stream(
        self, to: calls.Target, request: InferRequest, **options: Unpack[StreamOptions]
    ) -> InferStream:
        """Check ``request``, queue it, and return its responses to iterate as they come:
        a decoupled model's many (``InferStream``), or any other model's one. The
        options are ``infer``'s; the ``deadline`` bounds the whole stream. The request
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
        abandonment = options.get("abandonment")
        keep = options.get("keep", False)
        with self._span(to, request, options) as span:
            routed = self._route(to, request, options, span, "infer stream")
            call = routed.call
            call.msg.watched = True
            call.msg.keep_s = self.settings.stream_keep_s if keep else 0
            with about(routed.tag):
                replies = self.dispatcher.stream(
                    call.msg,
                    max_queue_size=call.max_queue_size,
                    version=call.version,
                    route=routed.route,
                    grace_s=self.settings.stream_grace_s,
                )
        if abandonment is not None:
            abandonment.watch(replies)
        return InferStream(self, to, request, call, replies, abandonment)

    @staticmethod
    def _span(
        to: calls.Target, request: InferRequest, options: CallOptions
    ) -> AbstractContextManager[tracing.Span]:
        """An online request's ``infer`` span, continuing the client's ``traceparent``;
        its way up to the queue (``_route``) and its wait for the answer run inside it."""
        return tracing.span(
            "infer", options.get("traceparent", ""), model=to.entry.name, request_id=request.id
        )

    def _route(
        self,
        to: calls.Target,
        request: InferRequest,
        options: CallOptions,
        span: tracing.Span,
        what: str,
    ) -> Routed:
        """The one way of an online request up to its queue, for ``infer`` and
        ``infer_stream``, inside its ``span``: the request checked and built
        (``prepare``), and routed; its ``tag`` names its message and trace ids for the
        log lines about it from there on."""
        deadline = options.get("deadline", 0.0)
        caller = calls.Caller(deadline=deadline) if deadline else calls.CLIENT
        with about(RequestTag(request.id)):
            call = self.prepare(to, request, calls.Lane.ONLINE, caller)
        msg = call.msg
        span.set_attribute("conch.id", msg.id)
        tag = RequestTag(request.id, msg.id, tracing.trace_id(msg.traceparent))
        if log.isEnabledFor(logging.DEBUG):
            with about(tag):
                log.debug("%s: model '%s' version %s", what, to.entry.name, call.version)
        spec = self.sequences.spec(to.entry.config) if msg.sequence is not None else None
        return Routed(call, None if spec is None else self.sequences.route(spec), tag)

    def prepare(
        self,
        to: calls.Target,
        request: InferRequest,
        lane: calls.Lane,
        caller: calls.Caller = calls.CLIENT,
    ) -> calls.Call:
        """Every 4xx about the request is raised here, before anything is queued (an
        infer call's, and an async job's)."""
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

    def _run(
        self,
        to: calls.Target,
        request: InferRequest,
        routed: Routed,
        abandonment: Abandonment | None,
    ) -> tuple[int, list[WireTensor]]:
        """Queue the call (or run the ensemble's graph): the version that ran, and the outputs."""
        entry, call = to.entry, routed.call
        msg = call.msg
        if entry.backend == ensemble_graph.ENSEMBLE:
            return call.version, self._run_ensemble(entry, request, msg, call.version, abandonment)
        reply = self.dispatcher.call(
            msg,
            max_queue_size=call.max_queue_size,
            version=call.version,
            abandonment=abandonment,
            route=routed.route,
            bundling=self.bundling(entry.config, msg) if routed.route is None else None,
        )
        if reply.error is not None:
            raise reply.error
        return reply.version if reply.version > 0 else call.version, list(reply.outputs or ())

    def bundling(self, config: ModelConfig, msg: InferMessage) -> broker.Bundling | None:
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
        shape = msg.inputs[0].shape if msg.inputs else ()
        rows = max(1, shape[0]) if shape else 1
        nbytes = sum([len(t.raw) for t in msg.inputs])
        return broker.Bundling(rows, config.max_batch_size, nbytes)

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
            self.dispatcher.client,
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


def refuse_decoupled(endpoint: str) -> Unsupported:
    """Triton's answer where a decoupled model cannot be served (its HTTP and ModelInfer
    words, with the endpoint's name)."""
    return Unsupported(f"{endpoint} doesn't support models with decoupled transaction policy")


__all__ = [
    "CallOptions",
    "InferOutcome",
    "InferStream",
    "Inference",
    "Routed",
    "StreamOptions",
    "refuse_decoupled",
]
