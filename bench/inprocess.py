"""The benchmark's in-process side: the served files run in this process, with no server.

What conch is compared against: an onnxruntime session with the options conch's worker gives
it (1 intra-op and 1 inter-op thread, all graph optimizations) on the CPU, CUDA's provider or
TensorRT's (as a ``KIND_GPU`` instance asks), and for the GPU benchmark also the TorchScript
file on torch's CUDA device, ``text_embedding``'s own tokenizer and pooling around its
encoder, and sentence-transformers' ``encode`` of the same texts. Every call takes host
arrays and returns host arrays, as a worker's batch does, so copies to and from the GPU count.
"""

from __future__ import annotations

import importlib.util
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_models
import numpy as np

# conch's onnxruntime session options (conch/backends/onnxruntime.py): the config sets no
# intra_op_thread_count / inter_op_thread_count, so both are 1; optimization level default.
ORT_INTRA_OP_THREADS = 1
ORT_INTER_OP_THREADS = 1

CPU, CUDA, TENSORRT = "cpu", "cuda", "tensorrt"
GPU_NEEDED = "make bench-gpu needs a CUDA GPU; see bench/README.md GPU section"


def ort_session(model_file: Path, provider: str = CPU) -> Any:
    """The session conch's worker makes for the model: ``provider`` CPU, CUDA (device 0, as
    a KIND_GPU instance) or TensorRT (then CUDA, as conch asks for a ``tensorrt``
    accelerator). Raises when the session did not get the provider asked for."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = ORT_INTRA_OP_THREADS
    opts.inter_op_num_threads = ORT_INTER_OP_THREADS
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    providers: list[Any] = ["CPUExecutionProvider"]
    if provider in (CUDA, TENSORRT):
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": 0}))
    if provider == TENSORRT:
        providers.insert(0, ("TensorrtExecutionProvider", {"device_id": 0}))
    session = ort.InferenceSession(str(model_file), opts, providers=providers)
    wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
    if session.get_providers()[0] != wanted:
        raise RuntimeError(
            f"onnxruntime cannot run {model_file} on {wanted} here "
            f"(the session has {session.get_providers()})"
        )
    return session


def rate(call: Callable[[], Any], rows: int, budget_s: float) -> float:
    """Rows per second of ``call`` (``rows`` rows a call): two untimed calls, then calls
    until ``budget_s`` has passed and at least three ran."""
    for _ in range(2):
        call()
    runs = 0
    start = time.perf_counter()
    while True:
        call()
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s and runs >= 3:
            return rows * runs / elapsed


def rows_per_second(session: Any, batch: int, budget_s: float) -> float:
    """An FP32 model's session at ``batch`` rows of standard-normal data."""
    inp = session.get_inputs()[0]
    width = int(inp.shape[1])
    x = np.random.default_rng(batch).standard_normal((batch, width), dtype=np.float32)
    feed = {inp.name: x}
    return rate(lambda: session.run(None, feed), batch, budget_s)


# --------------------------------------------------------------------------- GPU checks


def gpu_problem() -> str | None:
    """Why the GPU benchmark cannot run here, or None: a visible CUDA device, onnxruntime's
    CUDA provider and a CUDA build of torch (the TorchScript variants)."""
    import onnxruntime as ort

    from conch.backends.autocomplete import cuda_device_count

    if cuda_device_count() == 0:
        return f"{GPU_NEEDED} (no CUDA device is visible to this process)"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (
            f"{GPU_NEEDED} (onnxruntime {ort.__version__} has no CUDAExecutionProvider: "
            "install onnxruntime-gpu)"
        )
    import torch

    if not torch.cuda.is_available():
        return f"{GPU_NEEDED} (torch {torch.__version__} sees no CUDA device)"
    return None


def gpu_name() -> str:
    """The name of CUDA device 0, as torch reports it."""
    import torch

    return torch.cuda.get_device_name(0)


def tensorrt_problem(model_file: Path) -> str | None:
    """Why onnxruntime's TensorRT provider does not run ``model_file`` here, or None.

    onnxruntime-gpu lists the provider whether or not TensorRT's libraries are installed,
    and falls back to CUDA when they are not: a session is the only true test."""
    import onnxruntime as ort

    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no TensorrtExecutionProvider"
    try:
        ort_session(model_file, TENSORRT)
    except Exception as exc:  # onnxruntime raises its own types, or ours above
        return f"onnxruntime's TensorRT provider did not load: {str(exc).splitlines()[0]}"
    return None


# --------------------------------------------------------------------------- variants


def _sibling(folder: Path, module: str) -> Any:
    """A text_embedding step's helper module (``<folder>/1/<module>.py``), from its file."""
    spec = importlib.util.spec_from_file_location(module, folder / "1" / f"{module}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class TorchScript:
    """A TorchScript file on ``device``: numpy in, numpy out (the copies included)."""

    def __init__(self, path: Path, device: str) -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.module = torch.jit.load(str(path), map_location=self.device).eval()

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            args = [self.torch.from_numpy(a).to(self.device) for a in arrays]
            return self.module(*args).cpu().numpy()


def _provider(variant: gpu_models.Variant, device: str) -> str:
    if device == CPU:
        return CPU
    return TENSORRT if variant.runtime == gpu_models.ORT_TRT else CUDA


def tensor_model(variant: gpu_models.Variant, repo: Path, device: str) -> Callable[..., np.ndarray]:
    """The variant's tensor model (an ensemble's encoder step) as a call on host arrays."""
    folder = repo / variant.batched / "1"
    if variant.runtime == gpu_models.TORCHSCRIPT:
        return TorchScript(folder / "model.pt", device)
    session = ort_session(folder / "model.onnx", _provider(variant, device))
    names = [i.name for i in session.get_inputs()]

    def run(*arrays: np.ndarray) -> np.ndarray:
        return session.run(None, dict(zip(names, arrays, strict=True)))[0]

    return run


def texts(batch: int) -> list[str]:
    """``batch`` of the benchmark's texts, in the order perf_analyzer sends them."""
    return list(itertools.islice(itertools.cycle(gpu_models.TEXT_SAMPLES), batch))


class TextEmbedding:
    """text_embedding in process: its tokenizer, the variant's encoder, its pooling."""

    def __init__(self, variant: gpu_models.Variant, repo: Path, device: str) -> None:
        tokens = _sibling(repo / gpu_models.TOKENIZER, "minilm_tokens")
        self.tokenizer = tokens.load(str(repo / gpu_models.TOKENIZER / "1"))
        self.encode = tokens.encode
        self.pool = _sibling(repo / gpu_models.POOLING, "minilm_pooling").mean_pool_normalize
        self.encoder = tensor_model(variant, repo, device)

    def __call__(self, batch: list[str]) -> np.ndarray:
        ids, mask = self.encode(self.tokenizer, batch)
        return self.pool(self.encoder(ids, mask), mask)

    def warm_extremes(self) -> None:
        """Run the shapes the served TensorRT model warms up with (its engine's range)."""
        for b, t in ((1, gpu_models.TEXT_MIN_TOKENS), (64, gpu_models.TEXT_MAX_TOKENS)):
            self.encoder(np.ones((b, t), dtype=np.int64), np.ones((b, t), dtype=np.int64))


def sentence_transformer(device: str) -> Any:
    """sentence-transformers' all-MiniLM-L6-v2 from the packaged folder, on ``device``."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gpu_models.text_model_folder()), device=device)


def measure_variant(
    variant: gpu_models.Variant, repo: Path, batches: list[int], budget_s: float, device: str
) -> tuple[dict[int, float], float | None]:
    """Rows per second at each batch size, and for text_embedding the lowest cosine of its
    embeddings against sentence-transformers' (None for the MLPs)."""
    out: dict[int, float] = {}
    if variant.family == gpu_models.TEXT_NAME:
        model = TextEmbedding(variant, repo, device)
        if variant.runtime == gpu_models.ORT_TRT:
            model.warm_extremes()
        for b in batches:
            batch = texts(b)
            out[b] = rate(lambda batch=batch: model(batch), b, budget_s)
        want = sentence_transformer(device).encode(
            list(gpu_models.TEXT_SAMPLES), normalize_embeddings=True
        )
        got = model(list(gpu_models.TEXT_SAMPLES))
        return out, float((got * want).sum(axis=1).min())
    call = tensor_model(variant, repo, device)
    config = gpu_models.read_config(repo / variant.batched)
    width = int(config.input[0].dims[0])
    if variant.runtime == gpu_models.ORT_TRT:
        for b in (1, config.max_batch_size):
            call(np.zeros((b, width), dtype=np.float32))
    for b in batches:
        x = np.random.default_rng(b).standard_normal((b, width), dtype=np.float32)
        out[b] = rate(lambda x=x: call(x), b, budget_s)
    return out, None


def measure_sentence_transformers(
    batches: list[int], budget_s: float, device: str
) -> dict[int, float]:
    """sentence-transformers' ``encode`` of the benchmark's texts, ``batch_size`` = batch."""
    model = sentence_transformer(device)
    return {
        b: rate(
            lambda b=b: model.encode(texts(b), batch_size=b, normalize_embeddings=True),
            b,
            budget_s,
        )
        for b in batches
    }
