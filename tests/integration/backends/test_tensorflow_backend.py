"""TensorFlow models through the real path: tritonclient (HTTP and gRPC) → gateway and
gRPC server → Redis → one worker → tensorflow; async jobs and an S3 batch job too.

Every model is built here, at test time (tests/tf_models.py): a Keras model saved as a
SavedModel, a tf.Module with tf.string signatures, a frozen GraphDef. Each answer is
compared with the same model run by tensorflow in this process. One worker serves them
all, so tensorflow is imported once per process.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tf_models
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from harness import (
    fresh_db,
    start_gateway,
    start_grpc,
    start_worker,
    wait_model_ready,
    wait_until,
)
from integration.jobs.test_jobs import result, submit, wait_done
from integration.jobs.test_offline import batch_job_outputs

pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")

ONE_THREAD = (
    'parameters { key: "TF_NUM_INTRA_THREADS" value { string_value: "1" } }\n'
    'parameters { key: "TF_NUM_INTER_THREADS" value { string_value: "1" } }\n'
)

# The parameters section of tensorflow_backend's README, as a Triton user would paste
# it (for a GraphDef the tag and signature mean nothing; the init ops run).
README_PARAMETERS = """
parameters: {
  key: "TF_NUM_INTRA_THREADS"
  value: {
    string_value:"2"
  }
}

parameters: {
  key: "TF_USE_PER_SESSION_THREADS"
  value: {
    string_value:"yes"
  }
}

parameters: {
  key: "TF_GRAPH_TAG"
  value: {
    string_value: "serve1"
  }
}

parameters: {
  key: "TF_INIT_OPS_FILE"
  value: {
    string_value: "init_ops.json"
  }
}

parameters: {
  key: "TF_SIGNATURE_DEF"
  value: {
    string_value: "serving2"
  }
}
"""

GRAPHDEF_IO = (
    'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] },'
    ' { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    'output [ { name: "out" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
)

MODELS = ("tf_dense", "tf_auto", "tf_text", "tf_doubled", "tf_graphdef", "tf_readme")


def build_repo(root: Path) -> Path:
    dense = root / "tf_dense" / "1" / "model.savedmodel"
    tf_models.save_keras_dense(dense)
    (root / "tf_dense" / "config.pbtxt").write_text(
        'platform: "tensorflow_savedmodel"\nmax_batch_size: 16\n'
        'input [ { name: "features" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "output_0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 200000 }\n" + ONE_THREAD
    )
    # No config.pbtxt at all: everything from the file and the signature.
    shutil.copytree(dense, root / "tf_auto" / "1" / "model.savedmodel")
    text = root / "tf_text" / "1" / "model.savedmodel"
    tf_models.save_text_module(text)
    shutil.copytree(text, root / "tf_doubled" / "1" / "model.savedmodel")
    (root / "tf_doubled" / "config.pbtxt").write_text(
        'parameters { key: "TF_SIGNATURE_DEF" value { string_value: "doubled" } }\n'
    )
    tf_models.save_graphdef(root / "tf_graphdef" / "1" / "model.graphdef")
    (root / "tf_graphdef" / "config.pbtxt").write_text(
        'platform: "tensorflow_graphdef"\nmax_batch_size: 8\n' + GRAPHDEF_IO + ONE_THREAD
    )
    # Triton's documented config pieces, unchanged: the platform line and the parameters.
    tf_models.save_graphdef(root / "tf_readme" / "1" / "model.graphdef", init_op="init")
    (root / "tf_readme" / "1" / "init_ops.json").write_text(json.dumps({"init_ops": ["init"]}))
    (root / "tf_readme" / "config.pbtxt").write_text(
        '# config.pbtxt for Graphdef format\nplatform: "tensorflow_graphdef"\n'
        "max_batch_size: 8\n" + GRAPHDEF_IO + README_PARAMETERS
    )
    # A SavedModel folder whose saved_model.pb is not one.
    broken = root / "tf_broken" / "1" / "model.savedmodel"
    broken.mkdir(parents=True)
    (broken / "saved_model.pb").write_bytes(b"\xff\xff not a protobuf")
    (root / "tf_broken" / "config.pbtxt").write_text(
        'platform: "tensorflow_savedmodel"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    # A readable signature but no weights: only tensorflow in the worker finds out.
    novars = root / "tf_novars" / "1" / "model.savedmodel"
    shutil.copytree(dense, novars)
    shutil.rmtree(novars / "variables")
    return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return build_repo(tmp_path_factory.mktemp("tensorflow") / "models")


@pytest.fixture(scope="module")
def stack(repo: Path, redis_url: str, log_dir: Path, s3_endpoint: str) -> Iterator[dict]:
    db = fresh_db(redis_url, 13)
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    served = ",".join((*MODELS, "tf_novars"))
    worker = start_worker(repo, db, log_dir, "--models", served, env=env)
    gateway, url = start_gateway(repo, db, log_dir)
    grpc, grpc_url = start_grpc(repo, db, log_dir)
    try:
        for m in MODELS:
            wait_model_ready(url, m, 180, worker, gateway)
        yield {"url": url, "grpc": grpc_url, "worker": worker, "repo": repo}
    finally:
        grpc.stop()
        gateway.stop()
        worker.stop()


def _features(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def _dense_reference(repo: Path, x: np.ndarray) -> np.ndarray:
    path = repo / "tf_dense" / "1" / "model.savedmodel"
    return tf_models.run_saved_model(path, "serving_default", features=x)["output_0"]


def _http_input(name: str, x: np.ndarray, dtype: str = "FP32", binary: bool = True):
    inp = httpclient.InferInput(name, list(x.shape), dtype)
    inp.set_data_from_numpy(x, binary_data=binary)
    return inp


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_keras_saved_model_answers_as_tensorflow_over_http(stack: dict, binary: bool) -> None:
    client = httpclient.InferenceServerClient(stack["url"])
    x = _features(5, seed=1)
    out = httpclient.InferRequestedOutput("output_0", binary_data=binary)
    got = client.infer("tf_dense", [_http_input("features", x, binary=binary)], outputs=[out])
    np.testing.assert_allclose(
        got.as_numpy("output_0"), _dense_reference(stack["repo"], x), rtol=1e-6
    )


def test_grpc_answers_the_same(stack: dict) -> None:
    client = grpcclient.InferenceServerClient(stack["grpc"])
    x = _features(3, seed=2)
    inp = grpcclient.InferInput("features", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("tf_dense", [inp]).as_numpy("output_0")
    np.testing.assert_allclose(got, _dense_reference(stack["repo"], x), rtol=1e-6)
    # BYTES in and out over gRPC too.
    text = np.array([[b"grpc"]], dtype=object)
    inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(text)
    assert client.infer("tf_text", [inp]).as_numpy("UPPER").tolist() == [[b"GRPC"]]
    client.close()


def test_concurrent_requests_are_batched_and_split_back(stack: dict) -> None:
    xs = [_features(n, seed=10 + i) for i, n in enumerate([1, 3, 2, 4, 1, 2])]

    def one(x: np.ndarray) -> np.ndarray:
        c = httpclient.InferenceServerClient(stack["url"])
        return c.infer("tf_dense", [_http_input("features", x)]).as_numpy("output_0")

    before = _executions(stack["url"], "tf_dense")
    with ThreadPoolExecutor(len(xs)) as pool:
        results = list(pool.map(one, xs))
    for x, got in zip(xs, results, strict=True):
        np.testing.assert_allclose(got, _dense_reference(stack["repo"], x), rtol=1e-6)
    after = _executions(stack["url"], "tf_dense")
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == len(xs)
    assert executions < len(xs)  # the queue delay lets requests meet in one run


def _executions(url: str, model: str) -> tuple[int, int]:
    """(requests answered, model runs) so far."""
    stats = httpclient.InferenceServerClient(url).get_inference_statistics(model)
    s = stats["model_stats"][0]
    return int(s["inference_stats"]["success"]["count"]), int(s["execution_count"])


def test_auto_complete_with_no_config(stack: dict) -> None:
    client = httpclient.InferenceServerClient(stack["url"])
    cfg = client.get_model_config("tf_auto")
    assert cfg["platform"] == "tensorflow_savedmodel" and cfg["backend"] == "tensorflow"
    assert cfg["default_model_filename"] == "model.savedmodel"
    assert cfg["max_batch_size"] == 4 and "dynamic_batching" in cfg
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == [
        ("features", "TYPE_FP32", [4])
    ]
    assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == [
        ("output_0", "TYPE_FP32", [3])
    ]
    x = _features(2, seed=3)
    got = client.infer("tf_auto", [_http_input("features", x)]).as_numpy("output_0")
    np.testing.assert_allclose(got, _dense_reference(stack["repo"], x), rtol=1e-6)


def test_strings_in_and_out(stack: dict) -> None:
    client = httpclient.InferenceServerClient(stack["url"])
    meta = client.get_model_metadata("tf_text")
    assert meta["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    text = np.array([["héllo".encode()], [b"ab"], [b""]], dtype=object)
    for binary in (True, False):
        res = client.infer("tf_text", [_http_input("TEXT", text, "BYTES", binary)])
        want = tf_models.run_saved_model(
            stack["repo"] / "tf_text" / "1" / "model.savedmodel", "serving_default", TEXT=text
        )
        assert res.as_numpy("UPPER").tolist() == want["UPPER"].tolist()
        np.testing.assert_array_equal(res.as_numpy("LENGTH"), want["LENGTH"])


def test_the_signature_named_in_parameters(stack: dict) -> None:
    client = httpclient.InferenceServerClient(stack["url"])
    cfg = client.get_model_config("tf_doubled")
    assert [o["name"] for o in cfg["output"]] == ["TWICE"]
    text = np.array([[b"ab"], [b"c"]], dtype=object)
    res = client.infer("tf_doubled", [_http_input("TEXT", text, "BYTES")])
    assert res.as_numpy("TWICE").tolist() == [[b"abab"], [b"cc"]]


@pytest.mark.parametrize("model", ["tf_graphdef", "tf_readme"])
def test_a_frozen_graphdef_by_node_names(stack: dict, model: str) -> None:
    client = httpclient.InferenceServerClient(stack["url"])
    x, y = _features(3, seed=4)[:, :2].copy(), _features(3, seed=5)[:, 2:].copy()
    res = client.infer(model, [_http_input("x", x), _http_input("y", y)])
    np.testing.assert_allclose(res.as_numpy("out"), tf_models.graphdef_reference(x, y), rtol=1e-6)


def test_an_async_job(stack: dict) -> None:
    x = _features(2, seed=6)
    job = submit(stack["url"], "tf_dense", [_http_input("features", x)])
    assert wait_done(stack["url"], job, timeout=60)["status"] == "SUCCESS"
    got = result(stack["url"], job).as_numpy("output_0")
    np.testing.assert_allclose(got, _dense_reference(stack["repo"], x), rtol=1e-6)


def test_a_batch_job(stack: dict, s3) -> None:
    xs = [_features(1 + i % 2, seed=20 + i) for i in range(6)]
    answers = batch_job_outputs(stack["url"], s3, "tf_dense", "features", xs)
    for x, got in zip(xs, answers, strict=True):
        want = _dense_reference(stack["repo"], x)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


def test_a_bad_model_file_is_a_clear_load_error_and_the_others_serve(stack: dict) -> None:
    client = httpclient.InferenceServerClient(stack["url"])
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["tf_broken"]["state"] == "UNAVAILABLE"
    assert "cannot read" in index["tf_broken"]["reason"]
    assert "saved_model.pb" in index["tf_broken"]["reason"]

    # The worker fails to load the other one, and says why where clients look.
    def novars_reason() -> str:
        index = {m["name"]: m for m in client.get_model_repository_index()}
        return index["tf_novars"].get("reason", "")

    wait_until(lambda: "tensorflow cannot load" in novars_reason(), 30, "tf_novars's load error")
    assert not client.is_model_ready("tf_novars")
    assert client.is_model_ready("tf_dense")
    x = _features(1, seed=7)
    got = client.infer("tf_dense", [_http_input("features", x)]).as_numpy("output_0")
    np.testing.assert_allclose(got, _dense_reference(stack["repo"], x), rtol=1e-6)
