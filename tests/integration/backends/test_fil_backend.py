"""The fil backend through the real path: models trained here (XGBoost in its three file
formats, LightGBM, a Treelite checkpoint) served by a worker, asked over HTTP and gRPC with
stock tritonclient, concurrently, as async jobs and as a batch job, and compared with the
framework's own answers in this process. FIL's example configs from its docs load as they
are; a broken model file leaves the others serving."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tree_models as tm
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness import fresh_db, start_gateway, start_grpc, start_worker, wait_model_ready
from integration.jobs.test_jobs import result, submit, wait_done
from integration.jobs.test_offline import batch_job_outputs

pytest.importorskip("xgboost")
pytest.importorskip("lightgbm")
pytest.importorskip("treelite")

# FIL's docs (docs/model_config.md), as written: today's, and the one before 25.09.
DOC_CONFIG = """backend: "fil"
max_batch_size: 32768
input [
 {
    name: "input__0"
    data_type: TYPE_FP32
    dims: [ 32 ]
  }
]
output [
 {
    name: "output__0"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }
]
instance_group [{ kind: KIND_AUTO }]
parameters [
  {
    key: "model_type"
    value: { string_value: "xgboost_ubj" }
  },
  {
    key: "is_classifier"
    value: { string_value: "true" }
  }
]

dynamic_batching {}
"""
OLD_DOC_CONFIG = DOC_CONFIG.replace('"xgboost_ubj"', '"xgboost_json"').replace(
    '"is_classifier"', '"output_class"'
)
# FIL's qa/benchmark_repo/small_model-cpu/config.pbtxt, as written.
QA_CONFIG = """backend: "fil"
max_batch_size: 6329
input [
 {
    name: "input__0"
    data_type: TYPE_FP32
    dims: [ 393 ]
  }
]
output [
 {
    name: "output__0"
    data_type: TYPE_FP32
    dims: [ 2 ]
  }
]
instance_group [{ kind: KIND_CPU }]
parameters [
  {
    key: "model_type"
    value: { string_value: "xgboost_json" }
  },
  {
    key: "predict_proba"
    value: { string_value: "true" }
  },
  {
    key: "is_classifier"
    value: { string_value: "true" }
  },
  {
    key: "threshold"
    value: { string_value: "0.5" }
  },
  {
    key: "layout"
    value: { string_value: "breadth_first" }
  }
]

dynamic_batching { }
"""

# The models whose answer is their framework's own (probabilities, a regressor's value).
EXACT = ("fil_xgb", "fil_xgb_json", "fil_xgb_ubj", "fil_lgb", "fil_tl", "fil_reg")


FUNCTIONS = Path(__file__).resolve().parents[3] / "functions"


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wide_model(repo: Path, name: str, features: int, model_type: str, config: str):
    """An XGBoost binary classifier over ``features`` columns, for FIL's own configs."""
    import xgboost as xgb

    rng = np.random.default_rng(features)
    x = rng.standard_normal((300, features)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] > 0).astype(np.float32)
    params = {"objective": "binary:logistic", "max_depth": 3, "nthread": 1, "seed": 0}
    booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=8)
    path = repo / name / "1" / tm.FILE_NAMES[model_type]
    path.parent.mkdir(parents=True)
    booster.save_model(str(path))
    (repo / name / "config.pbtxt").write_text(config)
    return lambda q: np.asarray(booster.inplace_predict(q), np.float32).reshape(len(q), -1)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("fil") / "models"
    made = {
        "fil_xgb": tm.xgboost_model(root, "fil_xgb", "xgboost", "binary:logistic").predict,
        "fil_xgb_json": tm.xgboost_model(
            root, "fil_xgb_json", "xgboost_json", "multi:softprob"
        ).predict,
        "fil_xgb_ubj": tm.xgboost_model(
            root,
            "fil_xgb_ubj",
            "xgboost_ubj",
            "binary:logistic",
            config=tm.fil_config("fil_xgb_ubj", "xgboost_ubj", 2, extra=tm.PROBA),
        ).predict,
        "fil_reg": tm.xgboost_model(root, "fil_reg", "xgboost_json", "reg:squarederror").predict,
        "fil_lgb": tm.lightgbm_model(root, "fil_lgb").predict,
        "fil_tl": tm.treelite_model(root, "fil_tl").predict,
        "fil_classes": tm.xgboost_model(
            root,
            "fil_classes",
            "xgboost_ubj",
            "binary:logistic",
            config=tm.fil_config("fil_classes", "xgboost_ubj", 1, extra={"threshold": "0.3"}),
        ).predict,
        "fil_doc": wide_model(root, "fil_doc", 32, "xgboost_ubj", DOC_CONFIG),
        "fil_doc_old": wide_model(root, "fil_doc_old", 32, "xgboost_json", OLD_DOC_CONFIG),
        "fil_qa": wide_model(root, "fil_qa", 393, "xgboost_json", QA_CONFIG),
    }
    build_tree_model = _load_script(FUNCTIONS / "build_tree_model.py")
    build_tree_model.build(root)
    shutil.copy(FUNCTIONS / "breast_cancer_xgb" / "config.pbtxt", root / "breast_cancer_xgb")
    made["breast_cancer_xgb"] = tm.booster_answers(root / "breast_cancer_xgb" / "1" / "xgboost.ubj")
    broken = root / "fil_broken" / "1" / "xgboost.json"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"learner": "not a forest"}')
    (root / "fil_broken" / "config.pbtxt").write_text(
        tm.fil_config("fil_broken", "xgboost_json", 1)
    )
    return root, made


@pytest.fixture(scope="module")
def stack(
    repo: tuple[Path, dict], redis_url: str, log_dir: Path, s3_endpoint: str
) -> Iterator[tuple[str, str]]:
    """(HTTP URL, gRPC URL) of a gateway, a gRPC server and a worker serving ``repo``."""
    root, made = repo
    db = fresh_db(redis_url, 13)
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    worker = start_worker(root, db, log_dir, env=env)
    gateway, url = start_gateway(root, db, log_dir)
    grpc, grpc_url = start_grpc(root, db, log_dir)
    try:
        for name in made:
            wait_model_ready(url, name, 120, worker, gateway)
        yield url, grpc_url
    finally:
        grpc.stop()
        gateway.stop()
        worker.stop()


def http_infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    inp = httpclient.InferInput("input__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return httpclient.InferenceServerClient(url).infer(model, [inp]).as_numpy("output__0")


def grpc_infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("input__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp]).as_numpy("output__0")
    finally:
        client.close()


def want(repo: tuple[Path, dict], model: str, x: np.ndarray) -> np.ndarray:
    prob = repo[1][model](x)
    if model == "fil_xgb_ubj":
        return tm.fil_answer(prob, predict_proba=True, width=2)
    return tm.served(prob)


@pytest.mark.parametrize("model", EXACT)
def test_each_model_answers_as_its_framework_over_http_and_grpc(stack, repo, model) -> None:
    url, grpc_url = stack
    x = tm.rows(40)
    expected = want(repo, model, x)
    for got in (http_infer(url, model, x), grpc_infer(grpc_url, model, x)):
        assert got.dtype == np.float32 and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_concurrent_requests_are_batched_and_each_gets_its_rows(stack, repo) -> None:
    url, _ = stack
    asks = [(m, tm.rows(1 + i % 5, seed=i)) for i, m in enumerate(EXACT * 6)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda a: http_infer(url, *a), asks))
    for (model, x), got in zip(asks, answers, strict=True):
        np.testing.assert_allclose(got, want(repo, model, x), rtol=1e-6, atol=1e-7)
    # Requests that wait together run together: fewer executions than requests.
    client = httpclient.InferenceServerClient(url)
    before = client.get_inference_statistics("fil_tl")["model_stats"][0]
    burst = [tm.rows(2, seed=500 + i) for i in range(48)]
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda x: http_infer(url, "fil_tl", x), burst))
    for x, y in zip(burst, got, strict=True):
        np.testing.assert_allclose(y, want(repo, "fil_tl", x), rtol=1e-6, atol=1e-7)
    after = client.get_inference_statistics("fil_tl")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 96
    assert after["execution_count"] - before["execution_count"] < 48


def test_threshold_and_class_ids(stack, repo) -> None:
    url, grpc_url = stack
    x = tm.rows(200)
    prob = repo[1]["fil_classes"](x)
    got = http_infer(url, "fil_classes", x)
    assert got.shape == (200,)  # FIL's shape for dims [ 1 ]: one value per row
    np.testing.assert_array_equal(got, (prob[:, 0] > 0.3).astype(np.float32))
    assert 0 < got.sum() < len(x)
    np.testing.assert_array_equal(grpc_infer(grpc_url, "fil_classes", x), got)


def test_fil_doc_configs_load_unchanged_and_take_a_full_batch(stack, repo) -> None:
    url, grpc_url = stack
    x = np.random.default_rng(5).standard_normal((32768, 32)).astype(np.float32)
    for model in ("fil_doc", "fil_doc_old"):
        got = http_infer(url, model, x)
        assert got.shape == (32768,)
        np.testing.assert_array_equal(got, (repo[1][model](x)[:, 0] > 0.5).astype(np.float32))
    config = httpclient.InferenceServerClient(url).get_model_config("fil_doc")
    assert config["max_batch_size"] == 32768 and config["backend"] == "fil"
    q = np.random.default_rng(6).standard_normal((50, 393)).astype(np.float32)
    got = grpc_infer(grpc_url, "fil_qa", q)
    np.testing.assert_allclose(
        got, tm.fil_answer(repo[1]["fil_qa"](q), predict_proba=True, width=2), rtol=1e-6
    )


def test_the_shipped_tree_model_serves_xgboosts_answers(stack, repo) -> None:
    """functions/breast_cancer_xgb, built by make functions, with its committed config."""
    url, grpc_url = stack
    x = _load_script(FUNCTIONS / "build_tree_model.py").dataset()[0]
    p = repo[1]["breast_cancer_xgb"](x)
    for got in (
        http_infer(url, "breast_cancer_xgb", x),
        grpc_infer(grpc_url, "breast_cancer_xgb", x),
    ):
        np.testing.assert_allclose(got, np.stack([1 - p, p], axis=1), rtol=1e-6, atol=1e-7)


def test_a_broken_model_file_is_unavailable_with_the_reason(stack, repo) -> None:
    url, _ = stack
    client = httpclient.InferenceServerClient(url)
    rows = {m["name"]: m for m in client.get_model_repository_index()}
    assert rows["fil_broken"]["state"] == "UNAVAILABLE"
    assert "cannot read" in rows["fil_broken"]["reason"], rows["fil_broken"]
    assert "xgboost.json" in rows["fil_broken"]["reason"]
    assert not client.is_model_ready("fil_broken")
    x = tm.rows(3)
    np.testing.assert_allclose(http_infer(url, "fil_xgb", x), want(repo, "fil_xgb", x), rtol=1e-6)


def test_a_wrong_feature_count_is_a_400(stack) -> None:
    url, _ = stack
    inp = httpclient.InferInput("input__0", [2, tm.FEATURES + 1], "FP32")
    inp.set_data_from_numpy(np.zeros((2, tm.FEATURES + 1), np.float32))
    with pytest.raises(InferenceServerException) as exc:
        httpclient.InferenceServerClient(url).infer("fil_xgb", [inp])
    assert exc.value.status() == "400"
    assert "input__0" in str(exc.value)


def test_an_async_job_answers_what_infer_answers(stack, repo) -> None:
    url, _ = stack
    x = tm.rows(25)
    inp = httpclient.InferInput("input__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    job = submit(url, "fil_lgb", [inp])
    status = wait_done(url, job, timeout=60)
    assert status["status"] == "SUCCESS", status
    got = result(url, job).as_numpy("output__0")
    np.testing.assert_allclose(got, want(repo, "fil_lgb", x), rtol=1e-6, atol=1e-7)


def test_a_batch_job_answers_every_line(stack, repo, s3) -> None:
    url, _ = stack
    asks = [np.nan_to_num(tm.rows(1 + i % 4, seed=100 + i)) for i in range(30)]
    answers = batch_job_outputs(url, s3, "fil_xgb_json", "input__0", asks)
    for x, got in zip(asks, answers, strict=True):
        np.testing.assert_allclose(got, want(repo, "fil_xgb_json", x), rtol=1e-6, atol=1e-7)
