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
    default_filename: str  # Triton's default model file name; "" for a model with no file
    # Whether Triton writes ``default_model_filename`` into the config of a model whose
    # platform is known (given, or found from its model file). Triton's server-side
    # auto-complete (``AutoCompleteBackendFields`` in triton-inference-server/core
    # src/model_config_utils.cc) does for every backend but PyTorch, which gets the field
    # only when the config names ``backend: "pytorch"`` and no platform; the PyTorch
    # backend then falls back to ``model.pt`` itself. The file looked for is the same.
    filename_with_platform: bool = True
    # Where the model file's name follows a config parameter (FIL's ``model_type``): the
    # parameter's key and its values' file names; ``default_filename`` is the one for the
    # value used when the parameter is absent.
    filename_parameter: str = ""
    filenames: tuple[tuple[str, str], ...] = ()
    # Where each platform has a model file of its own (TensorFlow's SavedModel folder and
    # GraphDef file): (platform, file name) pairs, the first platform's being
    # ``default_filename``.
    platform_filenames: tuple[tuple[str, str], ...] = ()

    def filename_for(self, platform: str) -> str:
        """The model file Triton looks for under this platform."""
        return dict(self.platform_filenames).get(platform, self.default_filename)

    def platform_for(self, filename: str) -> str:
        """The platform whose model file this is, else the first (the default)."""
        named = {f: p for p, f in self.platform_filenames}
        return named.get(filename, self.platforms[0] if self.platforms else "")


BACKENDS: dict[str, BackendFacts] = {
    "onnxruntime": BackendFacts(("onnxruntime_onnx",), "model.onnx"),
    "pytorch": BackendFacts(
        ("pytorch_libtorch", "libtorch"), "model.pt", filename_with_platform=False
    ),
    "tensorrt": BackendFacts(("tensorrt_plan",), "model.plan"),
    "python": BackendFacts((), "model.py"),
    # Triton's TensorFlow backend: one backend, two platforms, a file name for each
    # (``AutoCompleteBackendFields`` in triton-inference-server/core model_config_utils.cc).
    "tensorflow": BackendFacts(
        ("tensorflow_savedmodel", "tensorflow_graphdef"),
        "model.savedmodel",
        platform_filenames=(
            ("tensorflow_savedmodel", "model.savedmodel"),
            ("tensorflow_graphdef", "model.graphdef"),
        ),
    ),
    # Triton's OpenVINO backend: no platform; an IR by default, other formats by
    # ``default_model_filename`` (its README).
    "openvino": BackendFacts((), "model.xml"),
    # Triton FIL's file names per model_type (``model_file`` in fil_backend src/model.h).
    "fil": BackendFacts(
        (),
        "xgboost.model",
        filename_parameter="model_type",
        filenames=(
            ("xgboost", "xgboost.model"),
            ("xgboost_json", "xgboost.json"),
            ("xgboost_ubj", "xgboost.ubj"),
            ("lightgbm", "model.txt"),
            ("treelite_checkpoint", "checkpoint.tl"),
        ),
    ),
    # Triton's identity backend reads no file: Triton passes a custom backend the version
    # folder and checks nothing in it, so a version is its folder alone.
    "identity": BackendFacts((), ""),
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
    if facts is None:
        return ""
    if facts.filename_parameter in config.parameters:
        value = config.parameters[facts.filename_parameter].string_value
        return dict(facts.filenames).get(value, facts.default_filename)
    return facts.filename_for(config.platform)


def backend_for_filename(filename: str) -> str | None:
    """The backend whose default model file this is, for configs that name none."""
    for name, facts in BACKENDS.items():
        if filename in (facts.default_filename, *dict(facts.platform_filenames).values()):
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
