"""The ``Completer`` the model repository is handed: Triton's auto-complete by each backend.

The repository lives in the core and may not import model runtimes; the processes that
complete configs (the gateway and the worker: their composition roots) pass ``complete``
to ``ModelRepository`` through ``conch.wire.control_bus.open_repository``. A backend's
module is imported the first time the repository asks about a model of that backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from conch.backends import backend_class
from conch.backends.autocomplete import cuda_device_count

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig


class BackendCompleter:
    """Dispatches to each backend class's ``auto_complete`` and ``gpu_available``."""

    def auto_complete(
        self, backend: str, config: ModelConfig, model_file: Path, *, default_max_batch_size: int
    ) -> None:
        backend_class(backend).auto_complete(
            config, model_file, default_max_batch_size=default_max_batch_size
        )

    def gpu_count(self, backend: str) -> int:
        """The host's visible GPUs when the backend says its GPU stack is installed, else 0."""
        gpus = cuda_device_count()
        check = getattr(backend_class(backend), "gpu_available", None)
        if gpus and check is not None and not check()[0]:
            return 0
        return gpus


complete = BackendCompleter()

__all__ = ["BackendCompleter", "complete"]
