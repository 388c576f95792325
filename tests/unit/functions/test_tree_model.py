"""functions/breast_cancer_xgb: the build writes the same model each run, and the shipped
config serves it with the answers XGBoost gives in process."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from conch.backends import InstanceSpec
from conch.backends.completion import complete
from conch.backends.fil import FilBackend
from conch.core.repository import ModelRepository

pytest.importorskip("xgboost")
pytest.importorskip("sklearn")

FUNCTIONS = Path(__file__).resolve().parents[3] / "functions"


def build_script():
    spec = importlib.util.spec_from_file_location(
        "build_tree_model", FUNCTIONS / "build_tree_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_config_answers_as_xgboost_does(tmp_path):
    import xgboost as xgb

    script = build_script()
    (written,) = script.build(tmp_path)
    assert written == tmp_path / "breast_cancer_xgb" / "1" / "xgboost.ubj"
    assert script.build(tmp_path) == []  # up to date: nothing rewritten
    again = tmp_path / "again"
    script.build(again)
    assert (again / "breast_cancer_xgb/1/xgboost.ubj").read_bytes() == written.read_bytes()

    shutil.copy(FUNCTIONS / "breast_cancer_xgb" / "config.pbtxt", written.parents[1])
    entry = ModelRepository(tmp_path, complete=complete, gpu_count=0).scan()["breast_cancer_xgb"]
    assert entry.error is None, entry.error
    backend = FilBackend(entry.spec(entry.latest()), InstanceSpec("b_0", "CPU"))
    backend.load()

    x, y = script.dataset()
    got = backend.run({"input__0": x}, ["output__0"])["output__0"]
    booster = xgb.Booster()
    booster.load_model(bytearray(written.read_bytes()))
    p = booster.inplace_predict(x)
    np.testing.assert_array_equal(got, np.stack([1 - p, p], axis=1))
    assert ((got[:, 1] > 0.5) == (y == 1)).mean() > 0.95  # it learned the training set
