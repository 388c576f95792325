"""Business logic scripting (BLS): a Python model calling another model.

``pb_utils.InferenceRequest(model_name=..., inputs=[...]).exec()`` inside a Python
model's ``execute`` publishes an ``InferMessage`` on the named model's queue, as the
gateway does for a client (so the call is batched with everyone else's traffic to that
model), and waits for the reply on this worker process's reply list: one ``Dispatcher``
per worker process, made on the first call and shared by every batcher thread.

``BlsClient`` is the Python backend's ``BlsPort``: it takes the neutral ``BlsRequest``
that ``pb_utils`` builds from the model's ``InferenceRequest`` and answers with the
outputs as numpy arrays, or raises the ``ConchError`` that answers the call; ``pb_utils``
turns either into the model's ``InferenceResponse`` (failures as its ``error()``, never
raised, as in Triton). So this module never sees the Python backend's own types.

``exec(decoupled=True)`` is ``BlsClient.stream``: the message goes out as a gateway's
stream does (``Dispatcher.stream``, watched), and ``BlsStream`` hands each reply on as
it comes, in order, up to the final one. A caller that stops early cancels it
(``BlsStream.cancel``): the message is taken back if no worker has it yet, and otherwise
its lease ends, so the called model's ``is_cancelled()`` turns true and the replies
still to come are dropped. A plain ``exec()`` to a decoupled model is refused with
Triton's error: one reply cannot carry its responses.

Before publishing, the call is checked the way the gateway checks a client's request:
the target must be in the repository (``model_version`` -1 = the latest version the
serving worker has), its inputs and requested outputs must fit the target's config
(``validation``), it must be loaded (explicit model control), and it must not be
reported broken by every live worker. A call to an ensemble runs the ensemble's graph
here, as the gateway would: every step a request on its model's queue.

Deadline: a call inherits the deadline of the batch it is made from (the smallest of
its requests' deadlines), which the Python backend keeps in ``CURRENT`` around
``execute``; the BLS request's own ``timeout`` (µs) can only shorten it. ``async_exec``
carries the context into its thread; a thread the model starts itself does not: its
calls still reach this client, as Triton serves them (``pb_utils`` falls back to the port
the worker handed its Python backends), but inherit no deadline and no call chain (the
default timeout, no cycle check; the client logs a warning) unless the thread runs the
call in ``contextvars.copy_context()``.

Deadlock: the instance making a BLS call is busy until the call returns. A call to a
model that is itself waiting on that instance (the caller itself, or a model earlier in
the call chain, A -> B -> A) would wait on itself. So every BLS message carries its
chain: the models waiting on it, outermost first. A dynamic batch runs as one
``execute``, so every model waiting on any request of the batch waits on each call the
batch makes: the caller's chain is the union of its batch's chains, plus itself. A call
to a model in it is answered at once with an error naming the cycle, and so is a call
that would make a path longer than ``MAX_DEPTH`` models.

The rule is per model name, not per instance. A self-call could be served by another
instance of the same model, but nothing guarantees one is free (every instance may be
making the same self-call), so whether it worked would depend on load. Running the call
inline on the calling instance would re-enter ``execute`` (and, for ``async def
execute``, nest the instance's event loop), which Triton models are not written for.
conch refuses both, the same way every time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import redis

from conch.core import bls_call, ensemble_graph, tensors
from conch.core.call_context import CURRENT, CallContext
from conch.core.errors import (
    ConchError,
    Internal,
    InvalidArgument,
    Unavailable,
)
from conch.core.model_spec import BlsRequest, BlsResponse
from conch.core.repository import ModelEntry, ModelRepository
from conch.frontend import calls, ensemble_runner, model_control
from conch.frontend.model_view import ModelView
from conch.frontend.producer import Dispatcher, ResponseStream
from conch.settings import Settings
from conch.wire import outage
from conch.wire.messages import MAX_CHAIN, InferMessage, WireTensor
from conch.wire.redis_client import open_client

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

CONFIG_MAX_AGE_S = 2.0  # how stale a target's config may be (models reload at run time)


def check_call(ctx: CallContext, target: str) -> ConchError | None:
    """Why a call from ``ctx`` to ``target`` must not be made, or None: a cycle or a path
    too long (``bls_call.refusal``), or more models waiting on it than a message carries."""
    problem = bls_call.refusal(ctx, target)
    if problem is None and len(ctx.waiting()) > MAX_CHAIN:
        return InvalidArgument(
            f"BLS call from model '{ctx.model}' to model '{target}': more than {MAX_CHAIN} "
            "models would be waiting on it"
        )
    return problem


# -- the client ---------------------------------------------------------------------------


class BlsClient:
    """Sends a Python model's ``InferenceRequest``s through the model queues.

    Its ``view`` of the models is the gateway's ``ModelView``, read on demand: a target
    is read from ``repository`` (the worker's own, so config overrides apply; one opened
    from ``settings`` when None) on first use and again once the read is
    ``CONFIG_MAX_AGE_S`` old, so models added or changed while the worker runs are seen
    (see ``model_view`` for why BLS does not follow the control channel instead).
    """

    def __init__(
        self,
        settings: Settings,
        repository: ModelRepository | None = None,
        *,
        client: redis.Redis | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.settings = settings
        self.client = client or open_client(settings.redis_url)
        self.view = ModelView(settings, self.client, repository, config_max_age_s=CONFIG_MAX_AGE_S)
        self._dispatcher = dispatcher
        self._lock = threading.Lock()
        self._warned_no_context = False

    @property
    def dispatcher(self) -> Dispatcher:
        """Made on first use: most worker processes never make a BLS call."""
        if self._dispatcher is None:
            with self._lock:
                if self._dispatcher is None:
                    self._dispatcher = Dispatcher(self.client)
        return self._dispatcher

    # -- pb_utils calls -----------------------------------------------------------------

    def infer(self, request: BlsRequest, decoupled: bool = False) -> list[tuple[str, np.ndarray]]:
        """``InferenceRequest.exec``: the called model's outputs, or the ``ConchError`` that
        answers the call (``pb_utils`` turns either into the model's response).

        ``pb_utils`` sends ``exec(decoupled=True)`` to ``stream``, so ``decoupled`` True is
        a caller's mistake here: refused, as one reply cannot carry many responses."""
        if decoupled:
            raise Internal(
                f"BLS request to model '{request.model_name}': a call that may answer many "
                "times goes through BlsClient.stream, not infer"
            )
        ctx = CURRENT.get()
        try:
            msg, max_queue_size = self.prepare(request, False, ctx)
            return _as_numpy(self._answer(msg, max_queue_size, ctx))
        except redis.RedisError as exc:
            raise _broker_error(exc) from None

    def stream(self, request: BlsRequest) -> BlsStream:
        """``InferenceRequest.exec(decoupled=True)``: the called model's responses as they
        come (``BlsStream``), or the ``ConchError`` that refuses the call. A model that is
        not decoupled answers once; an ensemble runs here and answers once too, as conch
        does not stream an ensemble's steps."""
        ctx = CURRENT.get()
        try:
            msg, max_queue_size = self.prepare(request, True, ctx)
            entry = self.view.entry(msg.model)
            if entry.backend == ensemble_graph.ENSEMBLE:
                return BlsStream.answered(_as_numpy(self._answer(msg, max_queue_size, ctx)))
            msg.watched = True  # the worker reads its lease: a caller gone cancels it
            replies = self.dispatcher.stream(
                msg, max_queue_size=max_queue_size, version=self._resolved(entry, msg)
            )
        except redis.RedisError as exc:
            raise _broker_error(exc) from None
        return BlsStream(replies)

    def _answer(
        self, msg: InferMessage, max_queue_size: int, ctx: CallContext | None
    ) -> list[WireTensor]:
        """The one reply's outputs to ``msg``: an ensemble's graph run here, any other
        model's reply; its error raised."""
        entry = self.view.entry(msg.model)
        if entry.backend == ensemble_graph.ENSEMBLE:
            inputs = {name: (dt, shape, raw) for name, dt, shape, raw in msg.inputs}
            produced = self._run_ensemble(entry, inputs, msg.outputs, msg, ctx, depth=0)
            return [(name, *produced[name]) for name in msg.outputs]
        version = self._resolved(entry, msg)
        reply = self.dispatcher.call(msg, max_queue_size=max_queue_size, version=version)
        if reply.error is not None:
            raise reply.error
        return list(reply.outputs or ())

    @staticmethod
    def _resolved(entry: ModelEntry, msg: InferMessage) -> int:
        """The version ``msg`` runs, for statistics (it may say "latest")."""
        return entry.latest() if msg.version == calls.LATEST else msg.version

    def _run_ensemble(
        self,
        entry: ModelEntry,
        inputs: dict[str, ensemble_graph.Tensor],
        wanted: list[str],
        outer: InferMessage,
        ctx: CallContext | None,
        depth: int,
    ) -> dict[str, ensemble_graph.Tensor]:
        """An ensemble's graph, run here as the gateway runs it, under the BLS call's
        deadline, priority and call chain."""

        def check(model: str) -> None:
            if ctx is not None:  # a step on a model waiting on this call would wait on itself
                problem = check_call(ctx, model)
                if problem is not None:
                    raise problem
            self.view.check_available(model)

        return ensemble_runner.execute(
            entry,
            inputs,
            wanted,
            outer,
            resolve=self.view.serving,
            dispatcher=self.dispatcher,
            check=check,
            depth=depth,
        )

    def graph_runner(self) -> ensemble_runner.GraphRunner:
        """Ensembles run for a job driver in this process (``conch.frontend.jobs``), on
        this client's view of the models and its dispatcher."""
        return ensemble_runner.GraphRunner(
            self.client, self.view.serving, self.dispatcher, self.view.check_available
        )

    def is_ready(self, name: str, version: str | int = "") -> bool:
        """``pb_utils.is_model_ready``: a live worker reports that version READY."""
        text = "" if version is None else str(version).strip()
        try:
            entry = self.view.serving(str(name))
            v = entry.resolve_version(text)
        except ConchError:
            return False
        return self.view.version_ready(entry.name, v)

    def load(self, name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
        """``pb_utils.load_model``: what the HTTP load route does."""
        model_control.load(
            self.client,
            self.settings,
            str(name),
            config=config or None,
            files=dict(files or {}),
            states=lambda: self.view.states(max_age=0.05),
            refresh=self.view.refresh,  # read it again: the load may have changed it
        )

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """``pb_utils.unload_model``."""
        model_control.unload(
            self.client,
            self.settings,
            str(name),
            unload_dependents=bool(unload_dependents),
            states=lambda: self.view.states(max_age=0.05),
            refresh=self.view.refresh,
        )

    # -- building the message -----------------------------------------------------------

    def prepare(
        self, request: BlsRequest, decoupled: bool, ctx: CallContext | None
    ) -> tuple[InferMessage, int]:
        """The checked message for ``request`` and the target's queue bound; raises the
        ``ConchError`` that answers the call when it cannot be made. ``decoupled``: the
        caller takes any number of responses (else a decoupled target is refused)."""
        target = bls_call.target_name(request)
        if ctx is None:
            self._warn_no_context(target)
        else:
            problem = check_call(ctx, target)
            if problem is not None:
                raise problem
        entry = self.view.serving(target)
        checked = bls_call.check(request, entry)
        to = calls.target(entry, checked.version)
        if to.decoupled and not decoupled:
            raise bls_call.decoupled_refused(target)
        self.view.check_available(target)
        caller = (
            calls.Caller(ctx.deadline, ctx.priority, tuple(ctx.waiting()))
            if ctx is not None
            else calls.CLIENT
        )
        built = calls.build(
            to, checked.request, caller=caller, default_timeout_s=self.settings.request_timeout_s
        )
        return built.msg, built.max_queue_size

    def _warn_no_context(self, target: str) -> None:
        if self._warned_no_context:
            return
        self._warned_no_context = True
        log.warning(
            "BLS call to model '%s' made outside a Python model's execute (a thread the "
            "model started?): it inherits no deadline and no call chain, so it waits up to "
            "%.0f s and a call back to a waiting model is not caught. Start such threads "
            "with contextvars.copy_context().run, or use async_exec.",
            target,
            self.settings.request_timeout_s,
        )


# -- a call's responses -------------------------------------------------------------------


class BlsStream:
    """The responses of ``BlsClient.stream``, each a ``BlsResponse`` as its reply comes,
    in order, up to the final one (the core's ``BlsResponses``).

    Iterating raises what ends the call early, as ``ResponseStream`` raises it: the
    called model's error, the deadline, an outage, ``cancel``. So does a reply from a
    later run of the request (its worker died mid-stream): the caller has already used
    the earlier run's responses, and the new run would repeat them.
    """

    __slots__ = ("_answer", "_over", "_replies")

    def __init__(
        self, replies: ResponseStream | None, answer: list[tuple[str, np.ndarray]] | None = None
    ) -> None:
        self._replies = replies  # None: answered already (``answered``)
        self._answer = answer
        self._over = False  # the final response or an error was handed out

    @classmethod
    def answered(cls, outputs: list[tuple[str, np.ndarray]]) -> BlsStream:
        """A call answered before its stream was made (an ensemble): one final response."""
        return cls(None, outputs)

    def __iter__(self) -> Iterator[BlsResponse]:
        return self

    def __next__(self) -> BlsResponse:
        if self._over:
            raise StopIteration
        if self._replies is None:
            self._over = True
            return BlsResponse(self._answer or [], final=True)
        try:
            reply = next(self._replies)
        except ConchError:
            self._over = True  # the stream ended itself, and let go of the request
            raise
        except BaseException:
            self.cancel()
            raise
        try:
            if reply.restarted:
                raise Unavailable(
                    f"BLS request to model '{self._replies.msg.model}': the worker running "
                    "it was lost and the request started over, so its responses so far "
                    "would come again; the call ends here"
                )
            response = BlsResponse(_as_numpy(reply.outputs or ()), final=reply.final)
        except ConchError:
            self.cancel()
            raise
        self._over = response.final
        return response

    def cancel(self) -> None:
        """The caller reads no more (``ResponseStream.abandon``): withdrawn if no worker
        took it yet, else the model sees ``is_cancelled()``; a reader blocked on the next
        response gets ``Cancelled`` at once. Nothing to do once the call ended."""
        replies = self._replies
        if self._over or replies is None:
            self._over = True
            return
        model = replies.msg.model
        try:
            replies.abandon(f"request to model '{model}' cancelled by its BLS caller")
        except redis.RedisError as exc:  # the lease lapses on its own, and nothing waits
            log.warning("BLS request to model '%s': could not cancel it: %s", model, exc)


def _as_numpy(results: Iterable[WireTensor]) -> list[tuple[str, np.ndarray]]:
    """A reply's outputs as numpy arrays, by name, in order."""
    try:
        return [
            (name, tensors.to_numpy(datatype, shape, raw, name))
            for name, datatype, shape, raw in results
        ]
    except ConchError as exc:
        raise Internal(f"unreadable reply: {exc.message}") from None


def _broker_error(exc: redis.RedisError) -> ConchError:
    """The answer to a call that Redis failed."""
    if outage.is_outage(exc):
        return outage.unavailable(exc)
    return Unavailable(f"the broker refused the call: {exc}")


__all__ = [
    "BlsClient",
    "BlsStream",
    "check_call",
]
