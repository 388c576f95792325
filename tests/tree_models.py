"""Tree models made at test time for the fil backend, and FIL configs for them.

Each maker trains on fixed-seed numpy data, writes the model in one of FIL's formats
into ``<repo>/<name>/1/<FIL's default file name>`` with a FIL ``config.pbtxt``, and
returns a ``reference`` that answers as the framework does in process, so a test compares
the served answers with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FEATURES = 12
CLASSES = 3
PROBA = {"predict_proba": "true"}
FILE_NAMES = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}


def data(rows: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, a binary label and a three-class label, all from one seed."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    score = x[:, 0] + 0.5 * x[:, 1] * x[:, 2] - x[:, 3]
    binary = (score > 0).astype(np.float32)
    multi = np.digitize(score, [-0.7, 0.7]).astype(np.float32)
    return x, binary, multi


def rows(n: int, seed: int = 7) -> np.ndarray:
    """Inputs to ask a model about, NaN (missing) included as tree models take it."""
    x = np.random.default_rng(seed).standard_normal((n, FEATURES)).astype(np.float32)
    if n > 3:
        x[3, 5] = np.nan
    return x


def fil_config(
    name: str,
    model_type: str,
    width: int,
    *,
    max_batch_size: int = 32768,
    features: int = FEATURES,
    extra: dict[str, str] | None = None,
    classifier: bool = True,
) -> str:
    params = {"model_type": model_type, "is_classifier": str(classifier).lower(), **(extra or {})}
    listed = "\n".join(
        f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }},' for k, v in params.items()
    ).rstrip(",")
    return f"""name: "{name}"
backend: "fil"
max_batch_size: {max_batch_size}
input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }} ]
output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
parameters [
{listed}
]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
"""


@dataclass
class Made:
    """A model written into a repository: its folder and its framework's answers."""

    folder: Path
    predict: Callable[[np.ndarray], np.ndarray]  # probabilities (or values), 2-D float32


def _place(repo: Path, name: str, model_type: str) -> Path:
    path = repo / name / "1" / FILE_NAMES[model_type]
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def xgboost_model(
    repo: Path, name: str, model_type: str, objective: str, config: str | None = None
) -> Made:
    """An XGBoost booster (``binary:logistic``, ``multi:softprob``, ``reg:squarederror``)
    saved in ``model_type``'s format (``xgboost``: XGBoost's default binary, UBJSON)."""
    import xgboost as xgb

    x, binary, multi = data()
    params = {"objective": objective, "max_depth": 4, "eta": 0.3, "nthread": 1, "seed": 0}
    label = binary
    if objective.startswith("multi:"):
        params["num_class"] = CLASSES
        label = multi
    elif objective.startswith("reg:"):
        label = x[:, 0] * 2 + x[:, 1]
    booster = xgb.train(params, xgb.DMatrix(x, label=label), num_boost_round=20)
    path = _place(repo, name, model_type)
    if model_type == "xgboost":
        raw = booster.save_raw("ubj")
        path.write_bytes(bytes(raw))
    else:
        booster.save_model(str(path))
    loaded = xgb.Booster()
    loaded.load_model(bytearray(path.read_bytes()))  # by content: FIL's names confuse xgboost

    def predict(q: np.ndarray) -> np.ndarray:
        return np.asarray(loaded.inplace_predict(q), np.float32).reshape(len(q), -1)

    width = CLASSES if objective.startswith("multi:") else 1
    (repo / name / "config.pbtxt").write_text(
        config
        if config is not None
        else fil_config(
            name,
            model_type,
            width,
            extra={"predict_proba": "true"},
            classifier=not objective.startswith("reg:"),
        )
    )
    return Made(repo / name, predict)


def lightgbm_model(repo: Path, name: str, config: str | None = None) -> Made:
    """A LightGBM multiclass booster in its text format."""
    import lightgbm as lgb

    x, _, multi = data()
    params = {"objective": "multiclass", "num_class": CLASSES, "verbose": -1, "num_threads": 1}
    params |= {"seed": 0, "deterministic": True, "num_leaves": 8}
    booster = lgb.train(params, lgb.Dataset(x, label=multi), num_boost_round=15)
    path = _place(repo, name, "lightgbm")
    booster.save_model(str(path))
    loaded = lgb.Booster(model_file=str(path))

    def predict(q: np.ndarray) -> np.ndarray:
        return np.asarray(loaded.predict(q), np.float32).reshape(len(q), -1)

    (repo / name / "config.pbtxt").write_text(
        config if config is not None else fil_config(name, "lightgbm", CLASSES, extra=PROBA)
    )
    return Made(repo / name, predict)


def treelite_model(repo: Path, name: str, config: str | None = None) -> Made:
    """A Treelite checkpoint of an XGBoost binary classifier, answered by Treelite's GTIL."""
    import treelite
    import xgboost as xgb

    x, binary, _ = data()
    params = {"objective": "binary:logistic", "max_depth": 3, "nthread": 1, "seed": 0}
    booster = xgb.train(params, xgb.DMatrix(x, label=binary), num_boost_round=10)
    path = _place(repo, name, "treelite_checkpoint")
    treelite.frontend.from_xgboost(booster).serialize(str(path))
    loaded = treelite.Model.deserialize(str(path))

    def predict(q: np.ndarray) -> np.ndarray:
        return np.asarray(treelite.gtil.predict(loaded, q, nthread=1)[:, 0, :], np.float32)

    (repo / name / "config.pbtxt").write_text(
        config if config is not None else fil_config(name, "treelite_checkpoint", 1, extra=PROBA)
    )
    return Made(repo / name, predict)


def booster_answers(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """XGBoost's own answers for the booster in ``path``, as a flat float32 array."""
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(path.read_bytes()))
    return lambda q: np.asarray(booster.inplace_predict(q), np.float32)


def served(answer: np.ndarray) -> np.ndarray:
    """An answer in the shape FIL serves it: a single column as one value per row."""
    return answer[:, 0] if answer.ndim == 2 and answer.shape[1] == 1 else answer


def fil_answer(
    prob: np.ndarray, *, predict_proba: bool, threshold: float = 0.5, width: int = 0
) -> np.ndarray:
    """What FIL answers for a classifier from its framework's probabilities."""
    if predict_proba:
        if prob.shape[1] == 1 and width == 2:
            return np.concatenate([1 - prob, prob], axis=1)
        return served(prob)
    if prob.shape[1] > 1:
        return prob.argmax(axis=1).astype(np.float32)
    return served((prob > threshold).astype(np.float32))
