"""Run an ensemble: every step a request on its step model's own queue.

An ensemble has no worker of its own. Whoever receives the request runs its graph (the
gateway for a client, BLS for a Python model): every step whose inputs exist is published
at once (independent steps run in parallel, each batched with everyone else's traffic to
its model), and the outer request's deadline bounds them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from conch.core import validation
from conch.core.ensemble_graph import ENSEMBLE, MAX_DEPTH, Step, Tensor, steps
from conch.core.errors import ConchError, Internal, InvalidArgument
from conch.core.inference import InferRequest, InputTensor, RequestedOutput
from conch.frontend import calls
from conch.frontend.producer import Dispatcher, Pending


class StepCall(Protocol):
    """A step in flight."""

    def wait(self) -> dict[str, Tensor]:
        """The step model's outputs by name; raises its error."""
        ...

    def cancel(self) -> None:
        """Nobody will wait for this step (a sibling failed)."""
        ...


# Starts one step: (step, its input tensors, names of outputs wanted) -> the step in flight.
StepRunner = Callable[[Step, dict[str, Tensor], list[str]], StepCall]


class _Queued:
    """A step sent to its model's queue."""

    def __init__(self, pending: Pending) -> None:
        self.pending = pending

    def wait(self) -> dict[str, Tensor]:
        reply = self.pending.wait()
        if reply.error is not None:
            raise reply.error
        return {n: (dt, tuple(shape), raw) for n, dt, shape, raw in reply.outputs or ()}

    def cancel(self) -> None:
        self.pending.cancel()


class _Done:
    """A step already run (a nested ensemble)."""

    def __init__(self, outputs: dict[str, Tensor]) -> None:
        self.outputs = outputs

    def wait(self) -> dict[str, Tensor]:
        return self.outputs

    def cancel(self) -> None:
        pass


def run(
    entry: Any, inputs: dict[str, Tensor], wanted: list[str], start: StepRunner
) -> dict[str, Tensor]:
    """Execute the graph; a failing step fails the request with its error and model."""
    tensors = dict(inputs)
    remaining = steps(entry.config)
    while remaining:
        ready = [s for s in remaining if all(t in tensors for t in s.inputs.values())]
        if not ready:  # check() rules this out; never loop forever on a bad graph
            raise Internal(f"ensemble '{entry.name}': no step can run with the tensors produced")
        started: list[tuple[Step, StepCall]] = []
        for step in ready:  # publish every ready step before waiting on any
            step_inputs = {name: tensors[t] for name, t in step.inputs.items()}
            started.append(
                (
                    step,
                    _guard(entry, step, lambda s=step, i=step_inputs: start(s, i, list(s.outputs))),
                )
            )
        for k, (step, call) in enumerate(started):
            try:
                out = _guard(entry, step, call.wait)
            except BaseException:
                for _, later in started[k + 1 :]:  # nobody will wait for these replies now
                    later.cancel()
                raise
            for name, tensor in step.outputs.items():
                if name not in out:
                    raise Internal(
                        f"ensemble '{entry.name}': {step.label} returned no output '{name}'"
                    )
                tensors[tensor] = out[name]
        done = {s.index for s in ready}
        remaining = [s for s in remaining if s.index not in done]
    return {name: tensors[name] for name in wanted}


def execute(
    entry: Any,
    inputs: dict[str, Tensor],
    wanted: list[str],
    outer: Any,
    *,
    resolve: Callable[[str], Any],
    dispatcher: Dispatcher,
    check: Callable[[str], None] | None = None,
    depth: int = 0,
) -> dict[str, Tensor]:
    """Run the graph with every step a request on its model's queue.

    ``outer`` (an InferMessage, never published) lends every step its deadline,
    priority, parameters and call chain (``calls.Caller``); ``resolve`` gives a step model's entry (raising for an unknown one) and
    ``check`` may refuse a step before it is sent (the gateway's availability check,
    BLS's cycle check). The gateway and BLS both run ensembles through here.
    """
    if depth > MAX_DEPTH:
        raise InvalidArgument(f"ensemble '{entry.name}': ensembles nested deeper than {MAX_DEPTH}")

    caller = calls.Caller(outer.deadline, outer.priority, tuple(outer.chain))
    params = {**outer.params, "timeout": outer.timeout_us} if outer.timeout_us else outer.params

    def start(step: Step, tensors: dict[str, Tensor], outs: list[str]) -> StepCall:
        if check is not None:
            check(step.model)
        to = calls.target(resolve(step.model), step.version)
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
                depth=depth + 1,
            )
            return _Done(result)
        call = calls.build(to, request, caller=caller)
        return _Queued(dispatcher.submit(call.msg, max_queue_size=call.max_queue_size))

    return run(entry, inputs, wanted, start)


def _guard(entry: Any, step: Step, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ConchError as exc:
        raise type(exc)(
            f"ensemble '{entry.name}' {step.label} failed: {exc.message}", exc.status
        ) from None
