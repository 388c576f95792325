#!/usr/bin/env python3
"""Build the shipped tree model, ``breast_cancer_xgb``, for the fil backend.

A gradient-boosted classifier (XGBoost, ``binary:logistic``) trained on the Wisconsin
breast cancer data set that scikit-learn ships (``sklearn.datasets.load_breast_cancer``:
569 rows, 30 features, read from the installed package, nothing downloaded). The script
writes ``DIR/breast_cancer_xgb/1/xgboost.ubj``, the file name Triton FIL looks for under
``model_type: "xgboost_ubj"``; the config beside it is committed. Training runs on one
thread with a fixed seed, so a run gives the same trees. The file is rewritten only when
missing (``--force`` for always), so ``make`` can call this on every run. Usage::

    .venv/bin/python functions/build_tree_model.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
NAME = "breast_cancer_xgb"
FILENAME = "xgboost.ubj"
PARAMS = {
    "objective": "binary:logistic",
    "max_depth": 4,
    "eta": 0.3,
    "nthread": 1,
    "seed": 0,
    "tree_method": "exact",
}
ROUNDS = 50


def dataset() -> tuple[np.ndarray, np.ndarray]:
    """The features (float32, as FIL takes them) and the labels (1 = benign)."""
    try:
        from sklearn.datasets import load_breast_cancer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SystemExit("scikit-learn is not installed: run `make install`") from exc
    x, y = load_breast_cancer(return_X_y=True)
    return x.astype(np.float32), y.astype(np.float32)


def train() -> Any:
    """The booster, trained on every row (a demonstration model, not an evaluation)."""
    try:
        import xgboost as xgb
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SystemExit(
            "xgboost is not installed: install conch with the 'fil' extra (pip install -e '.[fil]')"
        ) from exc
    x, y = dataset()
    return xgb.train(PARAMS, xgb.DMatrix(x, label=y), num_boost_round=ROUNDS)


def build(out: Path, *, force: bool = False) -> list[Path]:
    """Write the model file under ``out`` unless it is there already; the paths written."""
    path = out / NAME / "1" / FILENAME
    if path.exists() and not force:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(train().save_raw("ubj")))
    return [path]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="the model repository to write")
    parser.add_argument("--force", action="store_true", help="rewrite the file if present")
    args = parser.parse_args(argv)
    for path in build(args.out, force=args.force):
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
