"""Triton ensembles: a graph of steps, each a request on its step model's own queue.

An ensemble has no worker of its own. The gateway runs its graph: every step whose
inputs exist is published at once (independent steps run in parallel, each batched with
everyone else's traffic to its model), and the outer request's deadline bounds them all.
``check`` validates the graph when the repository is read, so a broken ensemble is
reported unavailable with the reason instead of failing requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import wire_type
from .errors import ConchError, Internal, InvalidArgument

ENSEMBLE = "ensemble"
MAX_DEPTH = 8  # ensembles of ensembles


@dataclass(frozen=True)
class Step:
    index: int
    model: str
    version: int  # -1: the latest served
    inputs: dict[str, str]  # step model input -> ensemble tensor
    outputs: dict[str, str]  # step model output -> ensemble tensor

    @property
    def label(self) -> str:
        return f"step {self.index} ('{self.model}')"


# A tensor in flight: (datatype, shape, Triton binary bytes).
Tensor = tuple[str, tuple[int, ...], bytes]


def steps(config: Any) -> list[Step]:
    return [
        Step(i, s.model_name, s.model_version or -1, dict(s.input_map), dict(s.output_map))
        for i, s in enumerate(config.ensemble_scheduling.step)
    ]


def _full_shape(config: Any, dims: Any) -> list[int]:
    return ([-1] if config.max_batch_size > 0 else []) + [int(d) for d in dims]


def _compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def check(entry: Any, entries: dict[str, Any]) -> str | None:
    """Why this ensemble cannot serve, or None. Step models must have been read."""
    cfg = entry.config
    where = f"ensemble '{entry.name}'"
    graph = steps(cfg)
    if not graph:
        return f"{where}: ensemble_scheduling has no step"
    # tensor -> (producer label, datatype, full shape)
    produced: dict[str, tuple[str, str, list[int]]] = {
        i.name: ("the ensemble's input", wire_type(i.data_type), _full_shape(cfg, i.dims))
        for i in cfg.input
    }
    consumers: list[tuple[Step, str, str, list[int], str]] = []  # step, tensor, type, shape, input
    for step in graph:
        target = entries.get(step.model)
        if target is None:
            return (
                f"{where}: {step.label} names model '{step.model}', which is not in the repository"
            )
        if target.error or target.config is None:
            return f"{where}: {step.label}: model '{step.model}' is unavailable: {target.error}"
        if step.version != -1 and step.version not in target.versions:
            return f"{where}: {step.label} asks for version {step.version} of '{step.model}', which is not served"
        tcfg = target.config
        if cfg.max_batch_size > 0 and tcfg.max_batch_size < cfg.max_batch_size:
            return (
                f"{where}: max_batch_size {cfg.max_batch_size} but {step.label} batches at most "
                f"{tcfg.max_batch_size}"
            )
        t_inputs = {i.name: i for i in tcfg.input}
        t_outputs = {o.name: o for o in tcfg.output}
        for name in step.inputs:
            if name not in t_inputs:
                return f"{where}: {step.label} maps input '{name}', which model '{step.model}' does not have"
        for name, inp in t_inputs.items():
            if name not in step.inputs and not inp.optional:
                return (
                    f"{where}: {step.label}: input '{name}' of model '{step.model}' is not mapped"
                )
        for name, tensor in step.inputs.items():
            i = t_inputs[name]
            consumers.append(
                (step, tensor, wire_type(i.data_type), _full_shape(tcfg, i.dims), name)
            )
        for name, tensor in step.outputs.items():
            if name not in t_outputs:
                return f"{where}: {step.label} maps output '{name}', which model '{step.model}' does not have"
            if tensor in produced:
                return f"{where}: tensor '{tensor}' is produced twice: by {produced[tensor][0]} and by {step.label}"
            o = t_outputs[name]
            produced[tensor] = (step.label, wire_type(o.data_type), _full_shape(tcfg, o.dims))
    for step, tensor, dtype, shape, name in consumers:
        if tensor not in produced:
            return f"{where}: tensor '{tensor}' (input '{name}' of {step.label}) is produced by nothing"
        source, p_type, p_shape = produced[tensor]
        if p_type != dtype or not _compatible(p_shape, shape):
            return (
                f"{where}: tensor '{tensor}' is {p_type} {p_shape} from {source} but input "
                f"'{name}' of {step.label} takes {dtype} {shape}"
            )
    for o in cfg.output:
        if o.name not in produced:
            return f"{where}: output '{o.name}' is produced by no step"
        source, p_type, p_shape = produced[o.name]
        want = (wire_type(o.data_type), _full_shape(cfg, o.dims))
        if p_type != want[0] or not _compatible(p_shape, want[1]):
            return (
                f"{where}: output '{o.name}' is declared {want[0]} {want[1]} but {source} "
                f"produces {p_type} {p_shape}"
            )
    cycle = _cycle(graph, cfg)
    if cycle:
        return f"{where}: its steps form a cycle: {cycle}"
    return None


def _cycle(graph: list[Step], cfg: Any) -> str | None:
    producer = {t: s for s in graph for t in s.outputs.values()}
    state: dict[int, int] = {}  # 1 visiting, 2 done
    path: list[Step] = []

    def visit(step: Step) -> str | None:
        state[step.index] = 1
        path.append(step)
        for tensor in step.inputs.values():
            dep = producer.get(tensor)
            if dep is None:
                continue
            if state.get(dep.index) == 1:
                loop = [*path[path.index(dep) :], dep]
                return " -> ".join(s.label for s in loop)
            if state.get(dep.index) is None:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[step.index] = 2
        return None

    for s in graph:
        if s.index not in state:
            found = visit(s)
            if found:
                return found
    return None


# Runs one step: (step, its input tensors, names of outputs wanted) -> a waiter that
# returns the step model's outputs by name (or raises its error).
StepRunner = Callable[[Step, dict[str, Tensor], list[str]], Callable[[], dict[str, Tensor]]]


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
        waiters = []
        for step in ready:  # publish every ready step before waiting on any
            step_inputs = {name: tensors[t] for name, t in step.inputs.items()}
            waiters.append(
                (
                    step,
                    _guard(entry, step, lambda s=step, i=step_inputs: start(s, i, list(s.outputs))),
                )
            )
        for k, (step, waiter) in enumerate(waiters):
            try:
                out = _guard(entry, step, waiter)
            except BaseException:
                for _, later in waiters[k + 1 :]:  # nobody will wait for these replies now
                    cancel = getattr(later, "cancel", None)
                    if cancel is not None:
                        cancel()
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
    dispatcher: Any,
    check: Callable[[str], None] | None = None,
    depth: int = 0,
) -> dict[str, Tensor]:
    """Run the graph with every step a request on its model's queue.

    ``outer`` (an InferMessage) lends every step its deadline, priority, parameters and
    call chain; ``resolve`` gives a step model's entry (raising for an unknown one) and
    ``check`` may refuse a step before it is sent (the gateway's availability check,
    BLS's cycle check). The gateway and BLS both run ensembles through here.
    """
    from . import codec, scheduling, validation
    from .broker import new_id
    from .wire import InferMessage

    if depth > MAX_DEPTH:
        raise InvalidArgument(f"ensemble '{entry.name}': ensembles nested deeper than {MAX_DEPTH}")

    def start(
        step: Step, tensors: dict[str, Tensor], outs: list[str]
    ) -> Callable[[], dict[str, Tensor]]:
        if check is not None:
            check(step.model)
        target = resolve(step.model)
        version = target.resolve_version("" if step.version == -1 else str(step.version))
        wire = [(n, dt, shape, raw) for n, (dt, shape, raw) in tensors.items()]
        # The step's inputs are checked against its own config, as a client's would be.
        validation.validate_request(
            codec.InferRequest(
                id="",
                inputs=[codec.InputTensor(*t) for t in wire],
                outputs=[codec.RequestedOutput(o, True) for o in outs],
                binary_data_output=True,
                parameters={},
            ),
            target.config,
            model_name=step.model,
        )
        if target.backend == ENSEMBLE:
            result = execute(
                target,
                tensors,
                outs,
                outer,
                resolve=resolve,
                dispatcher=dispatcher,
                check=check,
                depth=depth + 1,
            )
            return lambda: result
        admission = scheduling.admit(target.config, None, outer.timeout_us or None)
        msg = InferMessage(
            id=new_id(),
            model=step.model,
            version=-1 if step.version == -1 else version,  # -1: the worker's latest
            inputs=wire,
            outputs=outs,
            reply_to=None,
            enqueued=time.time(),
            deadline=outer.deadline,
            priority=outer.priority,
            params=outer.params,
            client_id=outer.client_id,
            timeout_us=outer.timeout_us,
            chain=list(outer.chain),
        )
        waiter = dispatcher.submit(msg, max_queue_size=admission.max_queue_size)

        def wait() -> dict[str, Tensor]:
            reply = waiter()
            if reply.error is not None:
                raise reply.error
            return {n: (dt, tuple(shape), raw) for n, dt, shape, raw in reply.outputs or ()}

        wait.cancel = getattr(waiter, "cancel", None)  # type: ignore[attr-defined]
        return wait

    return run(entry, inputs, wanted, start)


def _guard(entry: Any, step: Step, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ConchError as exc:
        raise type(exc)(
            f"ensemble '{entry.name}' {step.label} failed: {exc.message}", exc.status
        ) from None
