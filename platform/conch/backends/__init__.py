"""Which class runs each backend, imported only when a model needs it.

The backends' names, platforms and default model files are repository knowledge and live
in ``conch.core.backend_table``; this table only says where each backend's class is.
Adding a backend is one file in this package, one line here and one line there.
"""

from __future__ import annotations

import importlib

from conch.backends.base import (
    Backend,
    BackendRequest,
    BackendResult,
    InstanceSpec,
    ModelSpec,
    TensorBackend,
)

# backend name (a key of conch.core.backend_table.BACKENDS) -> "module:Class"
CLASSES: dict[str, str] = {
    "onnxruntime": "conch.backends.onnxruntime:OnnxRuntimeBackend",
    "pytorch": "conch.backends.pytorch:PyTorchBackend",
    "tensorrt": "conch.backends.tensorrt:TensorRTBackend",
    "python": "conch.backends.python.backend:PythonBackend",
    "tensorflow": "conch.backends.tensorflow:TensorFlowBackend",
    "fil": "conch.backends.fil:FilBackend",
    "openvino": "conch.backends.openvino:OpenVinoBackend",
    "identity": "conch.backends.identity:IdentityBackend",
}


def backend_class(name: str) -> type[Backend]:
    module, _, cls = CLASSES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


__all__ = [
    "CLASSES",
    "Backend",
    "BackendRequest",
    "BackendResult",
    "InstanceSpec",
    "ModelSpec",
    "TensorBackend",
    "backend_class",
]
