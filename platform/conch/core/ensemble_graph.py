"""Triton ensembles as a graph: their steps, read from the config, and ``link``.

``link`` validates the graph against its step models when the repository is read (so a
broken ensemble is reported unavailable with the reason instead of failing requests) and
completes what Triton derives from them: class labels, the transaction policy. Running
the graph is a frontend's business (``conch.frontend.ensemble_runner``); the rules it runs
by are here, on configs and shapes: which steps a request needs (``needed``) and how a
tensor's batch dimension is added or stripped between batching and non-batching models
(``fit_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conch.core.model_config import response_cache_problem, wire_type

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig
    from conch.core.repository import ModelEntry

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


def steps(config: ModelConfig) -> list[Step]:
    return [
        Step(i, s.model_name, s.model_version or -1, dict(s.input_map), dict(s.output_map))
        for i, s in enumerate(config.ensemble_scheduling.step)
    ]


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


def check(entry: ModelEntry, entries: dict[str, ModelEntry]) -> str | None:
    """Why this ensemble cannot serve, or None. Step models must have been read."""
    cfg = entry.config
    where = f"ensemble '{entry.name}'"
    graph = steps(cfg)
    if not graph:
        return f"{where}: ensemble_scheduling has no step"
    # tensor -> (producer label, datatype, shape)
    produced: dict[str, tuple[str, str, _Shape]] = {
        i.name: ("the ensemble's input", wire_type(i.data_type), _shape(cfg, i.dims))
        for i in cfg.input
    }
    consumers: list[tuple[Step, str, str, _Shape, str]] = []  # step, tensor, type, shape, input
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
            consumers.append((step, tensor, wire_type(i.data_type), _shape(tcfg, i.dims), name))
        for name, tensor in step.outputs.items():
            if name not in t_outputs:
                return f"{where}: {step.label} maps output '{name}', which model '{step.model}' does not have"
            if tensor in produced:
                return f"{where}: tensor '{tensor}' is produced twice: by {produced[tensor][0]} and by {step.label}"
            o = t_outputs[name]
            produced[tensor] = (step.label, wire_type(o.data_type), _shape(tcfg, o.dims))
    for step, tensor, dtype, shape, name in consumers:
        if tensor not in produced:
            return f"{where}: tensor '{tensor}' (input '{name}' of {step.label}) is produced by nothing"
        source, p_type, p_shape = produced[tensor]
        if p_type != dtype or not _consistent(p_shape, shape):
            return (
                f"{where}: tensor '{tensor}' is {p_type} {p_shape[1]} from {source} but input "
                f"'{name}' of {step.label} takes {dtype} {shape[1]}"
            )
    for o in cfg.output:
        if o.name not in produced:
            return f"{where}: output '{o.name}' is produced by no step"
        source, p_type, p_shape = produced[o.name]
        want = (wire_type(o.data_type), _shape(cfg, o.dims))
        if p_type != want[0] or not _consistent(p_shape, want[1]):
            return (
                f"{where}: output '{o.name}' is declared {want[0]} {want[1][1]} but {source} "
                f"produces {p_type} {p_shape[1]}"
            )
    cycle = _cycle(graph, cfg)
    if cycle:
        return f"{where}: its steps form a cycle: {cycle}"
    return None


def link(entry: ModelEntry, entries: dict[str, ModelEntry]) -> None:
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


def link_all(entries: dict[str, ModelEntry]) -> None:
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
