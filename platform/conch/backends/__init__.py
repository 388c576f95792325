"""Backend registry: one line per backend, imported only when a model needs it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from conch.backends.base import (
    Backend,
    BackendRequest,
    BackendResult,
    InstanceSpec,
    ModelSpec,
    TensorBackend,
)
from conch.core.errors import ModelLoadError


@dataclass(frozen=True)
class BackendEntry:
    target: str  # "module:Class"
    platforms: tuple[str, ...]  # Triton platform names that select this backend
    default_filename: str  # Triton's default model file name


# The registry. Adding a backend is one file in this package and one line here.
BACKENDS: dict[str, BackendEntry] = {
    "onnxruntime": BackendEntry(
        "conch.backends.onnxruntime:OnnxRuntimeBackend", ("onnxruntime_onnx",), "model.onnx"
    ),
    "pytorch": BackendEntry(
        "conch.backends.pytorch:PyTorchBackend", ("pytorch_libtorch", "libtorch"), "model.pt"
    ),
    "tensorrt": BackendEntry(
        "conch.backends.tensorrt:TensorRTBackend", ("tensorrt_plan",), "model.plan"
    ),
    "python": BackendEntry("conch.backends.python.backend:PythonBackend", (), "model.py"),
}


def backend_name_for(platform: str, backend: str) -> str:
    """Triton picks the backend by ``backend`` first, else by ``platform``."""
    if backend:
        if backend not in BACKENDS:
            raise ModelLoadError(f"unknown backend '{backend}'; conch has {sorted(BACKENDS)}")
        return backend
    for name, entry in BACKENDS.items():
        if platform in entry.platforms:
            return name
    raise ModelLoadError(
        f"unknown platform '{platform}'; conch serves "
        f"{sorted(p for e in BACKENDS.values() for p in e.platforms)}"
    )


def backend_for_filename(filename: str) -> str | None:
    """The backend whose default model file this is, for configs that name none."""
    for name, entry in BACKENDS.items():
        if entry.default_filename == filename:
            return name
    return None


def backend_class(name: str) -> type[Backend]:
    module, _, cls = BACKENDS[name].target.partition(":")
    return getattr(importlib.import_module(module), cls)


__all__ = [
    "BACKENDS",
    "Backend",
    "BackendEntry",
    "BackendRequest",
    "BackendResult",
    "InstanceSpec",
    "ModelSpec",
    "TensorBackend",
    "backend_class",
    "backend_for_filename",
    "backend_name_for",
]
