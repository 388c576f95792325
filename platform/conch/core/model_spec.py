"""A model version to load, as the repository describes it to a backend.

The repository builds these (``ModelEntry.spec`` and ``ModelEntry.instances``) and the
worker hands them to backends, so they live in the core: the repository does not import
the backends to describe what they should load. ``conch.backends.base`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from conch.core.backend_table import model_filename

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig


@dataclass(frozen=True)
class InstanceSpec:
    """One model instance, as Triton names them: ``<group>_<index>``."""

    name: str
    kind: str  # "CPU" | "GPU" | "MODEL"
    device_id: int = 0


@dataclass
class BlsRequest:
    """A Python model's ``pb_utils.InferenceRequest`` as the BLS port takes it.

    The fields are what the model set, unchecked (the port checks them as the gateway
    checks a client's request), with the input tensors as numpy arrays. ``pb_utils`` builds
    it and turns the port's answer back into an ``InferenceResponse``, so the port (a
    frontend) never sees the Python backend's own types.
    """

    model_name: Any
    model_version: Any = -1  # "" or -1: the latest the serving worker has
    request_id: Any = ""
    inputs: list[tuple[str, np.ndarray]] = field(default_factory=list)  # in the order given
    requested_output_names: list[Any] = field(default_factory=list)  # empty: all
    parameters: Any = ""  # a JSON object's text
    timeout: Any = 0  # microseconds; 0: the caller's deadline alone


@dataclass
class BlsResponse:
    """One response of a BLS call that may answer many times (``BlsPort.stream``)."""

    outputs: list[tuple[str, np.ndarray]]  # by name, in order; empty in a final-only one
    final: bool = True  # the call's last response


class BlsResponses(Protocol):
    """A BLS call's responses, each as it comes (``BlsPort.stream``). Iterating raises the
    ``ConchError`` that ends the call early: the called model's own error, its deadline,
    an outage. ``cancel`` says the caller reads no more: the request is withdrawn if no
    worker took it yet, else the model sees ``is_cancelled()``."""

    def __iter__(self) -> Iterator[BlsResponse]: ...

    def __next__(self) -> BlsResponse: ...

    def cancel(self) -> None: ...


class BlsPort(Protocol):
    """What a Python model's ``pb_utils`` needs to call other models (BLS) and to load or
    unload them. The worker's composition root hands one in (``conch.frontend.bls``'s
    client); backends never import the request pipeline themselves."""

    def infer(self, request: BlsRequest, decoupled: bool = False) -> list[tuple[str, np.ndarray]]:
        """The called model's outputs by name, in order; a ``ConchError`` when the call
        cannot be made or fails (its message names the model where it can). A decoupled
        model is refused unless ``decoupled`` (``stream`` is the call that serves it)."""
        ...

    def stream(self, request: BlsRequest) -> BlsResponses:
        """``exec(decoupled=True)``: the call's responses as they come, any number from a
        decoupled model, one from any other; a ``ConchError`` when it cannot be made."""
        ...

    def is_ready(self, name: str, version: str | int = "") -> bool: ...

    def load(self, name: str, config: str = "", files: dict[str, bytes] | None = None) -> None: ...

    def unload(self, name: str, unload_dependents: bool = False) -> None: ...


@dataclass
class ModelSpec:
    """What a backend needs to load one version of a model."""

    name: str
    version: int
    path: Path  # <repository>/<model>
    config: ModelConfig  # completed by the repository
    bls: BlsPort | None = None  # the worker's BLS client; the Python backend hands it to pb_utils

    @property
    def version_dir(self) -> Path:
        return self.path / str(self.version)

    @property
    def model_file(self) -> Path:
        return self.version_dir / model_filename(self.config)


__all__ = ["BlsPort", "BlsRequest", "BlsResponse", "BlsResponses", "InstanceSpec", "ModelSpec"]
