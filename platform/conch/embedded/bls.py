"""BLS inside an embedded server: a Python model calling another model in the same process.

``EmbeddedBls`` is the Python backend's ``BlsPort`` for an ``Engine``: a call is checked
exactly as a fleet's BLS checks it (``core.bls_call``: the target, its version, inputs,
outputs, parameters and timeout, and the cycle rule), then queued on the target's own
scheduler, so it is batched with everything else sent to that model. It inherits the
calling batch's deadline, priority and call chain (``core.call_context.CURRENT``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np

from conch.core import bls_call, tensors
from conch.core.call_context import CURRENT
from conch.core.ensemble_graph import ENSEMBLE
from conch.core.errors import ConchError, Internal
from conch.core.model_spec import BlsRequest, BlsResponse
from conch.embedded.scheduler import Caller

if TYPE_CHECKING:
    from conch.core.inference import InferRequest
    from conch.core.repository import ModelEntry
    from conch.embedded.responses import Answer, Responses


class ServedModel(Protocol):
    """A loaded model, as BLS reads it: the entry it was loaded from."""

    entry: ModelEntry


class BlsEngine(Protocol):
    """What BLS asks of the engine (``embedded.engine.Engine``, which imports this module
    to hand its Python models a port, so it is named here by what it must do)."""

    def serving(self, name: str) -> ServedModel: ...

    def infer(self, name: str, version: str, request: InferRequest, caller: Caller) -> Responses:
        """Check ``request`` and queue it on the model's scheduler."""
        ...

    def ready(self, name: str, version: str = "") -> bool: ...

    def load(self, name: str) -> None: ...

    def unload(self, name: str, unload_dependents: bool = False) -> None: ...


class EmbeddedBls:
    """The ``BlsPort`` an embedded server hands its Python models."""

    def __init__(self, engine: BlsEngine) -> None:
        self.engine = engine

    def infer(self, request: BlsRequest, decoupled: bool = False) -> list[tuple[str, np.ndarray]]:
        if decoupled:
            raise Internal(
                f"BLS request to model '{request.model_name}': a call that may answer many "
                "times goes through stream, not infer"
            )
        return _as_numpy(self._call(request, decoupled=False).one())

    def stream(self, request: BlsRequest) -> EmbeddedBlsStream:
        return EmbeddedBlsStream(self._call(request, decoupled=True))

    def _call(self, request: BlsRequest, *, decoupled: bool) -> Responses:
        target = bls_call.target_name(request)
        ctx = CURRENT.get()
        if ctx is not None:
            problem = bls_call.refusal(ctx, target)
            if problem is not None:
                raise problem
        served = self.engine.serving(target)
        checked = bls_call.check(request, served.entry)
        entry = served.entry
        if (
            not decoupled
            and entry.backend != ENSEMBLE
            and entry.config.model_transaction_policy.decoupled
        ):
            raise bls_call.decoupled_refused(target)
        caller = (
            Caller(ctx.deadline, tuple(ctx.waiting()), ctx.priority)
            if ctx is not None
            else Caller()
        )
        return self.engine.infer(target, checked.version, checked.request, caller)

    def is_ready(self, name: str, version: str | int = "") -> bool:
        return self.engine.ready(str(name), "" if version is None else str(version).strip())

    def load(self, name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
        if config or files:
            raise Internal(
                f"loading model '{name}' with a config or files is not supported by an "
                "embedded conch.Server: change the repository and load it by name"
            )
        self.engine.load(str(name))

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        self.engine.unload(str(name), bool(unload_dependents))


class EmbeddedBlsStream:
    """A BLS call's responses as they come (``BlsResponses``)."""

    def __init__(self, responses: Responses) -> None:
        self._responses = responses

    def __iter__(self) -> Iterator[BlsResponse]:
        return self

    def __next__(self) -> BlsResponse:
        answer = next(self._responses)
        return BlsResponse(_as_numpy(answer), final=answer.final)

    def cancel(self) -> None:
        self._responses.close()


def _as_numpy(answer: Answer) -> list[tuple[str, np.ndarray]]:
    try:
        return [
            (t.name, tensors.to_numpy(t.datatype, t.shape, t.raw, t.name)) for t in answer.outputs
        ]
    except ConchError as exc:
        raise Internal(f"unreadable answer: {exc.message}") from None


__all__ = ["EmbeddedBls", "EmbeddedBlsStream"]
