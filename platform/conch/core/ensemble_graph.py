"""Triton ensembles as a graph: their steps, read from the config, and ``link``.

``link`` validates the graph against its step models when the repository is read (so a
broken ensemble is reported unavailable with the reason instead of failing requests) and
completes what Triton derives from them: class labels, the transaction policy. Running
the graph is a frontend's business (``conch.frontend.ensemble_runner``); the rules it runs
by are here, on configs and shapes: which steps a request needs (``needed``), how a
tensor's batch dimension is added or stripped between batching and non-batching models
(``fit_batch``), how the ensemble's own ``reshape`` turns its inputs and outputs
into the shapes its steps see (``inner_shape``, ``outer_shape``), and how many requests
each step may have in flight (``max_inflight``).

Shapes, as Triton counts them: inside the graph an ensemble input or output has its
``reshape.shape`` where it declares one (else its ``dims``), and a step's input or output
has the step model's ``dims`` (its own ``reshape`` is its backend's business: the model
sees its ``reshape.shape``, whatever the backend). Each
tensor is checked against the first place that names it (``check``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from conch.core.model_config import response_cache_problem, wire_type

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

ENSEMBLE = "ensemble"
MAX_DEPTH = 8  # ensembles of ensembles


class GraphEntry(Protocol):
    """What linking reads and writes of a repository's model (``repository.ModelEntry``,
    whose module imports this one, so it is named here by what it must have)."""

    name: str
    config: ModelConfig | None
    error: str | None
    versions: list[int]
    backend: str
    output_labels: dict[str, list[str]]


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


def steps(config: ModelConfig) -> list[Step]:
    return [
        Step(i, s.model_name, s.model_version or -1, dict(s.input_map), dict(s.output_map))
        for i, s in enumerate(config.ensemble_scheduling.step)
    ]


def max_inflight(config: ModelConfig) -> int:
    """How many requests each step of the ensemble may have in flight at once, over all
    its requests (``ensemble_scheduling.max_inflight_requests``, Triton 2.63); 0: no bound.

    Triton's backpressure for a pipeline whose early steps outrun its later ones: a step
    that would go past the bound waits for one of its requests to be answered.
    """
    return int(config.ensemble_scheduling.max_inflight_requests)


def needed(graph: list[Step], wanted: list[str]) -> list[Step]:
    """The steps that make the ``wanted`` ensemble tensors, in graph order.

    A step runs when one of its outputs is wanted or feeds a step that runs; the others
    are skipped, as Triton prunes them (a request that names no outputs wants them all).
    """
    need = set(wanted)
    keep: set[int] = set()
    grew = True
    while grew:  # backwards from the wanted tensors; a valid graph has no cycle
        grew = False
        for step in graph:
            if step.index not in keep and need.intersection(step.outputs.values()):
                keep.add(step.index)
                need.update(step.inputs.values())
                grew = True
    return [s for s in graph if s.index in keep]


def fit_batch(dims: Any, batching: bool, batch: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` as a model declaring ``dims`` (with a batch dimension when ``batching``)
    takes it, for a tensor that carries a batch of ``batch`` (0: none).

    Triton's rule between batching and non-batching models: a tensor without a batch
    gets one of 1 when its shape is the model's dims; a batch of 1 is dropped when its
    shape is not already the model's dims. Any other shape goes as it is, for the
    step's own checks to judge.
    """
    if batching == (batch != 0):
        return shape
    declared = [int(d) for d in dims]
    if batching:
        return (1, *shape) if _compatible(declared, list(shape)) else shape
    if batch == 1 and not _compatible(declared, list(shape)):
        return shape[1:]
    return shape


def _reshaped(source: Any, target: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape``, which fits the dims ``source``, in the dims ``target``: each -1 of
    ``target`` takes the size of the next -1 of ``source``, in order (Triton's rule for a
    ``reshape`` with variable dimensions). A shape that does not fit ``source``, or
    whose elements would not add up, is left as it is, for a step's own checks to judge.
    """
    src, dst = [int(d) for d in source], [int(d) for d in target]
    if not _compatible(src, list(shape)):
        return shape
    variable = iter(n for n, d in zip(shape, src, strict=True) if d == -1)
    out = tuple(next(variable, -1) if d == -1 else d for d in dst)
    if -1 in out or next(variable, None) is not None or math.prod(out) != math.prod(shape):
        return shape
    return out


def _split(batching: bool, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (shape[:1], shape[1:]) if batching and shape else ((), shape)


def inner_shape(config: ModelConfig, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """An ensemble input of ``shape`` (its ``dims``, checked) as the graph holds it: in
    its ``reshape.shape`` where it declares one, behind the ensemble's batch dimension."""
    entry = next((i for i in config.input if i.name == name), None)
    if entry is None or not entry.HasField("reshape"):
        return shape
    lead, rest = _split(config.max_batch_size > 0, shape)
    return (*lead, *_reshaped(entry.dims, entry.reshape.shape, rest))


def _own(io: Any) -> Any:
    """An ensemble input's or output's dims inside its graph: its reshape, if any."""
    return io.reshape.shape if io.HasField("reshape") else io.dims


def output_dims(config: ModelConfig, name: str) -> list[int]:
    """The dims an ensemble output has inside the graph: its ``reshape.shape``, if any."""
    entry = next((o for o in config.output if o.name == name), None)
    if entry is None:
        return []
    return [int(d) for d in _own(entry)]


def outer_shape(config: ModelConfig, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """An ensemble output of ``shape`` (already fitted to its ``output_dims`` by
    ``fit_batch``) as the response gives it: in its ``dims``."""
    entry = next((o for o in config.output if o.name == name), None)
    if entry is None or not entry.HasField("reshape"):
        return shape
    lead, rest = _split(config.max_batch_size > 0, shape)
    return (*lead, *_reshaped(entry.reshape.shape, entry.dims, rest))


def batch_of(config: ModelConfig, shape: tuple[int, ...]) -> int:
    """The batch a tensor of ``shape`` carries into or out of a model with ``config``."""
    return shape[0] if config.max_batch_size > 0 and shape else 0


def _full_shape(config: ModelConfig, dims: Any) -> list[int]:
    return ([-1] if config.max_batch_size > 0 else []) + [int(d) for d in dims]


def _compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


# A tensor's shape as one model declares it: (dims, full shape with any batch dimension).
_Shape = tuple[list[int], list[int]]


def _consistent(a: _Shape, b: _Shape) -> bool:
    """Two (dims, full shape) views of one tensor agree: by dims, or by full shape when
    one model batches and the other does not (``fit_batch`` bridges them at run time)."""
    return _compatible(a[0], b[0]) or _compatible(a[1], b[1])


def _shape(config: ModelConfig, dims: Any) -> _Shape:
    return [int(d) for d in dims], _full_shape(config, dims)


# Where a tensor is named, and what it is there: (label, datatype, shape).
_Node = tuple[str, str, _Shape]


def check(entry: GraphEntry, entries: Mapping[str, GraphEntry]) -> str | None:
    """Why this ensemble cannot serve, or None. Step models must have been read.

    Each tensor is taken as the first place that names it has it (the ensemble's inputs,
    then its outputs, then each step's inputs and outputs in order), and every other place
    must agree: same datatype, and dims that match (-1 matching anything), or full shapes
    that match once the batch dimension of a batching model is counted in. The ensemble's
    own inputs and outputs count by their ``reshape`` where they declare one; a step's by
    its model's ``dims``.
    """
    cfg = entry.config
    where = f"ensemble '{entry.name}'"
    graph = steps(cfg)
    if not graph:
        return f"{where}: ensemble_scheduling has no step"
    first: dict[str, _Node] = {}

    def agree(tensor: str, node: _Node) -> str | None:
        seen = first.setdefault(tensor, node)
        if seen is node or (seen[1] == node[1] and _consistent(seen[2], node[2])):
            return None
        return (
            f"{where}: tensor '{tensor}' is {seen[1]} {seen[2][1]} as {seen[0]} but "
            f"{node[1]} {node[2][1]} as {node[0]}"
        )

    for kind, ios in (("input", cfg.input), ("output", cfg.output)):
        for io in ios:
            label = f"the ensemble's {kind}" + (" (its reshape)" if io.HasField("reshape") else "")
            first.setdefault(io.name, (label, wire_type(io.data_type), _shape(cfg, _own(io))))
    producer: dict[str, str] = {i.name: "the ensemble's input" for i in cfg.input}
    consumed: list[tuple[Step, str, str]] = []  # step, tensor, step model input
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
        # A step model that does not batch takes the ensemble's batches of one (fit_batch).
        if 0 < tcfg.max_batch_size < cfg.max_batch_size:
            return (
                f"{where}: max_batch_size {cfg.max_batch_size} but {step.label} batches at most "
                f"{tcfg.max_batch_size}"
            )
        t_outputs = {o.name: o for o in tcfg.output}
        names = {i.name for i in tcfg.input}
        for name in step.inputs:
            if name not in names:
                return f"{where}: {step.label} maps input '{name}', which model '{step.model}' does not have"
        for i in tcfg.input:  # in the model's order, as Triton meets them
            if i.name not in step.inputs:
                if i.optional:
                    continue
                return (
                    f"{where}: {step.label}: input '{i.name}' of model '{step.model}' is not mapped"
                )
            tensor = step.inputs[i.name]
            label = f"input '{i.name}' of {step.label}"
            problem = agree(tensor, (label, wire_type(i.data_type), _shape(tcfg, i.dims)))
            if problem:
                return problem
            consumed.append((step, tensor, i.name))
        for name, tensor in step.outputs.items():
            if name not in t_outputs:
                return f"{where}: {step.label} maps output '{name}', which model '{step.model}' does not have"
            if tensor in producer:
                return f"{where}: tensor '{tensor}' is produced twice: by {producer[tensor]} and by {step.label}"
            producer[tensor] = step.label
            o = t_outputs[name]
            label = f"output '{name}' of {step.label}"
            problem = agree(tensor, (label, wire_type(o.data_type), _shape(tcfg, o.dims)))
            if problem:
                return problem
    for step, tensor, name in consumed:
        if tensor not in producer:
            return f"{where}: tensor '{tensor}' (input '{name}' of {step.label}) is produced by nothing"
    for o in cfg.output:
        if o.name not in producer:
            return f"{where}: output '{o.name}' is produced by no step"
    cycle = _cycle(graph, cfg)
    if cycle:
        return f"{where}: its steps form a cycle: {cycle}"
    return None


def link(entry: GraphEntry, entries: Mapping[str, GraphEntry]) -> None:
    """Check the ensemble against its step models (``entry.error`` says why it cannot
    serve) and complete what Triton derives from them: an output with no
    ``label_filename`` of its own takes the labels of the step output it comes from, and
    ``model_transaction_policy`` is decoupled if a step model is."""
    entry.error = check(entry, entries)
    if entry.error:
        return
    outputs = {o.name for o in entry.config.output}
    decoupled = False
    for step in steps(entry.config):
        target = entries[step.model]
        decoupled |= target.config.model_transaction_policy.decoupled
        for name, tensor in step.outputs.items():
            labels = target.output_labels.get(name)
            if tensor in outputs and labels and tensor not in entry.output_labels:
                entry.output_labels[tensor] = labels
    entry.config.model_transaction_policy.decoupled = decoupled
    problem = response_cache_problem(entry.config)
    entry.error = f"ensemble '{entry.name}': {problem}" if problem else None


def link_all(entries: Mapping[str, GraphEntry]) -> None:
    """``link`` every ensemble of a repository, each after the ensembles it calls."""
    done: set[str] = set()

    def visit(name: str, depth: int) -> None:
        done.add(name)
        entry = entries[name]
        for step in steps(entry.config):
            inner = entries.get(step.model)
            if (
                step.model not in done
                and inner is not None
                and inner.backend == ENSEMBLE
                and not inner.error
                and depth < MAX_DEPTH
            ):
                visit(step.model, depth + 1)
        link(entry, entries)

    for name, entry in entries.items():
        if entry.backend == ENSEMBLE and not entry.error and name not in done:
            visit(name, 0)


def _cycle(graph: list[Step], cfg: ModelConfig) -> str | None:
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
