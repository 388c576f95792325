"""OpenTelemetry traces that follow a request across the queue.

A request's trace is one W3C trace context (``traceparent``): the gateway continues the
client's (or samples a new one), opens its ``infer`` span and writes that span's context
into the queued message (``InferMessage.traceparent``). A worker, possibly on another host,
reads it back: each request gets a ``queue`` span (enqueued until its batch started) as a
child of the gateway's span, and each batch one ``compute`` span, linked to every request
it served (its parent is the first sampled request's span, so a batch of one nests).

Triton's ``--trace-config`` keys (``TraceConfig``) choose sampling: ``level=TIMESTAMPS``
turns tracing on (``OFF``, Triton's default, leaves it off), ``rate=N`` samples one new
trace in N, ``count=N`` stops after N sampled traces (-1: never). A client's sampled
``traceparent`` is always continued; spans in a worker follow their request's flag.
Spans go to an OTLP/HTTP collector at ``url`` (Triton's ``opentelemetry,url=...``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from conch.core.trace_config import TRACEPARENT, TraceConfig, updated

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER = "conch"
Span = trace.Span


class RateSampler(Sampler):
    """Triton's sampling: a parent's sampled flag is followed; a new trace is sampled one
    in ``rate`` while ``level`` is on, until ``count`` traces were (-1: no limit).

    The settings are the flags' (``base``) under the trace extension's (``shared``:
    Triton's keys for every model, ``<model>/<key>`` for one); a model with settings of
    its own counts its traces apart. A change starts the counts again."""

    def __init__(self, base: TraceConfig) -> None:
        self.base = base
        self.shared: dict[str, Any] = {}
        self._counts: dict[str, list[int]] = {}  # scope -> [seen, taken]
        self._configured: dict[str, TraceConfig] = {}  # by model, until the next change
        self._lock = threading.Lock()

    def configured(self, model: str = "") -> TraceConfig:
        """The settings that apply to ``model`` ("": to every model without its own)."""
        cached = self._configured.get(model)
        if cached is None:
            cached = self._configured[model] = self._resolve(model)
        return cached

    def _resolve(self, model: str) -> TraceConfig:
        shared = self.shared
        if not model:
            return updated(self.base, {k: v for k, v in shared.items() if "/" not in k})
        prefix = f"{model}/"
        own = {k.removeprefix(prefix): v for k, v in shared.items() if k.startswith(prefix)}
        # A model without settings of its own shares the one for every model (and its counts).
        return updated(self.configured(), own) if own else self.configured()

    def apply(self, changes: dict[str, Any]) -> None:
        """Take the trace extension's ``changes`` (``None``: back to what applied before)."""
        merged = {**self.shared, **changes}
        with self._lock:
            self.shared = {k: v for k, v in merged.items() if v is not None}
            self._counts, self._configured = {}, {}

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Any = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if parent.is_valid:
            sampled = parent.trace_flags.sampled
        else:
            sampled = self._take(str((attributes or {}).get("model", "")))
        decision = Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP
        return SamplingResult(decision, attributes if sampled else None)

    def _take(self, model: str) -> bool:
        config = self.configured(model)
        scope = model if config is not self.configured() else ""
        if not config.on:
            return False
        with self._lock:
            counts = self._counts.setdefault(scope, [0, 0])
            counts[0] += 1
            if (counts[0] - 1) % config.rate or 0 <= config.count <= counts[1]:
                return False
            counts[1] += 1
            return True

    def get_description(self) -> str:
        return f"RateSampler({self.base})"


_SAMPLER = RateSampler(TraceConfig())
_EXPORTING = False  # whether this process makes spans at all (start() chose OpenTelemetry)
_TRACER_NOW: trace.Tracer | None = None  # start()'s, got once (getting one costs)


def sampler() -> RateSampler:
    """This process's sampling, whose settings the trace extension shows and changes."""
    return _SAMPLER


def start(config: TraceConfig, service: str, exporter: SpanExporter | None = None) -> None:
    """Send this process's spans to the collector (``exporter`` replaces it, for tests).
    Spans are made only once ``--trace-config`` chose OpenTelemetry."""
    global _SAMPLER, _EXPORTING, _TRACER_NOW
    _SAMPLER = RateSampler(config)
    if not config.mode:
        return
    _EXPORTING = True
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=config.url)
    resource = Resource.create({"service.name": service, **dict(config.resource)})
    provider = TracerProvider(sampler=_SAMPLER, resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    _TRACER_NOW = provider.get_tracer(_TRACER)


def apply(changes: dict[str, Any]) -> None:
    """The trace extension's changes, as ``conch.wire.shared_settings`` delivers them."""
    _SAMPLER.apply(changes)


def tracer() -> trace.Tracer:
    return _TRACER_NOW or trace.get_tracer(_TRACER)


def context_of(traceparent: str) -> Context | None:
    """The remote context a ``traceparent`` names (None for none or a malformed one)."""
    if not traceparent or not TRACEPARENT.fullmatch(traceparent):
        return None
    return _PROPAGATOR.extract({"traceparent": traceparent})


def current_traceparent() -> str:
    """The running span's context as a ``traceparent`` ("" outside any span)."""
    if not _EXPORTING:
        return ""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    flags = f"{int(context.trace_flags):02x}"
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags}"


def span_context_of(traceparent: str) -> SpanContext | None:
    """The sampled remote span a ``traceparent`` names, or None."""
    context = context_of(traceparent)
    if context is None:
        return None
    span = trace.get_current_span(context).get_span_context()
    return span if span.is_valid and span.trace_flags.sampled else None


def trace_id(traceparent: str) -> str:
    """The trace id of a sampled ``traceparent`` (hex), for log lines; "" otherwise."""
    if not traceparent or not TRACEPARENT.fullmatch(traceparent):
        return ""
    sampled = int(traceparent[-2:], 16) & 1
    return traceparent[3:35] if sampled and traceparent[3:35] != "0" * 32 else ""


def span(
    name: str, traceparent: str = "", **attributes: object
) -> AbstractContextManager[trace.Span]:
    """A span named ``name``, continuing ``traceparent`` when it names one, else the
    current span (the gateway's request span; an ensemble's or BLS call's steps nest)."""
    if not _EXPORTING:  # no tracing set up: no OpenTelemetry work on the request's path
        return _NO_SPAN
    return _span(name, traceparent, attributes)


# What ``span`` is while this process makes no spans: one shared block that does nothing.
_NO_SPAN = nullcontext(trace.INVALID_SPAN)


@contextmanager
def _span(name: str, traceparent: str, attributes: dict[str, object]) -> Iterator[trace.Span]:
    parent = context_of(traceparent)
    kind = SpanKind.SERVER if parent is not None else SpanKind.INTERNAL
    with tracer().start_as_current_span(
        name, context=parent, kind=kind, attributes=_clean(attributes)
    ) as current:
        yield current


def _clean(attributes: dict[str, object]) -> dict[str, object]:
    return {k.replace("_", "."): v for k, v in attributes.items() if v not in ("", None)}


@contextmanager
def batch_span(model: str, requests: Sequence[tuple[str, float]]) -> Iterator[None]:
    """A worker's spans for one execution of a batch: each sampled request's ``queue``
    span (from its ``enqueued`` epoch seconds until now) and, for the block, the batch's
    ``compute`` span, linked to them all (calls a model makes inside nest under it).

    ``requests`` are the (traceparent, enqueued) of the batch's requests, in batch order."""
    sampled = [(c, at) for c, at in ((span_context_of(tp), at) for tp, at in requests) if c]
    if not sampled:
        yield
        return
    t, now = tracer(), time.time_ns()
    for context, enqueued in sampled:
        start_ns = min(now, int(enqueued * 1e9))
        queued = t.start_span("queue", context=_remote(context), start_time=start_ns)
        queued.set_attribute("model", model)
        queued.end(end_time=now)
    with t.start_as_current_span(
        "compute",
        context=_remote(sampled[0][0]),
        start_time=now,
        links=[Link(c) for c, _ in sampled],
        attributes={"model": model, "batch.requests": len(requests)},
    ):
        yield


def _remote(context: SpanContext) -> Context:
    return trace.set_span_in_context(trace.NonRecordingSpan(context))


__all__ = [
    "RateSampler",
    "Span",
    "apply",
    "batch_span",
    "context_of",
    "current_traceparent",
    "sampler",
    "span",
    "span_context_of",
    "start",
    "trace_id",
    "tracer",
]
