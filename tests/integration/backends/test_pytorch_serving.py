"""TorchScript models through the real path: tritonclient → gateway → Redis → worker → torch."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.backends.pytorch import gpu_available

from harness import ROOT, start_gateway, start_worker, wait_model_ready, wait_until

TINY_CNN = ROOT / "functions" / "tiny_cnn"


class Sub(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x - 2.0 * y


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1.0, x.sum(dim=1, keepdim=True)


class BatchProbe(torch.nn.Module):
    """OUTPUT__0 = 2 x, OUTPUT__1 = the number of rows the model saw in this run."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.size(0)
        return x * 2.0, torch.full([n, 1], n, dtype=torch.int64)


def _save(module: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(path))


def _model(repo: Path, name: str, module: torch.nn.Module, config: str) -> None:
    _save(module, repo / name / "1" / "model.pt")
    (repo / name / "config.pbtxt").write_text(config)


def build_repo(root: Path) -> Path:
    root.mkdir(parents=True)
    shutil.copytree(TINY_CNN, root / "tiny_cnn")
    gpu = root / "tiny_cnn_gpu"
    shutil.copytree(TINY_CNN, gpu)
    cfg = (gpu / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "tiny_cnn"', 'name: "tiny_cnn_gpu"').replace("KIND_CPU", "KIND_GPU")
    (gpu / "config.pbtxt").write_text(cfg)
    # forward(x, y), served under its argument names, listed in the other order.
    _model(
        root,
        "pt_sub",
        Sub(),
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
    )
    _model(
        root,
        "pt_pair",
        Pair(),
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] },'
        ' { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n',
    )
    _model(
        root,
        "pt_probe",
        BatchProbe(),
        'platform: "pytorch_libtorch"\nmax_batch_size: 32\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] },'
        ' { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 200000 }\n",
    )
    _model(
        root,
        "pt_text",
        Pair(),
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "TEXT__0" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
    )
    return root


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[str]:
    repo = build_repo(tmp_path_factory.mktemp("pytorch") / "models")
    worker = start_worker(repo, redis_url, log_dir)
    gateway, url = start_gateway(repo, redis_url, log_dir)
    try:
        for m in ("tiny_cnn", "pt_sub", "pt_pair", "pt_probe"):
            wait_model_ready(url, m, 120, worker, gateway)
        yield url
    finally:
        gateway.stop()
        worker.stop()


@pytest.fixture()
def client(stack: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(stack)


def _input(name: str, x: np.ndarray, binary: bool = True, dtype: str = "FP32"):
    inp = httpclient.InferInput(name, list(x.shape), dtype)
    inp.set_data_from_numpy(x, binary_data=binary)
    return inp


def _torch_reference(x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(TINY_CNN / "1" / "model.pt"))
    with torch.inference_mode():
        return module(torch.from_numpy(x)).numpy()


def _images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 1, 8, 8)).astype(np.float32)


def test_metadata_and_config(client) -> None:
    meta = client.get_model_metadata("tiny_cnn")
    assert meta["platform"] == "pytorch_libtorch"
    assert meta["inputs"] == [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert meta["outputs"] == [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, 10]}]
    cfg = client.get_model_config("tiny_cnn")
    assert cfg["backend"] == "pytorch"
    # platform given: Triton writes no default_model_filename (model.pt is still loaded)
    assert cfg["default_model_filename"] == ""
    assert cfg["parameters"]["INTRA_OP_THREAD_COUNT"]["string_value"] == "1"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tiny_cnn_matches_torch(client, binary: bool) -> None:
    x = _images(5, seed=1)
    out = httpclient.InferRequestedOutput("OUTPUT__0", binary_data=binary)
    got = client.infer("tiny_cnn", [_input("INPUT__0", x, binary)], outputs=[out]).as_numpy(
        "OUTPUT__0"
    )
    assert got.dtype == np.float32 and got.shape == (5, 10)
    np.testing.assert_allclose(got, _torch_reference(x), rtol=1e-5, atol=1e-5)
    from build_models import reference_tiny_cnn  # functions/ is on the path via harness

    np.testing.assert_allclose(got, reference_tiny_cnn(x), rtol=1e-4, atol=1e-4)


def test_tiny_cnn_concurrent_requests_of_different_sizes(stack: str) -> None:
    sizes = [1, 4, 2, 7, 3, 1, 5, 2]
    xs = [_images(n, seed=10 + i) for i, n in enumerate(sizes)]

    def one(x: np.ndarray) -> np.ndarray:
        c = httpclient.InferenceServerClient(stack)
        return c.infer("tiny_cnn", [_input("INPUT__0", x)]).as_numpy("OUTPUT__0")

    with ThreadPoolExecutor(len(xs)) as pool:
        results = list(pool.map(one, xs))
    for x, got in zip(xs, results, strict=True):
        assert got.shape == (len(x), 10)
        np.testing.assert_allclose(got, _torch_reference(x), rtol=1e-5, atol=1e-5)


def test_dynamic_batch_stacks_requests_of_different_sizes(stack: str) -> None:
    sizes = [1, 2, 3, 4, 5]
    xs = [np.full((n, 2), float(i + 1), np.float32) for i, n in enumerate(sizes)]

    def one(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = httpclient.InferenceServerClient(stack)
        res = c.infer("pt_probe", [_input("INPUT__0", x)])
        return res.as_numpy("OUTPUT__0"), res.as_numpy("OUTPUT__1")

    with ThreadPoolExecutor(len(xs)) as pool:
        results = list(pool.map(one, xs))
    rows_seen = []
    for x, (doubled, rows) in zip(xs, results, strict=True):
        np.testing.assert_array_equal(doubled, x * 2)  # each request gets its own rows back
        assert rows.shape == (len(x), 1) and len(set(rows.ravel())) == 1
        assert rows[0, 0] >= len(x)
        rows_seen.append(int(rows[0, 0]))
    # The 200 ms queue delay lets the concurrent requests meet in one model run.
    assert max(rows_seen) > max(sizes), rows_seen


def test_inputs_by_forward_argument_names(client) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.ones((2, 4), np.float32) * 0.5
    for binary in (True, False):
        res = client.infer("pt_sub", [_input("x", x, binary), _input("y", y, binary)])
        np.testing.assert_array_equal(res.as_numpy("OUTPUT__0"), x - 2 * y)


def test_tuple_outputs(client) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    res = client.infer("pt_pair", [_input("INPUT__0", x)])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT__0"), x + 1)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT__1"), x.sum(1, keepdims=True))
    only = client.infer(
        "pt_pair",
        [_input("INPUT__0", x)],
        outputs=[httpclient.InferRequestedOutput("OUTPUT__1", binary_data=False)],
    )
    assert only.as_numpy("OUTPUT__0") is None
    np.testing.assert_array_equal(only.as_numpy("OUTPUT__1"), x.sum(1, keepdims=True))


def test_type_string_model_is_unavailable_with_the_reason(client) -> None:
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["pt_text"]["state"] == "UNAVAILABLE"
    # Triton refuses it too: a string tensor of a model that batches needs reshape: [ ]
    # (tests/integration/serving/test_triton_parity_torch_strings.py serves those).
    reason = index["pt_text"]["reason"]
    assert "1 dimensional List of String as input for 'TEXT__0'" in reason
    assert not client.is_model_ready("pt_text")


def test_kind_gpu_serves_on_a_gpu_or_says_why_not(client, stack: str) -> None:
    x = _images(2, seed=5)
    ok, reason = gpu_available()
    if ok:
        wait_model_ready(stack, "tiny_cnn_gpu", 120)
        got = client.infer("tiny_cnn_gpu", [_input("INPUT__0", x)]).as_numpy("OUTPUT__0")
        np.testing.assert_allclose(got, _torch_reference(x), rtol=1e-3, atol=1e-3)
        return

    # No usable GPU here: the worker reports the model unavailable with torch's reason.
    def state() -> dict:
        return {m["name"]: m for m in client.get_model_repository_index()}["tiny_cnn_gpu"]

    # The worker reports models as it loads them: wait for this one's outcome.
    wait_until(lambda: "KIND_GPU" in state().get("reason", ""), 60, "tiny_cnn_gpu's reason")
    row = state()
    assert row["state"] == "UNAVAILABLE"
    assert f"model 'tiny_cnn_gpu' asks for KIND_GPU but {reason}" in row["reason"]
    assert not client.is_model_ready("tiny_cnn_gpu")
    with pytest.raises(InferenceServerException, match="KIND_GPU") as exc:
        client.infer("tiny_cnn_gpu", [_input("INPUT__0", x)])
    assert exc.value.status() == "503"
