"""What the repository knows about each backend: its name, its platforms, its model file.

This is repository knowledge (which backend a config or a model file selects, what file
a version folder must hold), so it lives in the core: the repository, ``repo_sync`` and
the backends themselves read it here, and none of them has to import a model runtime to
do so. Which class runs a backend is the backends' own business
(``conch.backends.backend_class``). Adding a backend is one line here, one in
``conch/backends/__init__.py`` and its module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from conch.core.errors import ModelLoadError

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig


@dataclass(frozen=True)
class BackendFacts:
    platforms: tuple[str, ...]  # Triton platform names that select this backend; first = default
    default_filename: str  # Triton's default model file name
    # Whether Triton writes ``default_model_filename`` into the config of a model whose
    # platform is known (given, or found from its model file). Triton's server-side
    # auto-complete (``AutoCompleteBackendFields`` in triton-inference-server/core
    # src/model_config_utils.cc) does for every backend but PyTorch, which gets the field
    # only when the config names ``backend: "pytorch"`` and no platform; the PyTorch
    # backend then falls back to ``model.pt`` itself. The file looked for is the same.
    filename_with_platform: bool = True


BACKENDS: dict[str, BackendFacts] = {
    "onnxruntime": BackendFacts(("onnxruntime_onnx",), "model.onnx"),
    "pytorch": BackendFacts(
        ("pytorch_libtorch", "libtorch"), "model.pt", filename_with_platform=False
    ),
    "tensorrt": BackendFacts(("tensorrt_plan",), "model.plan"),
    "python": BackendFacts((), "model.py"),
}


def backend_name_for(platform: str, backend: str) -> str:
    """Triton picks the backend by ``backend`` first, else by ``platform``."""
    if backend:
        if backend not in BACKENDS:
            raise ModelLoadError(f"unknown backend '{backend}'; conch has {sorted(BACKENDS)}")
        return backend
    for name, facts in BACKENDS.items():
        if platform in facts.platforms:
            return name
    raise ModelLoadError(
        f"unknown platform '{platform}'; conch serves "
        f"{sorted(p for f in BACKENDS.values() for p in f.platforms)}"
    )


def model_filename(config: ModelConfig) -> str:
    """The file a version folder must hold: the config's ``default_model_filename``, else
    its backend's default (the config may leave it out, as Triton's PyTorch configs do)."""
    if config.default_model_filename:
        return config.default_model_filename
    facts = BACKENDS.get(config.backend)
    return facts.default_filename if facts is not None else ""


def backend_for_filename(filename: str) -> str | None:
    """The backend whose default model file this is, for configs that name none."""
    for name, facts in BACKENDS.items():
        if facts.default_filename == filename:
            return name
    return None


def backend_for_suffix(filename: str) -> str | None:
    """The one backend whose default model file has this file's suffix, else None."""
    suffix = Path(filename).suffix
    if not suffix:
        return None
    matches = [n for n, f in BACKENDS.items() if Path(f.default_filename).suffix == suffix]
    return matches[0] if len(matches) == 1 else None


__all__ = [
    "BACKENDS",
    "BackendFacts",
    "backend_for_filename",
    "backend_for_suffix",
    "backend_name_for",
    "model_filename",
]
