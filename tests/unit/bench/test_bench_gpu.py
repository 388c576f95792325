"""make bench-gpu's own code, on the CPU: the repository it serves, its in-process runners,
its input data, its table, and its refusal to run without a GPU."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from conch.backends.completion import complete
from conch.core.repository import ModelRepository

from unit.bench._bench import bench_run


@pytest.fixture(scope="module")
def run():
    return bench_run()


@pytest.fixture(scope="module")
def gpu_models(run):
    return run.gpu_models


@pytest.fixture(scope="module")
def repo(gpu_models, tmp_path_factory) -> Path:
    """The GPU benchmark's repository as make bench-gpu writes it (KIND_GPU)."""
    return gpu_models.build_repository(tmp_path_factory.mktemp("bench-gpu") / "models")


def test_every_variant_reads_with_conchs_loader_and_its_ensemble_links(gpu_models, repo) -> None:
    entries = ModelRepository(repo, complete=complete, gpu_count=1).scan()
    for variant in gpu_models.VARIANTS:
        for name in (variant.name, *variant.serves):
            assert entries[name].error is None, (name, entries[name].error)
    kinds = {}
    for variant in gpu_models.VARIANTS:
        cfg = entries[variant.batched].spec(1).config
        kinds[variant.name] = [g.kind for g in cfg.instance_group]
        assert [list(g.gpus) for g in cfg.instance_group] == [[0]], variant.name
        accelerators = [
            a.name for a in cfg.optimization.execution_accelerators.gpu_execution_accelerator
        ]
        assert accelerators == (["tensorrt"] if variant.runtime == gpu_models.ORT_TRT else [])
        want_platform = (
            "pytorch_libtorch" if variant.runtime == gpu_models.TORCHSCRIPT else "onnxruntime_onnx"
        )
        assert cfg.platform == want_platform, variant.name
    kind_gpu = type(cfg.instance_group[0]).Kind.Value("KIND_GPU")
    assert all(k == [kind_gpu] for k in kinds.values()), kinds
    # The ensembles call their own encoder, with the tensors the encoder names.
    for suffix in ("", gpu_models.TRT_SUFFIX, gpu_models.TS_SUFFIX):
        cfg = entries[gpu_models.TEXT_NAME + suffix].spec(1).config
        steps = [s.model_name for s in cfg.ensemble_scheduling.step]
        assert steps == [gpu_models.TOKENIZER, gpu_models.ENCODER + suffix, gpu_models.POOLING]


def test_the_tensorrt_models_warm_up_at_their_extreme_shapes(gpu_models, repo) -> None:
    cfg = gpu_models.read_config(repo / (gpu_models.ENCODER + gpu_models.TRT_SUFFIX))
    shapes = sorted((w.batch_size, list(w.inputs["INPUT_IDS"].dims)) for w in cfg.model_warmup)
    assert shapes == [(1, [2]), (64, [256])]
    cfg = gpu_models.read_config(repo / "mlp_large_trt")
    assert sorted(w.batch_size for w in cfg.model_warmup) == [1, 64]


def test_torchscript_twins_compute_what_the_onnx_files_compute(run, gpu_models, repo) -> None:
    inprocess = run.inprocess
    onnx, ts = (gpu_models.BY_NAME[n] for n in ("mlp_large", "mlp_large_ts"))
    x = np.random.default_rng(3).standard_normal((5, 1024), dtype=np.float32)
    want = inprocess.tensor_model(onnx, repo, inprocess.CPU)(x)
    got = inprocess.tensor_model(ts, repo, inprocess.CPU)(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    texts = inprocess.texts(11)  # cycles through the samples: padded to the longest
    want = inprocess.TextEmbedding(gpu_models.BY_NAME["text_embedding"], repo, inprocess.CPU)
    got = inprocess.TextEmbedding(gpu_models.BY_NAME["text_embedding_ts"], repo, inprocess.CPU)
    a, b = want(texts), got(texts)
    assert a.shape == (11, 384)
    np.testing.assert_allclose(b, a, atol=1e-5)


def test_the_torchscript_files_hold_no_device_of_their_own(gpu_models, repo) -> None:
    """A traced op that names the tracing device (an arange on "cpu") fails on cuda:0."""
    import torch

    for name in ("mlp_large_ts", gpu_models.ENCODER + gpu_models.TS_SUFFIX):
        code = torch.jit.load(str(repo / name / "1" / "model.pt")).code
        assert "torch.device(" not in code, name


def test_text_input_data_cycles_through_the_samples(run, gpu_models, repo, tmp_path) -> None:
    path = run.write_input_data(repo, "text_embedding_ts", tmp_path / "in.json")
    data = json.loads(path.read_text())["data"]
    assert [d["TEXT"] for d in data] == [
        {"content": [t], "shape": [1]} for t in gpu_models.TEXT_SAMPLES
    ]


def test_the_gpu_table_gives_ratios_and_says_why_a_row_did_not_run(run) -> None:
    results = run.Results(settings={"models": ["mlp_large_trt", "text_embedding"]})
    results.not_run["mlp_large_trt"] = "no TensorRT: libnvinfer.so.10 missing"
    results.points += [
        run.Point(
            "conch", "text_embedding", 16, infer_per_s=800, p50_ms=20, p99_ms=30, mean_batch=7.6
        ),
        run.Point("conch-grpc", "text_embedding", 16, infer_per_s=400),
    ]
    results.inprocess["text_embedding"] = {1: 500.0, 8: 4000.0}
    results.reference["text_embedding"] = {1: 400.0, 8: 1600.0}
    args = argparse.Namespace(models=["text_embedding"], concurrency=[16])
    lines = run.format_gpu_table(results, args).splitlines()
    trt = [c.strip() for c in lines[2].strip("|").split("|")]
    assert trt[:4] == [
        "mlp_large_trt",
        "onnxruntime TensorRT",
        "-",
        "no TensorRT: libnvinfer.so.10 missing",
    ]
    row = [c.strip() for c in lines[3].strip("|").split("|")]
    assert row[0:3] == ["text_embedding", "onnxruntime CUDA", "16"]
    assert row[7:] == ["400", "0.50", "500", "4,000 @ 8", "0.20", "1,600 @ 8", "0.50"]


def test_without_a_gpu_it_says_so_and_exits_2(run, capsys) -> None:
    from conch.backends.autocomplete import cuda_device_count

    if cuda_device_count():
        pytest.skip("a CUDA device is visible here")
    assert run.main(["--gpu"]) == 2
    assert (
        "make bench-gpu needs a CUDA GPU; see bench/README.md GPU section"
        in capsys.readouterr().err
    )
