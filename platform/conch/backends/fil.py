"""Tree models (Triton's FIL backend, ``backend: "fil"``): XGBoost, LightGBM and Treelite.

The config is Triton FIL's (triton-inference-server/fil_backend ``docs/model_config.md``):
one input ``input__0`` (FP32 ``[num_features]``), one output ``output__0``, and the
``parameters`` ``model_type``, ``is_classifier`` (``output_class`` in FIL before 25.09),
``threshold`` and ``predict_proba``. Each ``model_type`` has its own default file name
(``conch.core.backend_table``). The model runs in its own framework, on the CPU: an
XGBoost file in ``xgboost.Booster``, a LightGBM file in ``lightgbm.Booster``, a Treelite
checkpoint in Treelite's GTIL, so a served model answers what the framework answers in
process. FIL's GPU parameters are checked as FIL checks them and then logged as having no
effect; a ``KIND_GPU`` instance is refused. The frameworks come with the ``fil`` extra.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.backends.autocomplete import check_and_fill
from conch.backends.base import InstanceSpec, ModelSpec, TensorBackend
from conch.core.errors import InvalidArgument, ModelLoadError
from conch.core.extras import needs_extra

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)

INPUT = "input__0"
OUTPUT = "output__0"
MODEL_TYPES = ("xgboost", "xgboost_json", "xgboost_ubj", "lightgbm", "treelite_checkpoint")

# FIL's parameters that only steer its GPU kernels or its host-to-GPU copies, each with
# the values FIL accepts (None: an integer). On a CPU they cannot change an answer.
GPU_ONLY: dict[str, tuple[str, ...] | None] = {
    "layout": ("depth_first", "breadth_first", "layered", "layered_children_together"),
    "chunk_size": None,
    "transfer_threshold": None,
    # Removed in FIL 25.09 (FIL warns and goes on); older FIL configs still carry them.
    "algo": ("ALGO_AUTO", "NAIVE", "TREE_REORG", "BATCH_TREE_REORG"),
    "storage_type": ("AUTO", "DENSE", "SPARSE", "SPARSE8"),
    "threads_per_tree": None,
    "blocks_per_sm": None,
}

# Threads per model instance when the config has no ``cpu_nthread``. FIL's default is every
# core; conch keeps one, as for onnxruntime, because a worker runs several instances and
# processes side by side.
DEFAULT_THREADS = 1


@dataclass(frozen=True)
class FilParameters:
    """What a FIL config's ``parameters`` say, checked."""

    model_type: str
    is_classifier: bool
    threshold: float
    predict_proba: bool
    threads: int
    notes: tuple[str, ...]  # parameters accepted that change nothing here, to log at load


def _raw(config: ModelConfig, key: str) -> str | None:
    return config.parameters[key].string_value if key in config.parameters else None


def _bool(config: ModelConfig, key: str) -> bool | None:
    """FIL's booleans are the strings ``true`` and ``false``, nothing else."""
    raw = _raw(config, key)
    if raw is None:
        return None
    if raw not in ("true", "false"):
        raise ModelLoadError(
            f"model '{config.name}': parameters '{key}' must be 'true' or 'false', got '{raw}'"
        )
    return raw == "true"


def _number(config: ModelConfig, key: str, kind: type) -> Any:
    """An int or float parameter; text that is not one is a load error, where FIL would
    fall back to its default without a word."""
    raw = _raw(config, key)
    if raw is None:
        return None
    try:
        return kind(raw.strip())
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ModelLoadError(
            f"model '{config.name}': parameters '{key}' must be {what}, got '{raw}'"
        ) from None


def parse_parameters(config: ModelConfig) -> FilParameters:
    """Read FIL's parameters as FIL 25.09 reads them, with older FIL's names accepted.

    ``is_classifier`` (or ``output_class``) is required, as in FIL. ``threshold`` defaults
    to 0.5 as FIL's documentation says (FIL's source asks for it on classifiers).
    """
    name = config.name
    model_type = _raw(config, "model_type") or "xgboost"
    if model_type not in MODEL_TYPES:
        raise ModelLoadError(
            f"model '{name}': parameters 'model_type' '{model_type}' is not a model type FIL "
            f"reads; use one of {list(MODEL_TYPES)}"
        )
    new, old = _bool(config, "is_classifier"), _bool(config, "output_class")
    if new is None and old is None:
        raise ModelLoadError(
            f"model '{name}': FIL needs parameters 'is_classifier' ('true' or 'false'; "
            "'output_class' in FIL before 25.09)"
        )
    if new is not None and old is not None and new != old:
        raise ModelLoadError(
            f"model '{name}': parameters 'is_classifier' and 'output_class' disagree"
        )
    is_classifier = bool(new if new is not None else old)
    threshold = _number(config, "threshold", float)
    threads = _number(config, "cpu_nthread", int)
    if threads is None:
        threads = DEFAULT_THREADS
    elif threads <= 0:
        threads = os.cpu_count() or 1  # FIL's -1: every core
    notes = []
    for key, values in GPU_ONLY.items():
        raw = _raw(config, key)
        if raw is None:
            continue
        if values is None:
            _number(config, key, int)
        elif raw not in values:
            raise ModelLoadError(
                f"model '{name}': parameters '{key}' '{raw}' is not one of {list(values)}"
            )
        notes.append(f"'{key}' steers FIL on a GPU and changes nothing on a CPU")
    if _bool(config, "use_experimental_optimizations"):
        notes.append(
            "'use_experimental_optimizations' picks FIL's own CPU code; conch runs the "
            "model's framework, which answers the same"
        )
    if _bool(config, "xgboost_allow_unknown_field"):
        notes.append(
            "'xgboost_allow_unknown_field' has no counterpart: XGBoost itself reads the "
            "file, and a file it cannot read fails to load"
        )
    return FilParameters(
        model_type=model_type,
        is_classifier=is_classifier,
        threshold=0.5 if threshold is None else threshold,
        predict_proba=bool(_bool(config, "predict_proba")),
        threads=threads,
        notes=tuple(notes),
    )


def _import(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise ModelLoadError(needs_extra("the fil backend", module, "fil")) from None


class Forest:
    """One loaded tree model: its feature and class counts and its framework's answers.

    ``predict`` gives what the framework gives (probabilities for a classifier, the value
    for a regressor), float32, one row per input row and ``classes`` columns.
    """

    features: int
    classes: int  # 1 for a binary classifier or a regressor

    def predict(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class XGBoostForest(Forest):
    def __init__(self, path: Path, threads: int) -> None:
        xgb = _import("xgboost")
        # From bytes, so XGBoost tells JSON from UBJSON by content, not by file extension
        # (FIL's ``xgboost.model`` has none it knows).
        self.booster = xgb.Booster()
        self.booster.load_model(bytearray(path.read_bytes()))
        self.booster.set_param({"nthread": threads})
        self.features = self.booster.num_features()
        learner = json.loads(self.booster.save_config())["learner"]
        self.classes = max(1, int(learner["learner_model_param"]["num_class"]))
        # multi:softmax answers class ids; FIL answers a classifier's probabilities, which
        # xgboost gives for the same trees as the softmax of the margins.
        self.softmax = learner["objective"]["name"] == "multi:softmax"

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.softmax:
            margin = self.booster.inplace_predict(x, predict_type="margin").astype(np.float32)
            e = np.exp(margin - margin.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
        return np.asarray(self.booster.inplace_predict(x), np.float32).reshape(len(x), -1)


class LightGBMForest(Forest):
    def __init__(self, path: Path, threads: int) -> None:
        lgb = _import("lightgbm")
        self.booster = lgb.Booster(model_file=str(path))
        self.threads = threads
        self.features = self.booster.num_feature()
        self.classes = self.booster.num_model_per_iteration()

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = self.booster.predict(x, num_threads=self.threads)
        return np.asarray(out, np.float32).reshape(len(x), -1)


class TreeliteForest(Forest):
    def __init__(self, path: Path, threads: int, *, legacy_xgboost: bool = False) -> None:
        treelite = _import("treelite")
        self.gtil = treelite.gtil
        if legacy_xgboost:
            self.model = treelite.frontend.load_xgboost_model_legacy_binary(str(path))
        else:
            self.model = treelite.Model.deserialize(str(path))
        self.threads = threads
        header = self.model.get_header_accessor()
        targets = int(header.get_field("num_target")[0])
        if targets != 1:
            raise ModelLoadError(f"a Treelite model of {targets} targets (FIL serves one)")
        self.features = self.model.num_feature
        self.classes = int(header.get_field("num_class")[0])

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = self.gtil.predict(self.model, x, nthread=self.threads)  # (rows, targets, classes)
        return np.asarray(out[:, 0, :], np.float32)


FORESTS: dict[str, type[Forest]] = {
    "xgboost": XGBoostForest,
    "xgboost_json": XGBoostForest,
    "xgboost_ubj": XGBoostForest,
    "lightgbm": LightGBMForest,
    "treelite_checkpoint": TreeliteForest,
}


def _legacy_binary(path: Path) -> bool:
    """Whether an ``xgboost`` file is XGBoost's old binary format, which XGBoost 3 no
    longer reads: Treelite still does (as FIL does), where JSON and UBJSON start with ``{``."""
    with path.open("rb") as f:
        return f.read(1) != b"{"


def open_forest(params: FilParameters, path: Path, model: str) -> Forest:
    if not path.exists():
        raise ModelLoadError(f"model '{model}': model file {path} not found")
    try:
        if params.model_type == "xgboost" and _legacy_binary(path):
            return TreeliteForest(path, params.threads, legacy_xgboost=True)
        return FORESTS[params.model_type](path, params.threads)
    except ModelLoadError as exc:
        raise ModelLoadError(f"model '{model}': {exc.message}") from None
    except Exception as exc:
        raise ModelLoadError(
            f"model '{model}': cannot read {path} as model_type '{params.model_type}': {exc}"
        ) from None


def output_widths(params: FilParameters, forest: Forest | _Counts) -> tuple[int, ...]:
    """The widths ``output__0`` may have, first the one auto-complete writes (FIL's rules:
    a class id per row, or every class's probability, a binary classifier's as one or two
    columns; a regressor's value)."""
    if not params.is_classifier:
        return (forest.classes,)
    if not params.predict_proba:
        return (1,)
    return (1, 2) if forest.classes == 1 else (forest.classes,)


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]


def _check_and_fill(
    config: ModelConfig,
    forest: Forest | _Counts,
    params: FilParameters,
    *,
    fill: bool,
    default: int,
) -> None:
    widths = output_widths(params, forest)
    width = widths[0]
    for entry in config.output:
        if entry.name == OUTPUT and len(entry.dims) == 1 and entry.dims[0] in widths:
            width = int(entry.dims[0])
    if any(e.name == "treeshap_output" for e in config.output):
        raise ModelLoadError(
            f"model '{config.name}': output 'treeshap_output' (FIL's SHAP values) is not "
            "served by conch"
        )
    check_and_fill(
        config,
        [_Tensor(INPUT, "TYPE_FP32", (-1, forest.features))],
        [_Tensor(OUTPUT, "TYPE_FP32", (-1, width))],
        fill=fill,
        default_max_batch_size=default,
        source=f"the {params.model_type} model",
    )


@dataclass(frozen=True)
class _Counts:
    """What auto-complete needs of a model: its feature and class counts."""

    features: int
    classes: int


# Repositories are read again on every poll, by frontends too: each model file is read once
# (per file identity) and only its counts are kept, not the trees.
_INSPECTED: dict[tuple[str, str, int, int, int], _Counts] = {}


def _inspect(params: FilParameters, path: Path, model: str) -> _Counts:
    try:
        st = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"model '{model}': cannot read {path}: {exc}") from None
    key = (params.model_type, str(path), st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _INSPECTED:
        if len(_INSPECTED) > 256:
            _INSPECTED.clear()
        forest = open_forest(params, path, model)
        _INSPECTED[key] = _Counts(forest.features, forest.classes)
    return _INSPECTED[key]


def gpu_available() -> tuple[bool, str]:
    """Never: the frameworks run on the CPU here, so ``KIND_AUTO`` means a CPU instance."""
    return False, "conch runs FIL models on the CPU"


class FilBackend(TensorBackend):
    """Triton FIL's config and answers, on the model's own framework."""

    gpu_available = staticmethod(gpu_available)

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        self.params: FilParameters | None = None
        self.forest: Forest | None = None
        self._tail: list[int] = []  # the output's shape after its rows

    @classmethod
    def auto_complete(
        cls, config: ModelConfig, model_file: Path | None, *, default_max_batch_size: int
    ) -> None:
        """FIL completes nothing itself (Triton lists the tensors it is given); conch fills
        ``input__0`` and ``output__0`` from the model, as it does for ONNX models."""
        if model_file is None:
            raise ModelLoadError(f"model '{config.name}': no model file")
        params = parse_parameters(config)
        forest = _inspect(params, model_file, config.name)
        _check_and_fill(config, forest, params, fill=True, default=default_max_batch_size)

    def load(self) -> None:
        config = self.spec.config
        if self.instance.kind == "GPU":
            raise ModelLoadError(
                f"model '{self.spec.name}': conch runs FIL models on the CPU; use KIND_CPU "
                "(or KIND_AUTO) in instance_group"
            )
        params = parse_parameters(config)
        forest = open_forest(params, self.spec.model_file, self.spec.name)
        _check_and_fill(config, forest, params, fill=False, default=0)
        for note in params.notes:
            log.warning("model '%s': parameters %s", self.spec.name, note)
        (entry,) = (e for e in config.output if e.name == OUTPUT)
        dims = [int(d) for d in entry.dims][0 if self.batches else 1 :]
        # Triton FIL answers without the config's dimensions of size 1 (RAPIDS-Triton's
        # ``squeeze_output``, which FIL keeps for its older clients): ``dims: [ 1 ]`` gives
        # one value per row, shape [batch]. Clients written for FIL expect that shape.
        self._tail = [d for d in dims if d != 1]
        self.params, self.forest = params, forest

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        assert self.forest is not None and self.params is not None
        x = inputs.get(INPUT)
        if x is None:
            raise InvalidArgument(f"model '{self.spec.name}' needs input '{INPUT}'")
        rows = np.ascontiguousarray(x, np.float32).reshape(-1, self.forest.features)
        out = self._answer(self.forest.predict(rows))
        return {OUTPUT: out.reshape([len(rows), *self._tail])}

    def _answer(self, prob: np.ndarray) -> np.ndarray:
        """FIL's output from the framework's: a class id, every class's probability, or the
        regressor's value."""
        params = self.params
        assert params is not None
        if not params.is_classifier:
            return prob
        if not params.predict_proba:
            if prob.shape[1] > 1:
                return prob.argmax(axis=1).astype(np.float32)
            return (prob[:, 0] > params.threshold).astype(np.float32)
        (entry,) = (e for e in self.spec.config.output if e.name == OUTPUT)
        if prob.shape[1] == 1 and list(entry.dims) == [2]:
            return np.concatenate([1.0 - prob, prob], axis=1)
        return prob

    def unload(self) -> None:
        self.forest = None


__all__ = [
    "DEFAULT_THREADS",
    "GPU_ONLY",
    "MODEL_TYPES",
    "FilBackend",
    "FilParameters",
    "Forest",
    "output_widths",
    "parse_parameters",
]
