"""An ensemble's graph run over whatever starts its steps.

Which steps can go once their inputs exist, every ready step started before any is waited
for (independent steps run side by side), the tensors fitted between batching and
non-batching steps, and the ensemble's outputs read in its own shapes. How a step is
started is the caller's: a frontend sends it to its model's queue
(``conch.frontend.ensemble_runner``), an embedded server runs it in its own process
(``conch.embedded``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from conch.core.ensemble_graph import (
    Step,
    Tensor,
    batch_of,
    fit_batch,
    inner_shape,
    max_inflight,
    needed,
    outer_shape,
    output_dims,
    steps,
)
from conch.core.errors import ConchError, Internal, Unavailable

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig
    from conch.core.repository import ModelEntry


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


# Gives a step's in-flight slot back (once: ``run`` calls it when the step is answered,
# cancelled, or could not be sent).
Release = Callable[[], None]

# Triton's wait for a step slot before it sends the step anyway (its ensemble scheduler's
# mutex timeout), so that a bound that never frees cannot hang a request with no deadline.
PATIENCE_S = 300.0

log = logging.getLogger(__name__)


class StepSlots(Protocol):
    """Where an ensemble's ``max_inflight_requests`` is counted: each of its steps may
    have at most that many requests in flight, over all the ensemble's requests."""

    def take(self, ensemble: str, step: Step, limit: int) -> Release:
        """Wait until ``step`` has fewer than ``limit`` requests in flight and count one
        more; its ``Release`` counts it out. Raises why the wait ended without a slot
        (the request's deadline passed, its caller went away)."""
        ...


def slot_timeout(ensemble: str, step: Step, limit: int) -> Unavailable:
    """The error of a request whose deadline passed while ``step`` had no free slot."""
    return Unavailable(
        f"Request timeout expired for ensemble '{ensemble}': {step.label} had "
        f"max_inflight_requests {limit} requests in flight until the request's deadline"
    )


def impatient(ensemble: str, step: Step, limit: int) -> None:
    """Log that ``step`` goes without a slot after ``PATIENCE_S``, as Triton does."""
    log.error(
        "ensemble '%s': %s waited %.0f s for one of its max_inflight_requests %d slots; "
        "sending it without one",
        ensemble,
        step.label,
        PATIENCE_S,
        limit,
    )


class InProcessSlots:
    """``max_inflight_requests`` counted in this process: for a server whose ensembles
    all run here (``conch.embedded``). ``take`` waits until the caller's ``deadline``
    (epoch seconds; 0: none)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: dict[tuple[str, int], int] = {}

    def take(self, ensemble: str, step: Step, limit: int, deadline: float) -> Release:
        key = (ensemble, step.index)
        patience = time.monotonic() + PATIENCE_S
        with self._cond:
            while self._held.get(key, 0) >= limit:
                now = time.time()
                if deadline and now >= deadline:
                    raise slot_timeout(ensemble, step, limit)
                left = patience - time.monotonic()
                if left <= 0:
                    impatient(ensemble, step, limit)
                    return lambda: None
                self._cond.wait(min(left, deadline - now) if deadline else left)
            self._held[key] = self._held.get(key, 0) + 1
        return lambda: self._give_back(key)

    def until(self, deadline: float) -> StepSlots:
        """These slots as one request takes them: its waits end at ``deadline``."""
        return _Until(self, deadline)

    def _give_back(self, key: tuple[str, int]) -> None:
        with self._cond:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]
            self._cond.notify_all()


class _Until:
    def __init__(self, slots: InProcessSlots, deadline: float) -> None:
        self.slots = slots
        self.deadline = deadline

    def take(self, ensemble: str, step: Step, limit: int) -> Release:
        return self.slots.take(ensemble, step, limit, self.deadline)


class _Holding:
    """A step in flight that holds one of its step's slots until it is answered."""

    def __init__(self, call: StepCall, release: Release) -> None:
        self.call = call
        self.release = release

    def wait(self) -> dict[str, Tensor]:
        try:
            return self.call.wait()
        finally:
            self.release()

    def cancel(self) -> None:
        try:
            self.call.cancel()
        finally:
            self.release()


class Done:
    """A step already run (a nested ensemble)."""

    def __init__(self, outputs: dict[str, Tensor]) -> None:
        self.outputs = outputs

    def wait(self) -> dict[str, Tensor]:
        return self.outputs

    def cancel(self) -> None:
        pass


def run(
    entry: ModelEntry,
    inputs: dict[str, Tensor],
    wanted: list[str],
    start: StepRunner,
    config_of: Callable[[Step], ModelConfig],
    slots: StepSlots | None = None,
) -> dict[str, Tensor]:
    """Execute the steps the ``wanted`` outputs need; a failing step fails the request
    with its error and model.

    With ``slots``, an ensemble that sets ``max_inflight_requests`` sends each step only
    once it holds one of that step's slots, and holds it until the step is answered.

    ``config_of`` gives a step model's config, or raises why the step may not be sent;
    each input is fitted to that config (``ensemble_graph.fit_batch``), so batching and
    non-batching models mix as in Triton. As in Triton, the ensemble's inputs enter the
    graph in their ``reshape`` shape where they declare one, and its outputs leave it in
    their ``dims`` (the bytes never change, only the shape they are read in).
    """
    cfg = entry.config
    limit = max_inflight(cfg)
    # None: a tensor that exists in the graph but holds nothing, as in Triton: an optional
    # ensemble input the request left out, or an output a step did not return. A step
    # is sent without it (its model must take it as optional, or refuse the request).
    tensors: dict[str, Tensor | None] = {
        name: (dt, inner_shape(cfg, name, shape), raw) for name, (dt, shape, raw) in inputs.items()
    }
    batch = {name: batch_of(cfg, shape) for name, (_, shape, _) in inputs.items()}
    for absent in (i.name for i in cfg.input if i.optional and i.name not in inputs):
        tensors[absent], batch[absent] = None, 0

    def publish(step: Step) -> tuple[StepCall, int]:
        """Send the step; the batch its outputs carry (0: none)."""
        step_cfg = config_of(step)
        dims = {i.name: i.dims for i in step_cfg.input}
        batching = step_cfg.max_batch_size > 0
        fitted: dict[str, Tensor] = {}
        for name, t in step.inputs.items():
            tensor = tensors[t]
            if tensor is None:
                continue
            dt, shape, raw = tensor
            fitted[name] = (dt, fit_batch(dims.get(name, ()), batching, batch[t], shape), raw)
        rows = next((batch_of(step_cfg, shape) for _, shape, _ in fitted.values()), 0)
        if slots is None or limit <= 0:
            return start(step, fitted, list(step.outputs)), rows
        release = slots.take(entry.name, step, limit)
        try:
            return _Holding(start(step, fitted, list(step.outputs)), release), rows
        except BaseException:
            release()
            raise

    remaining = needed(steps(cfg), wanted)
    while remaining:
        ready = [s for s in remaining if all(t in tensors for t in s.inputs.values())]
        if not ready:  # check() rules this out; never loop forever on a bad graph
            raise Internal(f"ensemble '{entry.name}': no step can run with the tensors produced")
        started: list[tuple[Step, StepCall, int]] = []
        try:
            for step in ready:  # publish every ready step before waiting on any
                started.append((step, *_guard(entry, step, lambda s=step: publish(s))))
            while started:
                step, call, rows = started.pop(0)
                out = _guard(entry, step, call.wait)
                for name, tensor in step.outputs.items():
                    tensors[tensor], batch[tensor] = out.get(name), rows
        except BaseException:
            for _, later, _ in started:  # nobody will wait for these replies now
                later.cancel()
            raise
        done = {s.index for s in ready}
        remaining = [s for s in remaining if s.index not in done]
    result: dict[str, Tensor] = {}
    for name in wanted:  # as the ensemble declares them: its own batch dimension or none
        tensor = tensors[name]
        if tensor is None:  # nothing produced it: the response leaves it out, as Triton's
            continue
        dt, shape, raw = tensor
        fitted = fit_batch(output_dims(cfg, name), cfg.max_batch_size > 0, batch[name], shape)
        result[name] = (dt, outer_shape(cfg, name, fitted), raw)
    return result


def _guard(entry: ModelEntry, step: Step, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ConchError as exc:
        raise type(exc)(
            f"ensemble '{entry.name}' {step.label} failed: {exc.message}", exc.status
        ) from None
