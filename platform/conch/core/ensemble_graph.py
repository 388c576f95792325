"""Triton ensembles as a graph: their steps, read from the config, and ``check``.

``check`` validates the graph when the repository is read, so a broken ensemble is
reported unavailable with the reason instead of failing requests. Running the graph is a
frontend's business (``conch.frontend.ensemble_runner``): this module only knows configs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conch.core.model_config import wire_type

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
