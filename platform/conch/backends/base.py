"""The small interface every backend implements.

A backend loads one version of one model for one instance and executes batches of
requests. Backends that take a stacked tensor (onnxruntime, pytorch, tensorrt) extend
``TensorBackend``, which does the concatenating and splitting once for all of them;
backends that want the batch as a list of requests (python) implement ``execute``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from conch.core.errors import ConchError, Internal, InvalidArgument
from conch.core.model_spec import BlsPort, InstanceSpec, ModelSpec

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig, ModelInput, ModelOutput

log = logging.getLogger(__name__)


def to_model_shape(model: str, entry: ModelInput, arr: np.ndarray, batched: bool) -> np.ndarray:
    """``arr`` as the model takes it: the config's ``reshape`` behind the batch dimension."""
    if not entry.HasField("reshape"):
        return arr
    lead = arr.shape[:1] if batched else ()
    try:
        return arr.reshape((*lead, *(int(d) for d in entry.reshape.shape)))
    except ValueError as exc:
        raise InvalidArgument(
            f"model '{model}': input '{entry.name}' of shape {list(arr.shape)} does not fit "
            f"its reshape {list(entry.reshape.shape)}: {exc}"
        ) from None


def to_config_shape(model: str, entry: ModelOutput, arr: np.ndarray, batched: bool) -> np.ndarray:
    """An output the model produced in its ``reshape`` shape, as the config's ``dims``."""
    if not entry.HasField("reshape"):
        return arr
    lead = arr.shape[:1] if batched else ()
    try:
        return arr.reshape((*lead, *(int(d) for d in entry.dims)))
    except ValueError as exc:
        raise Internal(
            f"model '{model}': output '{entry.name}' of shape {list(arr.shape)} does not fit "
            f"its dims {list(entry.dims)}: {exc}"
        ) from None


class Responder(Protocol):
    """Where a decoupled model's backend sends one request's responses itself, as they
    come: from ``execute`` or from any thread the model starts, even after ``execute``
    returned. The worker's runner sets one on each request of a decoupled model
    (``BackendRequest.responder``); the worker implements it (``conch.worker.streams``),
    so a backend never imports the worker."""

    def send(self, result: BackendResult | None, final: bool) -> None:
        """Send one response at once: outputs, or the error that ends the request; None
        sends no outputs (only with ``final``: the model said it was done). ``final``: the
        request's last response. Never raises for a request already ended: it logs."""

    def is_cancelled(self) -> bool:
        """Whether the caller went away for good, so the model may stop early (Triton's
        ``is_cancelled``): a client that cancelled, or did not come back in time."""


@dataclass
class BackendRequest:
    """One request inside a batch: its tensors by name and the outputs it wants."""

    inputs: dict[str, np.ndarray]
    outputs: list[str]
    request_id: str = ""  # the client's "id", as Triton hands it to backends
    parameters: dict[str, Any] = field(default_factory=dict)  # custom request parameters
    timeout_us: int = 0  # the request's "timeout" parameter (microseconds), 0 if none
    deadline: float = 0.0  # epoch seconds the caller waits until; 0 = none (BLS inherits it)
    chain: tuple[str, ...] = ()  # models waiting on this request, for BLS (conch.frontend.bls)
    priority: int = 0  # the queue priority step it came from (BLS calls inherit it)
    # A decoupled model's request: where its responses go (``Responder``); None otherwise.
    responder: Responder | None = None
    # Any other request's ``is_cancelled()`` (Triton's): whether its caller went away while
    # it runs. None where nobody can tell (warmup, a caller that cannot cancel).
    cancelled: Callable[[], bool] | None = None


# A backend answers each request with its output tensors or with the error for it.
BackendResult = dict[str, np.ndarray] | ConchError


class Backend(ABC):
    """One backend: its name, platforms and model file are in ``conch.core.backend_table``."""

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        self.spec = spec
        self.instance = instance
        # ``reshaped``'s entries with a reshape, inputs' and outputs', read from the config
        # at the first request (a backend may still complete its config while it loads).
        self._reshapes: dict[bool, dict[str, Any]] = {}

    @classmethod
    def auto_complete(
        cls, config: ModelConfig, model_file: Path | None, *, default_max_batch_size: int
    ) -> None:
        """Fill in what the config leaves out from the model itself (Triton's auto-complete).

        Raise ``ModelLoadError`` when the config contradicts the model.
        """

    @abstractmethod
    def load(self) -> None:
        """Load the model; raise ``ModelLoadError`` with the reason when it cannot be."""

    @property
    def decoupled(self) -> bool:
        """Whether the model is decoupled (``model_transaction_policy { decoupled: true }``):
        its requests carry a ``responder``, and ``execute`` may answer one with None,
        meaning it answers (or answered) through that responder."""
        return self.spec.config.model_transaction_policy.decoupled

    def reshaped(self, tensors: dict[str, np.ndarray], *, inputs: bool) -> dict[str, np.ndarray]:
        """``tensors`` (one request's, or a stacked batch's) in the model's shapes when
        ``inputs``, else a model's outputs back in the config's: each entry with a
        ``reshape`` converted, behind the batch dimension of a batching model. Triton
        does this in its core for every backend, so each of conch's backends does it
        too, and a model never sees its config's ``dims`` where it declares a reshape."""
        entries = self._reshapes.get(inputs)
        if entries is None:
            config = self.spec.config
            declared = config.input if inputs else config.output
            entries = {e.name: e for e in declared if e.HasField("reshape")}
            self._reshapes[inputs] = entries
        if not entries:
            return tensors
        batched = self.spec.config.max_batch_size > 0
        convert = to_model_shape if inputs else to_config_shape
        return {
            name: convert(self.spec.name, entries[name], arr, batched) if name in entries else arr
            for name, arr in tensors.items()
        }

    @abstractmethod
    def execute(self, requests: list[BackendRequest]) -> list[BackendResult | None]:
        """Run a batch; one result per request, in order (None: a decoupled model's
        request, answered through its ``responder``)."""

    def unload(self) -> None:
        """Release what ``load`` took."""


class TensorBackend(Backend):
    """A backend that runs one stacked tensor per input.

    Requests whose non-batch dimensions agree are concatenated along the batch
    dimension, run once and split back; others run in their own group. The worker's
    runner stacks and splits a batch itself where it can (``execute_stacked``); warmup,
    and batches that cannot be stacked that way, come through ``execute``. Tensors whose
    config has a ``reshape`` reach ``run`` in the model's shape and leave it in the
    config's (``Backend.reshaped``).
    """

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run the model once on stacked inputs."""

    @property
    def batches(self) -> bool:
        """Whether the model takes a batch dimension, so requests may be stacked."""
        return self.spec.config.max_batch_size > 0

    def execute_stacked(
        self, inputs: dict[str, np.ndarray], outputs: list[str]
    ) -> dict[str, np.ndarray]:
        """Run one batch whose requests the caller stacked already: each input holds the
        rows of every request, one after another, and so does each output returned.

        The worker's runner stacks a batch straight from the requests' raw bytes (one
        array per input, not one per request) and splits the outputs' bytes once, which
        ``execute`` cannot do from per-request arrays. Raises what ``run`` raises.
        """
        out = self.run(self.reshaped(inputs, inputs=True), outputs)
        return self.reshaped(out, inputs=False)

    def execute(self, requests: list[BackendRequest]) -> list[BackendResult]:
        results: list[BackendResult | None] = [None] * len(requests)
        if not self.batches:
            groups = [[i] for i in range(len(requests))]
        else:
            keyed: dict[tuple, list[int]] = {}
            for i, req in enumerate(requests):
                key = tuple(
                    (name, arr.dtype.str, arr.shape[1:]) for name, arr in sorted(req.inputs.items())
                )
                keyed.setdefault(key, []).append(i)
            groups = list(keyed.values())
        for group in groups:
            wanted = sorted({name for i in group for name in requests[i].outputs})
            try:
                if len(group) == 1:
                    stacked = requests[group[0]].inputs
                else:
                    names = requests[group[0]].inputs.keys()
                    stacked = {
                        n: np.concatenate([requests[i].inputs[n] for i in group]) for n in names
                    }
                out = self.execute_stacked(stacked, wanted)
            except ConchError as exc:
                for i in group:
                    results[i] = exc
                continue
            except Exception as exc:  # the backend's own failure fails this group only
                err = Internal(f"model '{self.spec.name}' failed to execute: {exc}")
                for i in group:
                    results[i] = err
                continue
            if len(group) == 1:
                results[group[0]] = out
                continue
            rows = [
                next(iter(requests[i].inputs.values())).shape[0] if requests[i].inputs else 0
                for i in group
            ]
            splits = np.cumsum(rows)[:-1]
            parts = {n: np.split(arr, splits) for n, arr in out.items()}
            for k, i in enumerate(group):
                results[i] = {n: parts[n][k] for n in requests[i].outputs if n in parts}
        return [
            r if r is not None else InvalidArgument("request produced no result") for r in results
        ]


def execute_answered(
    backend: Backend, requests: list[BackendRequest], where: str
) -> list[BackendResult | None]:
    """``backend``'s results for ``requests``, its failure given as each request's error,
    so one batch's failure never escapes the loop that runs it (a worker's drain loop, an
    embedded server's instance thread); ``where`` names that loop in the log."""
    try:
        return backend.execute(requests)
    except ConchError as exc:
        return [exc] * len(requests)
    except Exception as exc:
        log.exception("%s: backend failed", where)
        model = backend.spec.name
        return [Internal(f"model '{model}' failed to execute: {exc}")] * len(requests)


__all__ = [
    "Backend",
    "BackendRequest",
    "BackendResult",
    "BlsPort",
    "InstanceSpec",
    "ModelSpec",
    "Responder",
    "TensorBackend",
    "execute_answered",
    "to_config_shape",
    "to_model_shape",
]
