"""Run an ensemble: every step a request on its step model's own queue.

An ensemble has no worker of its own. Whoever receives the request runs its graph (the
gateway for a client, BLS for a Python model): every step whose inputs exist is published
at once (independent steps run in parallel, each batched with everyone else's traffic to
its model), and the outer request's deadline bounds them all. An ensemble that sets
``max_inflight_requests`` sends a step only while it holds one of that step's slots,
counted in Redis over every process that runs the graph (``_FleetSlots``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import redis

from conch.core import validation
from conch.core.ensemble_graph import ENSEMBLE, MAX_DEPTH, Step, Tensor, steps
from conch.core.ensemble_run import (
    PATIENCE_S,
    Done,
    Release,
    StepCall,
    impatient,
    run,
    slot_timeout,
)
from conch.core.errors import Cancelled, ConchError, InvalidArgument, Unsupported
from conch.core.inference import InferRequest, InputTensor, RequestedOutput
from conch.frontend import calls, response_cache
from conch.frontend.admission import longest_hold_s
from conch.frontend.producer import Abandonment, Dispatcher, Pending
from conch.wire import statistics
from conch.wire.keys import ENSEMBLE_SLOTS_PREFIX
from conch.wire.messages import InferMessage, Reply, WireTensor
from conch.wire.rate_limits import FleetLimiter, Pool

# How often a step waiting for a slot looks again: from the first, doubling to the last.
SLOT_POLL_S = (0.002, 0.05)

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig
    from conch.core.repository import ModelEntry


class _Queued:
    """A step sent to its model's queue (withdrawn from it if the caller goes away);
    ``answered`` sees its successful reply (the response cache stores it)."""

    def __init__(
        self,
        pending: Pending,
        abandonment: Abandonment | None,
        answered: Callable[[Reply], None] | None = None,
    ) -> None:
        self.pending = pending
        self.abandonment = abandonment
        self.answered = answered
        if abandonment is not None:
            abandonment.watch(pending)

    def wait(self) -> dict[str, Tensor]:
        try:
            reply = self.pending.wait()
        finally:
            self._done()
        if reply.error is not None:
            raise reply.error
        if self.answered is not None:
            self.answered(reply)
        return _tensors(reply.outputs or ())

    def cancel(self) -> None:
        self.pending.cancel()
        self._done()

    def _done(self) -> None:
        if self.abandonment is not None:
            self.abandonment.done(self.pending)


class _FleetSlots:
    """An ensemble's ``max_inflight_requests`` counted over every process that runs its
    graph (gateways, gRPC servers, job drivers, BLS), as Triton counts it in its one
    process: a slot is a hold on the step's pool in Redis (``conch.wire.rate_limits``),
    whose lease outlives a process that dies holding it by seconds only. One request's
    view: its wait ends at its ``deadline`` (epoch seconds; 0: none) or when its caller
    goes away."""

    def __init__(
        self, limiter: FleetLimiter, deadline: float, abandonment: Abandonment | None
    ) -> None:
        self.limiter = limiter
        self.deadline = deadline
        self.abandonment = abandonment

    def take(self, ensemble: str, step: Step, limit: int) -> Release:
        pool = Pool(f"{ENSEMBLE_SLOTS_PREFIX}{ensemble}/{step.index}", limit)
        patience = time.monotonic() + PATIENCE_S
        pause = SLOT_POLL_S[0]
        while True:
            hold = self.limiter.try_hold([pool], [1])
            if hold is not None:
                return lambda: self.limiter.release(hold)
            if self.abandonment is not None and self.abandonment.gone:
                raise Cancelled(self.abandonment.gone)
            now = time.time()
            if self.deadline and now >= self.deadline:
                raise slot_timeout(ensemble, step, limit)
            if time.monotonic() >= patience:
                impatient(ensemble, step, limit)
                return lambda: None
            time.sleep(min(pause, self.deadline - now) if self.deadline else pause)
            pause = min(2 * pause, SLOT_POLL_S[1])


def _tensors(outputs: Iterable[WireTensor]) -> dict[str, Tensor]:
    return {n: (dt, tuple(shape), raw) for n, dt, shape, raw in outputs}


def steps_hold_s(entry: ModelEntry, resolve: Callable[[str], ModelEntry]) -> float:
    """How long an ensemble's steps' queues may keep one request, its steps one after
    another (``admission.longest_hold_s`` of each; a step model ``resolve`` refuses adds
    nothing: the request fails at that step)."""
    total = 0.0
    for step in steps(entry.config):
        try:
            model = resolve(step.model)
        except ConchError:
            continue
        nested = model.backend == ENSEMBLE
        total += steps_hold_s(model, resolve) if nested else longest_hold_s(model.config)
    return total


def _slot_deadline(outer: InferMessage) -> float:
    """When a step's wait for a ``max_inflight_requests`` slot ends (epoch seconds; 0:
    never): the outer request's deadline, or sooner its ``timeout``, counted from its
    arrival. The client's timeout is each step's queue timeout, and a step waiting for a
    slot is still queued, as Triton holds it before its model's queue."""
    if not outer.timeout_us:
        return outer.deadline
    by_timeout = outer.enqueued + outer.timeout_us / 1e6
    return min(outer.deadline, by_timeout) if outer.deadline else by_timeout


def _step_parameters(outer: InferMessage) -> dict[str, Any]:
    """The parameters each step's request carries: the outer request's own, and its
    ``timeout`` and ``priority``, which each step's model applies with its own queue
    policy (as Triton's ensembles pass them on; a step at the model's default level
    would wait behind what the client asked to go ahead of)."""
    params = dict(outer.params)
    if outer.timeout_us:
        params["timeout"] = outer.timeout_us
    if outer.priority_level:
        params["priority"] = outer.priority_level
    return params


def execute(
    entry: ModelEntry,
    inputs: dict[str, Tensor],
    wanted: list[str],
    outer: InferMessage,
    *,
    resolve: Callable[[str], ModelEntry],
    dispatcher: Dispatcher,
    check: Callable[[str], None] | None = None,
    abandonment: Abandonment | None = None,
    lane: calls.Lane = calls.Lane.ONLINE,
    depth: int = 0,
    cache: response_cache.ResponseCache | None = None,
) -> dict[str, Tensor]:
    """Run the graph with every step a request on its model's queue.

    ``outer`` (an InferMessage, never published) lends every step its deadline,
    priority, parameters and call chain (``calls.Caller``); ``resolve`` gives a step model's entry (raising for an unknown one) and
    ``check`` may refuse a step before it is sent (the gateway's availability check,
    BLS's cycle check). The gateway and BLS both run ensembles through here.
    Through ``abandonment`` a caller that went away (a cancelled gRPC call) stops the
    graph, as Triton checks between steps: its steps still queued are withdrawn, and
    no later step is sent. ``lane`` is the outer request's: a job's steps wait where the
    job's own request would (``calls.Lane``), below online traffic. With a ``cache`` (the
    gateway's), a step whose model enables the response cache is looked up first and, on
    a hit, never sent.
    """
    if depth > MAX_DEPTH:
        raise InvalidArgument(f"ensemble '{entry.name}': ensembles nested deeper than {MAX_DEPTH}")

    caller = calls.Caller(outer.deadline, outer.priority, tuple(outer.chain))
    params = _step_parameters(outer)

    def config_of(step: Step) -> ModelConfig:
        if check is not None:
            check(step.model)
        return resolve(step.model).config

    def start(step: Step, tensors: dict[str, Tensor], outs: list[str]) -> StepCall:
        if abandonment is not None and abandonment.gone:
            raise Cancelled(abandonment.gone)
        to = calls.target(resolve(step.model), step.version)
        if to.entry.config.HasField("sequence_batching"):
            raise Unsupported(
                f"model '{step.model}' is a sequence model: conch does not run one as an "
                "ensemble step (its requests need the sequence's order and slot); call it directly"
            )
        # The step's inputs are checked against its own config, as a client's would be.
        request = InferRequest(
            id=outer.client_id,
            inputs=[InputTensor(n, dt, shape, raw) for n, (dt, shape, raw) in tensors.items()],
            outputs=[RequestedOutput(o, True) for o in outs],
            binary_data_output=True,
            parameters=params,
        )
        validation.validate_request(request, to.entry.config, model_name=step.model)
        if to.entry.backend == ENSEMBLE:
            result = execute(
                to.entry,
                tensors,
                outs,
                outer,
                resolve=resolve,
                dispatcher=dispatcher,
                check=check,
                abandonment=abandonment,
                lane=lane,
                depth=depth + 1,
                cache=cache,
            )
            return Done(result)
        call = calls.build(to, request, lane=lane, caller=caller)
        answered = None
        visit = response_cache.consult(cache, to.entry.config, step.model, to.version, call.msg)
        if visit is not None:
            if visit.found is not None:
                return Done(_tensors(visit.found[1]))
            keep = visit.keep

            def answered(reply: Reply) -> None:
                keep(reply.version if reply.version > 0 else call.version, reply.outputs or ())

        pending = dispatcher.submit(
            call.msg, max_queue_size=call.max_queue_size, version=call.version
        )
        return _Queued(pending, abandonment, answered)

    slots = _FleetSlots(dispatcher.step_slots, _slot_deadline(outer), abandonment)
    return run(entry, inputs, wanted, start, config_of, slots)


def execute_counted(
    client: redis.Redis,
    entry: ModelEntry,
    inputs: dict[str, Tensor],
    outer: InferMessage,
    version: int,
    **run: Any,
) -> dict[str, Tensor]:
    """``execute`` the outputs ``outer`` asks for, counted in the ensemble's statistics as
    Triton counts an ensemble (whoever runs the graph is the only one that sees it run):
    a failure is OTHER whatever failed inside it (the step model counts its own reason)."""
    cfg = entry.config
    first = next(iter(inputs.values()), None)
    rows = first[1][0] if cfg.max_batch_size > 0 and first is not None and first[1] else 1
    execution = statistics.Execution(version, batch_size=rows)
    try:
        produced = execute(entry, inputs, outer.outputs, outer, **run)
    except ConchError:
        execution.failed(statistics.OTHER, int((time.time() - outer.enqueued) * 1e9))
        statistics.record_now(client, entry.name, execution)
        raise
    execution.success, execution.rows = 1, rows
    execution.success_ns = execution.infer_ns = int((time.time() - outer.enqueued) * 1e9)
    execution.responses_ns, execution.queues_ns = [execution.success_ns], [0]
    statistics.record_now(client, entry.name, execution)
    return produced


class GraphRunner:
    """Runs ensembles for a job driver in a worker process: the async job of an ensemble
    and each line of a batch job on one, at the job's lane (``calls.Lane``)."""

    def __init__(
        self,
        client: redis.Redis,
        resolve: Callable[[str], ModelEntry],
        dispatcher: Dispatcher,
        check: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.resolve = resolve
        self.dispatcher = dispatcher
        self.check = check

    def reply(self, entry: ModelEntry, msg: InferMessage, version: int, lane: calls.Lane) -> Reply:
        """The graph's answer to ``msg`` as a model's worker would give it: outputs, or
        the error that failed it."""
        inputs = {name: (dt, tuple(shape), raw) for name, dt, shape, raw in msg.inputs}
        try:
            produced = execute_counted(
                self.client,
                entry,
                inputs,
                msg,
                version,
                resolve=self.resolve,
                dispatcher=self.dispatcher,
                check=self.check,
                lane=lane,
            )
        except ConchError as exc:
            return Reply(msg.id, error=exc, version=version)
        outputs = [(name, *produced[name]) for name in msg.outputs if name in produced]
        return Reply(msg.id, outputs=outputs, version=version)
