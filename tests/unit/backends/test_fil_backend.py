"""The fil backend without a server: FIL's parameters, file names, auto-complete, load-time
checks and FIL's output rules, against models trained here (``tree_models``)."""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest
import tree_models as tm

from conch.backends import InstanceSpec, backend_class
from conch.backends.completion import complete
from conch.backends.fil import FilBackend, parse_parameters
from conch.core.backend_table import BACKENDS, model_filename
from conch.core.errors import ModelLoadError
from conch.core.extras import install_command
from conch.core.model_config import new_config, parse_config
from conch.core.repository import ModelRepository

pytest.importorskip("xgboost")
pytest.importorskip("lightgbm")
pytest.importorskip("treelite")


def config(**params: str):
    cfg = new_config()
    cfg.name = "m"
    cfg.backend = "fil"
    for k, v in params.items():
        cfg.parameters[k].string_value = v
    return cfg


def loaded(repo, name, kind="CPU"):
    entry = ModelRepository(repo, complete=complete, gpu_count=0).scan()[name]
    if entry.error is not None:
        raise ModelLoadError(entry.error)
    backend = FilBackend(entry.spec(entry.latest()), InstanceSpec(f"{name}_0", kind))
    backend.load()
    return backend


def answer(backend, x):
    return backend.run({"input__0": x}, ["output__0"])["output__0"]


def test_registry_and_file_names_follow_model_type():
    assert backend_class("fil") is FilBackend
    assert BACKENDS["fil"].default_filename == "xgboost.model"
    for model_type, filename in tm.FILE_NAMES.items():
        assert model_filename(config(model_type=model_type)) == filename
    assert model_filename(config()) == "xgboost.model"


def test_parameters_as_fil_reads_them():
    p = parse_parameters(config(is_classifier="true"))
    assert (p.model_type, p.is_classifier, p.threshold, p.predict_proba) == (
        "xgboost",
        True,
        0.5,
        False,
    )
    assert p.threads == 1 and p.notes == ()
    old = parse_parameters(config(output_class="false", threshold="0.3", cpu_nthread="3"))
    assert (old.is_classifier, old.threshold, old.threads) == (False, 0.3, 3)
    assert parse_parameters(config(is_classifier="true", cpu_nthread="-1")).threads == (
        os.cpu_count() or 1
    )


def test_cpu_nthread_sets_the_frameworks_threads(tmp_path):
    import json

    extra = {"predict_proba": "true", "cpu_nthread": "2"}
    cfg = tm.fil_config("x", "xgboost_json", 1, extra=extra)
    tm.xgboost_model(tmp_path, "x", "xgboost_json", "binary:logistic", config=cfg)
    booster = loaded(tmp_path, "x").forest.booster
    assert json.loads(booster.save_config())["learner"]["generic_param"]["nthread"] == "2"
    tm.lightgbm_model(tmp_path, "l", config=tm.fil_config("l", "lightgbm", 3, extra=extra))
    assert loaded(tmp_path, "l").forest.threads == 2


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({}, "needs parameters 'is_classifier'"),
        ({"is_classifier": "yes"}, "must be 'true' or 'false'"),
        ({"is_classifier": "true", "output_class": "false"}, "disagree"),
        ({"is_classifier": "true", "model_type": "onnx"}, "not a model type FIL reads"),
        ({"is_classifier": "true", "threshold": "half"}, "'threshold' must be a number"),
        ({"is_classifier": "true", "cpu_nthread": "4 threads"}, "must be an integer"),
        ({"is_classifier": "true", "layout": "sideways"}, "'layout' 'sideways' is not one of"),
        ({"is_classifier": "true", "algo": "FAST"}, "'algo' 'FAST' is not one of"),
        ({"is_classifier": "true", "chunk_size": "x"}, "'chunk_size' must be an integer"),
    ],
)
def test_bad_parameters_are_load_errors(params, words):
    with pytest.raises(ModelLoadError, match=words):
        parse_parameters(config(**params))


def test_gpu_parameters_are_logged_not_dropped(tmp_path, caplog):
    extra = {"predict_proba": "true", "layout": "breadth_first", "storage_type": "DENSE"}
    extra |= {"transfer_threshold": "2", "use_experimental_optimizations": "true"}
    tm.xgboost_model(
        tmp_path,
        "m",
        "xgboost_json",
        "binary:logistic",
        config=tm.fil_config("m", "xgboost_json", 1, extra=extra),
    )
    with caplog.at_level(logging.WARNING, logger="conch.backends.fil"):
        loaded(tmp_path, "m")
    said = caplog.text
    for key in ("layout", "storage_type", "transfer_threshold", "use_experimental_optimizations"):
        assert f"'{key}'" in said


def test_auto_complete_fills_input_and_output_from_the_model(tmp_path):
    tm.xgboost_model(tmp_path, "m", "xgboost_ubj", "multi:softprob", config="")
    cfg = parse_config(
        'backend: "fil"\nparameters { key: "model_type" value { string_value: "xgboost_ubj" } }\n'
        'parameters { key: "is_classifier" value { string_value: "true" } }\n'
        'parameters { key: "predict_proba" value { string_value: "true" } }\n',
        model="m",
        source="m/config.pbtxt",
    )
    cfg.name = "m"
    FilBackend.auto_complete(cfg, tmp_path / "m" / "1" / "xgboost.ubj", default_max_batch_size=8)
    assert cfg.max_batch_size == 8
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [
        ("input__0", 11, [tm.FEATURES])
    ]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("output__0", [tm.CLASSES])]


def test_a_model_with_no_config_serves_through_auto_complete(tmp_path):
    made = tm.lightgbm_model(
        tmp_path,
        "m",
        config='backend: "fil"\nmax_batch_size: 64\n'
        'parameters { key: "model_type" value { string_value: "lightgbm" } }\n'
        'parameters { key: "is_classifier" value { string_value: "false" } }\n',
    )
    x = tm.rows(9)
    backend = loaded(tmp_path, "m")
    np.testing.assert_array_equal(answer(backend, x), made.predict(x))
    # As Triton completes a custom backend's config: no file name written, FIL picks it.
    assert backend.spec.config.default_model_filename == ""
    assert backend.spec.model_file.name == "model.txt"


def test_input_width_is_checked_against_the_model(tmp_path):
    tm.xgboost_model(
        tmp_path,
        "m",
        "xgboost_json",
        "binary:logistic",
        config=tm.fil_config("m", "xgboost_json", 1, features=tm.FEATURES + 1),
    )
    with pytest.raises(ModelLoadError, match=r"input__0.*\[13\].*\[12\]"):
        loaded(tmp_path, "m")


def test_output_width_is_checked(tmp_path):
    tm.xgboost_model(
        tmp_path,
        "m",
        "xgboost_json",
        "multi:softprob",
        config=tm.fil_config("m", "xgboost_json", 2, extra=tm.PROBA),
    )
    with pytest.raises(ModelLoadError, match=r"output__0.*\[2\].*\[3\]"):
        loaded(tmp_path, "m")


def test_gpu_instances_and_shap_outputs_are_refused(tmp_path):
    tm.xgboost_model(tmp_path, "m", "xgboost_json", "binary:logistic")
    with pytest.raises(ModelLoadError, match="on the CPU"):
        loaded(tmp_path, "m", kind="GPU")
    shap = tm.fil_config("m", "xgboost_json", 1, extra=tm.PROBA).replace(
        "output [", 'output [ { name: "treeshap_output" data_type: TYPE_FP32 dims: [ 13 ] },'
    )
    (tmp_path / "m" / "config.pbtxt").write_text(shap)
    with pytest.raises(ModelLoadError, match="treeshap_output"):
        loaded(tmp_path, "m")


def test_a_file_that_is_not_the_model_type_is_a_load_error(tmp_path):
    tm.xgboost_model(tmp_path, "m", "xgboost_json", "binary:logistic")
    (tmp_path / "m" / "1" / "xgboost.json").write_text("not a model")
    with pytest.raises(ModelLoadError, match=r"cannot read .*xgboost\.json as model_type"):
        loaded(tmp_path, "m")


def test_a_missing_framework_names_the_extra(tmp_path, monkeypatch):
    tm.lightgbm_model(tmp_path, "m")
    monkeypatch.setitem(sys.modules, "lightgbm", None)
    with pytest.raises(ModelLoadError, match=r"needs lightgbm") as info:
        loaded(tmp_path, "m")
    assert install_command("fil") in str(info.value)


@pytest.mark.parametrize(
    ("objective", "params", "width"),
    [
        ("binary:logistic", {}, 1),
        ("binary:logistic", {"threshold": "0.8"}, 1),
        ("binary:logistic", {"predict_proba": "true"}, 2),
        ("binary:logistic", {"predict_proba": "true"}, 1),
        ("multi:softprob", {}, 1),
        ("multi:softprob", {"predict_proba": "true"}, tm.CLASSES),
    ],
)
def test_fil_output_rules(tmp_path, objective, params, width):
    cfg = tm.fil_config("m", "xgboost_ubj", width, extra=params)
    made = tm.xgboost_model(tmp_path, "m", "xgboost_ubj", objective, config=cfg)
    x = tm.rows(64)
    got = answer(loaded(tmp_path, "m"), x)
    want = tm.fil_answer(
        made.predict(x),
        predict_proba=params.get("predict_proba") == "true",
        threshold=float(params.get("threshold", 0.5)),
        width=width,
    )
    # FIL's shapes: a single column is served as one value per row.
    assert got.shape == ((64,) if width == 1 else (64, width)) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_multi_softmax_answers_probabilities_like_softprob(tmp_path):
    """XGBoost's multi:softmax predicts class ids; FIL answers its probabilities."""
    import xgboost as xgb

    cfg = tm.fil_config("m", "xgboost_json", tm.CLASSES, extra=tm.PROBA)
    tm.xgboost_model(tmp_path, "m", "xgboost_json", "multi:softmax", config=cfg)
    booster = xgb.Booster(model_file=str(tmp_path / "m" / "1" / "xgboost.json"))
    x = tm.rows(32)
    got = answer(loaded(tmp_path, "m"), x)
    np.testing.assert_allclose(got.sum(axis=1), 1, rtol=1e-6)
    np.testing.assert_array_equal(got.argmax(axis=1), booster.inplace_predict(x))
