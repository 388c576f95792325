"""The GPU benchmark's model repository: each workload once per GPU runtime.

``make bench-gpu`` (``bench/run.py --gpu``) serves these with conch and runs the same files in
process. Two workloads, three runtimes each:

* ``mlp_large`` (bench/models.py's compute-bound MLP) on onnxruntime's CUDA provider;
  ``mlp_large_trt``, the same ``.onnx`` with ``gpu_execution_accelerator`` ``tensorrt``
  (onnxruntime's TensorRT provider); ``mlp_large_ts``, the same weights as TorchScript on the
  pytorch backend;
* ``text_embedding`` (the shipped ensemble: Python tokenizer, encoder, Python pooling) with
  its encoder on the CUDA provider; ``text_embedding_trt`` whose encoder step is
  ``text_embedding_encoder_trt`` (TensorRT provider); ``text_embedding_ts`` whose encoder step
  is ``text_embedding_encoder_ts`` (``encoder_torchscript`` of functions/build_text_embedding.py,
  the same module the ONNX file is exported from).

Every tensor model is a ``KIND_GPU`` instance on GPU 0 (``kind="KIND_CPU"`` for a rehearsal on
a machine without one); tokenizer and pooling stay on the CPU, as in the shipped repository.
The TensorRT models warm up (``model_warmup``) at the smallest and the largest shape they
will see, so onnxruntime builds its engine for that whole range before the model is ready
instead of again whenever a request's shape falls outside the range seen so far.

NVIDIA Triton runs beside conch on the same GPU (:func:`build_triton_repository`): the MLPs as
Python-backend models running onnxruntime's CUDA provider on the same ``.onnx`` files, with
conch's batching.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import models

ROOT = models.ROOT
FUNCTIONS = ROOT / "functions"
GPU_OUT = ROOT / ".cache" / "bench" / "models-gpu"
REHEARSAL_OUT = ROOT / ".cache" / "bench" / "models-gpu-on-cpu"

ORT_CUDA, ORT_TRT, TORCHSCRIPT = "onnxruntime CUDA", "onnxruntime TensorRT", "TorchScript CUDA"
TRT_SUFFIX, TS_SUFFIX = "_trt", "_ts"

TEXT_NAME = "text_embedding"
TOKENIZER = "text_embedding_tokenizer"
ENCODER = "text_embedding_encoder"
POOLING = "text_embedding_pooling"
TEXT_FOLDERS = (TEXT_NAME, TOKENIZER, ENCODER, POOLING)
# The encoder's tensors as the pytorch backend names them (``<name>__<index>``: argument and
# output index, Triton's rule), so the TorchScript step reads the ensemble's tensors in order.
TS_NAMES = {
    "INPUT_IDS": "INPUT_IDS__0",
    "ATTENTION_MASK": "ATTENTION_MASK__1",
    "TOKEN_EMBEDDINGS": "TOKEN_EMBEDDINGS__0",
    "INPUT0": "INPUT__0",
    "OUTPUT0": "OUTPUT__0",
}

# Texts the benchmark sends (perf_analyzer cycles through them, one text a request) and
# embeds in process: 5 to 26 tokens, so a batch pads to its longest as real traffic does.
TEXT_SAMPLES = (
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "How do I reset my password if I no longer have access to the email address on my account?",
    "Inference servers batch requests to keep accelerators busy.",
    "Die Katze schläft auf dem Sofa.",
    "Weather today: sunny, 24 degrees, light wind from the west.",
    "Transformers encode every token of a sentence in context, then pooling turns the token "
    "vectors into one embedding.",
    "Good morning!",
)
# The encoder's extreme shapes, for the TensorRT engine: one text of [CLS] [SEP], and a full
# batch of texts cut at the model's 256 tokens.
TEXT_MIN_TOKENS, TEXT_MAX_TOKENS = 2, 256


@dataclass(frozen=True)
class Variant:
    """One served model of the GPU benchmark."""

    name: str  # what perf_analyzer drives
    family: str  # the workload compared across runtimes (models.LARGE_NAME or TEXT_NAME)
    runtime: str  # ORT_CUDA, ORT_TRT or TORCHSCRIPT
    batched: str  # the model whose batches the worker forms: an ensemble's encoder step
    serves: tuple[str, ...]  # what the worker must load for it (an ensemble's steps)


def _text_variant(suffix: str, runtime: str) -> Variant:
    encoder = ENCODER + suffix
    return Variant(TEXT_NAME + suffix, TEXT_NAME, runtime, encoder, (TOKENIZER, encoder, POOLING))


def _large_variant(suffix: str, runtime: str) -> Variant:
    name = models.LARGE_NAME + suffix
    return Variant(name, models.LARGE_NAME, runtime, name, (name,))


VARIANTS = (
    Variant(
        models.SMALL_NAME, models.SMALL_NAME, ORT_CUDA, models.SMALL_NAME, (models.SMALL_NAME,)
    ),
    _large_variant("", ORT_CUDA),
    _large_variant(TRT_SUFFIX, ORT_TRT),
    _large_variant(TS_SUFFIX, TORCHSCRIPT),
    _text_variant("", ORT_CUDA),
    _text_variant(TRT_SUFFIX, ORT_TRT),
    _text_variant(TS_SUFFIX, TORCHSCRIPT),
)
BY_NAME = {v.name: v for v in VARIANTS}


def serves(names: list[str]) -> list[str]:
    """What a worker loads to serve the variants ``names`` (each once, in order)."""
    return list(dict.fromkeys(m for n in names for m in BY_NAME[n].serves))


# make bench-gpu's models: the compute-bound ones (mlp is there for --models mlp).
DEFAULT_MODELS = tuple(v.name for v in VARIANTS if v.family != models.SMALL_NAME)


def _functions_builder() -> Any:
    """functions/build_text_embedding.py as a module (it lives outside any package)."""
    if str(FUNCTIONS) not in sys.path:
        sys.path.insert(0, str(FUNCTIONS))
    import build_text_embedding

    return build_text_embedding


def text_model_folder() -> Path:
    """The packaged all-MiniLM-L6-v2 folder (sentence-transformers loads it from there)."""
    return _functions_builder().package_dir()


# --------------------------------------------------------------------------- configs


def read_config(folder: Path) -> Any:
    """``folder/config.pbtxt`` as Triton's ``ModelConfig`` message, read by conch's parser."""
    from conch.core.model_config import parse_config

    path = folder / "config.pbtxt"
    return parse_config(path.read_text(), model=folder.name, source=str(path))


def write_config(folder: Path, cfg: Any, why: str) -> None:
    from google.protobuf import text_format

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").unlink(missing_ok=True)  # a copy may share the source's inode
    head = f"# {why}\n# Generated by bench/gpu_models.py; edit the script, not this file.\n"
    (folder / "config.pbtxt").write_text(head + text_format.MessageToString(cfg))


def _instances(cfg: Any, kind: str) -> None:
    """One instance of ``kind`` (on GPU 0 when KIND_GPU)."""
    del cfg.instance_group[:]
    group = cfg.instance_group.add()
    group.count = 1
    group.kind = type(group).Kind.Value(kind)
    if kind == "KIND_GPU":
        group.gpus.append(0)


def _tensorrt(cfg: Any, shapes: list[tuple[int, int | None]]) -> None:
    """Ask for onnxruntime's TensorRT provider; warm up at each (batch, tokens) of
    ``shapes``: an input's variable dimension is ``tokens`` long, a fixed one as configured.

    Inputs named ``*MASK*`` warm with zeros (every token masked: finite, unlike random
    integers), the rest with random data."""
    cfg.optimization.execution_accelerators.gpu_execution_accelerator.add().name = "tensorrt"
    for batch, tokens in shapes:
        warm = cfg.model_warmup.add()
        warm.name = f"tensorrt_engine_batch_{batch}"
        warm.batch_size = batch
        for entry in cfg.input:
            data = warm.inputs[entry.name]
            data.data_type = entry.data_type
            data.dims.extend(tokens if d == -1 else d for d in entry.dims)
            if "MASK" in entry.name:
                data.zero_data = True
            else:
                data.random_data = True


def _torchscript(cfg: Any) -> None:
    """The ONNX model's config for its TorchScript twin on the pytorch backend."""
    cfg.platform, cfg.backend = "pytorch_libtorch", ""
    for entry in (*cfg.input, *cfg.output):
        entry.name = TS_NAMES[entry.name]


def _copy(cfg: Any, name: str) -> Any:
    """A copy of ``cfg`` named ``name``."""
    out = type(cfg)()
    out.CopyFrom(cfg)
    out.name = name
    return out


def _ensemble(src: Any, name: str, encoder: str, ts: bool) -> Any:
    """``text_embedding``'s ensemble with its encoder step on ``encoder``."""
    cfg = _copy(src, name)
    for step in cfg.ensemble_scheduling.step:
        if step.model_name != ENCODER:
            continue
        step.model_name = encoder
        if ts:
            for field in (step.input_map, step.output_map):
                renamed = {TS_NAMES[k]: v for k, v in field.items()}
                field.clear()
                field.update(renamed)
    return cfg


# --------------------------------------------------------------------------- TorchScript


def large_torchscript(path: Path, seed: int = models.LARGE_SEED) -> Path:
    """``mlp_large``'s weights as a traced TorchScript module (the ONNX graph's twin)."""
    import torch

    w = models.large_weights(seed)
    layers = len(models.LARGE_WIDTHS) - 1
    parts: list[torch.nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(models.LARGE_WIDTHS), start=1):
        linear = torch.nn.Linear(fan_in, fan_out)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w[f"W{i}"].T.copy()))
            linear.bias.copy_(torch.from_numpy(w[f"b{i}"]))
        parts.append(linear)
        if i < layers:
            parts.append(torch.nn.ReLU())
    module = torch.nn.Sequential(*parts).eval().requires_grad_(False)
    with torch.no_grad():
        traced = torch.jit.trace(module, torch.zeros(2, models.LARGE_WIDTHS[0]))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(traced, str(path))
    return path


# --------------------------------------------------------------------------- the repository


def _copy_tree(src: Path, dest: Path) -> None:
    """``src`` copied to ``dest``, its large model files hard-linked (never written here)."""

    def copy(s: str, d: str) -> None:
        if Path(s).suffix in (".onnx", ".pt"):
            models.link_or_copy(Path(s), Path(d))
        else:
            shutil.copyfile(s, d)

    shutil.copytree(src, dest, copy_function=copy, ignore=shutil.ignore_patterns("__pycache__"))


def _digest(kind: str) -> str:
    h = hashlib.sha256(models.digest().encode())
    h.update(kind.encode())
    h.update(Path(__file__).read_bytes())
    h.update((FUNCTIONS / "build_text_embedding.py").read_bytes())
    for folder in TEXT_FOLDERS:
        for path in sorted((FUNCTIONS / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(FUNCTIONS)).encode())
                h.update(str(path.stat().st_mtime_ns).encode())
    return h.hexdigest()


def _add_large(out: Path, kind: str) -> None:
    for name in (models.SMALL_NAME, models.LARGE_NAME):
        cfg = read_config(out / name)
        _instances(cfg, kind)
        write_config(out / name, cfg, f"{name}, one {kind} instance (onnxruntime CUDA provider)")
    base = read_config(out / models.LARGE_NAME)
    onnx = out / models.LARGE_NAME / "1" / "model.onnx"
    batch = models.LARGE_MAX_BATCH

    trt = out / (models.LARGE_NAME + TRT_SUFFIX)
    cfg = _copy(base, trt.name)
    _tensorrt(cfg, [(1, None), (batch, None)])
    (trt / "1").mkdir(parents=True)
    models.link_or_copy(onnx, trt / "1" / "model.onnx")
    write_config(trt, cfg, f"{models.LARGE_NAME} on onnxruntime's TensorRT provider")

    ts = out / (models.LARGE_NAME + TS_SUFFIX)
    cfg = _copy(base, ts.name)
    _torchscript(cfg)
    large_torchscript(ts / "1" / "model.pt")
    write_config(ts, cfg, f"{models.LARGE_NAME} as TorchScript on the pytorch backend")


def _add_text(out: Path, kind: str) -> None:
    builder = _functions_builder()
    builder.build(FUNCTIONS)  # the shipped encoder and tokenizer (a no-op when up to date)
    for folder in TEXT_FOLDERS:
        _copy_tree(FUNCTIONS / folder, out / folder)
    encoder = read_config(out / ENCODER)
    _instances(encoder, kind)
    write_config(out / ENCODER, encoder, f"{ENCODER}, one {kind} instance (CUDA provider)")
    ensemble = read_config(out / TEXT_NAME)

    trt = out / (ENCODER + TRT_SUFFIX)
    cfg = _copy(encoder, trt.name)
    _tensorrt(cfg, [(1, TEXT_MIN_TOKENS), (encoder.max_batch_size, TEXT_MAX_TOKENS)])
    (trt / "1").mkdir(parents=True)
    models.link_or_copy(out / ENCODER / "1" / "model.onnx", trt / "1" / "model.onnx")
    write_config(trt, cfg, f"{ENCODER} on onnxruntime's TensorRT provider")

    ts = out / (ENCODER + TS_SUFFIX)
    cfg = _copy(encoder, ts.name)
    _torchscript(cfg)
    builder.encoder_torchscript(ts / "1" / "model.pt")
    write_config(ts, cfg, f"{ENCODER} as TorchScript on the pytorch backend")

    for suffix in (TRT_SUFFIX, TS_SUFFIX):
        name = TEXT_NAME + suffix
        cfg = _ensemble(ensemble, name, ENCODER + suffix, ts=suffix == TS_SUFFIX)
        (out / name / "1").mkdir(parents=True)
        write_config(out / name, cfg, f"{TEXT_NAME} with its encoder step on {ENCODER + suffix}")


# --------------------------------------------------------------------------- Triton


# The workloads NVIDIA Triton serves beside conch in make bench-gpu. Its wheel (nvidia-pytriton)
# has no ONNX, TensorRT or PyTorch backend, so each is a Python-backend model of the same name
# running onnxruntime on the same .onnx file (bench/models.py's PY_MODEL): the MLPs. The _trt
# and _ts variants are compared with their workload's Triton model; text_embedding with none.
TRITON_FAMILIES = (models.SMALL_NAME, models.LARGE_NAME)


def triton_model(name: str) -> str | None:
    """The model Triton serves for variant ``name`` (its workload's), or None."""
    family = BY_NAME[name].family
    return family if family in TRITON_FAMILIES else None


def triton_served(names: list[str]) -> list[str]:
    """What Triton serves for the variants ``names`` (each once, in order)."""
    return list(dict.fromkeys(t for t in map(triton_model, names) if t))


def triton_out(conch_repo: Path) -> Path:
    """Where :func:`build_triton_repository` writes Triton's repository for ``conch_repo``."""
    return conch_repo.with_name(conch_repo.name + "-triton")


def build_triton_repository(conch_repo: Path, names: list[str], *, kind: str = "KIND_GPU") -> Path:
    """Triton's repository for the models ``names`` (of :data:`TRITON_FAMILIES`), written anew
    beside ``conch_repo`` (:func:`triton_out`); returns it.

    Each is conch's config of that model with ``backend: "python"`` and one ``kind`` instance
    (on GPU 0 when KIND_GPU): the same tensors, ``max_batch_size`` and dynamic batching. Its
    ``model.py`` is bench/models.py's PY_MODEL (onnxruntime with conch's session options, on
    the CUDA provider for a KIND_GPU instance), beside a hard link of conch's ``model.onnx``."""
    out = triton_out(Path(conch_repo))
    if out.exists():
        shutil.rmtree(out)
    for name in names:
        cfg = _copy(read_config(conch_repo / name), name)
        cfg.platform, cfg.backend, cfg.default_model_filename = "", "python", ""
        _instances(cfg, kind)
        (out / name / "1").mkdir(parents=True)
        models.link_or_copy(conch_repo / name / "1" / "model.onnx", out / name / "1" / "model.onnx")
        (out / name / "1" / "model.py").write_text(models.PY_MODEL)
        write_config(
            out / name,
            cfg,
            f"{name} for Triton: a Python model running onnxruntime on conch's .onnx, one {kind} "
            "instance",
        )
    return out


def build_repository(out: Path = GPU_OUT, *, kind: str = "KIND_GPU", force: bool = False) -> Path:
    """bench/models.py's repository, its ONNX models moved to ``kind``, plus the variants of
    :data:`VARIANTS` and text_embedding's steps; returns ``out``. Rebuilt only when a source
    changed (the text models' build outputs in functions/ are brought up to date first)."""
    out = Path(out)
    _functions_builder().build(FUNCTIONS)
    stamp = out / ".built"
    digest = _digest(kind)
    if not force and stamp.exists() and stamp.read_text() == digest:
        return out
    models.build_repository(out, force=True)
    _add_large(out, kind)
    _add_text(out, kind)
    stamp.write_text(digest)
    return out
