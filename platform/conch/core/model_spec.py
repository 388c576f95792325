"""A model version to load, as the repository describes it to a backend.

The repository builds these (``ModelEntry.spec`` and ``ModelEntry.instances``) and the
worker hands them to backends, so they live in the core: the repository does not import
the backends to describe what they should load. ``conch.backends.base`` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class InstanceSpec:
    """One model instance, as Triton names them: ``<group>_<index>``."""

    name: str
    kind: str  # "CPU" | "GPU" | "MODEL"
    device_id: int = 0


class BlsPort(Protocol):
    """What a Python model's ``pb_utils`` needs to call other models (BLS) and to load or
    unload them. The worker's composition root hands one in (``conch.frontend.bls``'s
    client); backends never import the request pipeline themselves."""

    def infer(self, request: Any, decoupled: bool = False) -> Any: ...

    def is_ready(self, name: str, version: str | int = "") -> bool: ...

    def load(self, name: str, config: str = "", files: dict[str, bytes] | None = None) -> None: ...

    def unload(self, name: str, unload_dependents: bool = False) -> None: ...


@dataclass
class ModelSpec:
    """What a backend needs to load one version of a model."""

    name: str
    version: int
    path: Path  # <repository>/<model>
    config: Any  # Triton's ModelConfig message, completed by the repository
    bls: BlsPort | None = None  # the worker's BLS client; the Python backend hands it to pb_utils

    @property
    def version_dir(self) -> Path:
        return self.path / str(self.version)

    @property
    def model_file(self) -> Path:
        return self.version_dir / self.config.default_model_filename


__all__ = ["BlsPort", "InstanceSpec", "ModelSpec"]
