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
    assert len(trt) == len(lines[0].strip("|").split("|"))
    row = [c.strip() for c in lines[3].strip("|").split("|")]
    assert row[0:3] == ["text_embedding", "onnxruntime CUDA", "16"]
    assert row[7:9] == ["400", "0.50"]
    assert row[9:12] == ["not served by Triton", "-", "-"]
    assert row[12:] == ["500", "4,000 @ 8", "0.20", "1,600 @ 8", "0.50"]


def test_the_gpu_table_compares_each_mlp_variant_with_tritons_mlp_large(run) -> None:
    """conch HTTP ÷ Triton at the same concurrency, the _ts variant against its workload's
    Triton model; where Triton stopped, the rows it did not reach say why."""
    results = run.Results(settings={"models": ["mlp_large", "mlp_large_ts"]})
    results.points += [
        run.Point("conch", "mlp_large", 16, infer_per_s=3000, p50_ms=5, mean_batch=8),
        run.Point("conch", "mlp_large_ts", 16, infer_per_s=1500, p50_ms=9, mean_batch=8),
        run.Point("conch", "mlp_large", 64, infer_per_s=3600, p50_ms=17, mean_batch=30),
        run.Point("triton", "mlp_large", 16, infer_per_s=4000, p50_ms=3.5),
    ]
    results.servers_not_run["triton"] = "tritonserver exited with status 1"
    results.settings["triton_providers"] = {
        "mlp_large": "CUDAExecutionProvider (onnxruntime 1.31.1; a KIND_GPU instance on GPU 0)"
    }
    args = argparse.Namespace(models=["mlp_large", "mlp_large_ts"], concurrency=[16, 64])
    text = run.format_gpu_table(results, args)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:6]]
    assert [r[9:12] for r in rows] == [
        ["4,000", "3.50", "0.75"],
        ["not run: tritonserver exited with status 1", "-", "-"],
        ["4,000 (mlp_large)", "3.50", "0.38"],
        ["not run: tritonserver exited with status 1", "-", "-"],
    ]
    assert "mlp_large on CUDAExecutionProvider (onnxruntime 1.31.1" in text
    args.skip_triton = True
    lines = run.format_gpu_table(results, args).splitlines()[2:6]
    assert [line.split("|")[10].strip() for line in lines] == ["skipped"] * 4


def test_tritons_repository_is_conchs_config_as_a_python_model(run, gpu_models, repo) -> None:
    """make bench-gpu's Triton serves the MLP workloads as Python models on conch's .onnx, with
    conch's batching and one instance of the kind asked for; conch's loader reads them."""
    chosen = ["mlp_large_trt", "text_embedding", "mlp_large", "mlp_large_ts"]
    assert gpu_models.triton_served(chosen) == ["mlp_large"]
    assert gpu_models.triton_model("text_embedding_ts") is None
    names = gpu_models.triton_served(["mlp", *chosen])
    trepo = gpu_models.build_triton_repository(repo, names)
    assert trepo == gpu_models.triton_out(repo) and trepo.parent == repo.parent
    assert sorted(p.name for p in trepo.iterdir()) == ["mlp", "mlp_large"]
    entries = ModelRepository(trepo, complete=complete, gpu_count=1).scan()
    for name in names:
        ours, theirs = gpu_models.read_config(repo / name), gpu_models.read_config(trepo / name)
        assert (theirs.backend, theirs.platform) == ("python", "")
        assert theirs.max_batch_size == ours.max_batch_size > 0
        assert theirs.dynamic_batching == ours.dynamic_batching
        assert theirs.dynamic_batching.max_queue_delay_microseconds > 0
        assert (list(theirs.input), list(theirs.output)) == (list(ours.input), list(ours.output))
        kind_gpu = type(theirs.instance_group[0]).Kind.Value("KIND_GPU")
        assert [(g.kind, g.count, list(g.gpus)) for g in theirs.instance_group] == [
            (kind_gpu, 1, [0])
        ]
        folder = trepo / name / "1"
        assert (folder / "model.py").read_text() == run.models.PY_MODEL
        assert (folder / "model.onnx").samefile(repo / name / "1" / "model.onnx") or (
            (folder / "model.onnx").read_bytes() == (repo / name / "1" / "model.onnx").read_bytes()
        )
        assert entries[name].error is None, entries[name].error
    rehearsal = gpu_models.build_triton_repository(repo, ["mlp"], kind="KIND_CPU")
    assert sorted(p.name for p in rehearsal.iterdir()) == ["mlp"]  # written anew
    cfg = gpu_models.read_config(rehearsal / "mlp")
    assert [(g.kind, list(g.gpus)) for g in cfg.instance_group] == [
        (type(cfg.instance_group[0]).Kind.Value("KIND_CPU"), [])
    ]


def test_tritons_model_says_which_provider_it_got_and_the_run_reads_it(
    run, gpu_models, repo, tmp_path, capsys
) -> None:
    """PY_MODEL through conch's Python backend: a KIND_GPU instance with an onnxruntime that has
    no CUDA provider falls back to the CPU and says why, a KIND_CPU one runs on the CPU; the
    lines it prints are what bench_triton reads from the server's log."""
    import onnxruntime as ort

    from conch.backends import BackendRequest, InstanceSpec, backend_class

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    trepo = gpu_models.build_triton_repository(repo, ["mlp"])
    entry = ModelRepository(trepo, complete=complete, gpu_count=1).scan()["mlp"]
    x = np.random.default_rng(5).standard_normal((3, 64), dtype=np.float32)
    outputs = []
    for kind in ("GPU", "CPU"):
        backend = backend_class(entry.backend)(entry.spec(1), InstanceSpec("mlp_0", kind, 0))
        backend.load()
        try:
            [result] = backend.execute([BackendRequest({"INPUT0": x}, ["OUTPUT0"])])
            assert isinstance(result, dict), result
            outputs.append(result["OUTPUT0"])
        finally:
            backend.unload()
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-6)
    assert outputs[0].shape == (3, 16)
    printed = capsys.readouterr().out
    log = tmp_path / "tritonserver.log"
    log.write_text("I1128 model loading\n" + printed)
    mark = run.models.PROVIDER_MARK
    assert [line.split(": ", 1)[1] for line in printed.splitlines() if mark in line] == [
        "CPUExecutionProvider (onnxruntime "
        f"{ort.__version__}; a KIND_GPU instance, but this onnxruntime has no "
        "CUDAExecutionProvider)",
        f"CPUExecutionProvider (onnxruntime {ort.__version__}; a KIND_CPU instance)",
    ]
    # The last line of a model wins: its instance that loaded last.
    assert run.triton_providers(log) == {
        "mlp": f"CPUExecutionProvider (onnxruntime {ort.__version__}; a KIND_CPU instance)"
    }


def test_without_a_gpu_it_says_so_and_exits_2(run, capsys) -> None:
    from conch.backends.autocomplete import cuda_device_count

    if cuda_device_count():
        pytest.skip("a CUDA device is visible here")
    assert run.main(["--gpu"]) == 2
    assert (
        "make bench-gpu needs a CUDA GPU; see bench/README.md GPU section"
        in capsys.readouterr().err
    )


def test_where_triton_cannot_start_the_run_goes_on_and_says_why(run, repo, tmp_path) -> None:
    args = run.parse_args(["--gpu", "--models", "mlp_large,text_embedding"])
    args.triton_venv = tmp_path / "no-venv"
    results = run.Results()
    pa = run.PaOptions("perf_analyzer", 1000, 100, 3)
    run.bench_triton_gpu(args, repo, pa, tmp_path, results)  # does not raise
    assert results.servers_not_run == {
        "triton": f"Triton is not installed in {tmp_path / 'no-venv'}: run bench/triton_venv.sh, "
        "or pass --skip-triton"
    }
    assert not results.points
    # Nothing for Triton to serve (text_embedding), or --skip-triton: not even tried.
    for argv in (["--models", "text_embedding"], ["--models", "mlp_large", "--skip-triton"]):
        args = run.parse_args(["--gpu", *argv])
        args.triton_venv = tmp_path / "no-venv"
        results = run.Results()
        run.bench_triton_gpu(args, repo, pa, tmp_path, results)
        assert results.servers_not_run == {}


def test_a_servers_error_line_is_what_its_row_says(run) -> None:
    exc = RuntimeError(
        "tritonserver exited with status 1; last lines of x.log:\n"
        "I1128 server.cc:345] stopping\n"
        "error: creating server: Invalid argument - gpu id 0\n"
    )
    assert run._why(exc) == "error: creating server: Invalid argument - gpu id 0"
    assert run._why(RuntimeError("no venv\nmore")) == "no venv"
    assert run._why(RuntimeError()) == "RuntimeError"
