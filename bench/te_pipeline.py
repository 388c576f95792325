"""text_embedding's three steps in one process: tokenizer, ONNX encoder, pooling.

The very code conch's steps run (``minilm_tokens`` and ``minilm_pooling``, from
``functions/text_embedding_{tokenizer,pooling}/1/``) around one onnxruntime session made with
the options conch's onnxruntime backend uses. The benchmark's MLServer runtime, its Triton
Python model and its in-process timing all embed through this class, so the peers differ in
serving only. Callers put the two helper modules' folders on ``sys.path``.
"""

from __future__ import annotations

import os

import minilm_pooling
import minilm_tokens
import numpy as np
import onnxruntime as ort

# conch's defaults for a CPU session whose config sets no thread counts (DEFAULT_INTRA_OP_THREADS
# and inter_op_thread_count in platform/conch/backends/onnxruntime.py).
INTRA_OP_THREADS = 1
INTER_OP_THREADS = 1

# Where conch's steps keep the build outputs, under functions/.
ENCODER_FILE = "text_embedding_encoder/1/model.onnx"
TOKENIZER_DIR = "text_embedding_tokenizer/1"


def session(model_file: str, intra_op_threads: int = INTRA_OP_THREADS) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = INTER_OP_THREADS
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model_file, opts, providers=["CPUExecutionProvider"])


class ThreeSteps:
    """``texts`` -> unit-length FP32 ``[n, 384]``, as conch's ensemble computes it."""

    def __init__(self, tokenizer: object, session: ort.InferenceSession) -> None:
        self.tokenizer = tokenizer
        self.session = session

    @classmethod
    def load(cls, model_file: str, tokenizer_dir: str, intra_op_threads: int = 1) -> ThreeSteps:
        return cls(minilm_tokens.load(tokenizer_dir), session(model_file, intra_op_threads))

    @classmethod
    def from_functions(cls, functions_dir: str, intra_op_threads: int = 1) -> ThreeSteps:
        return cls.load(
            os.path.join(functions_dir, ENCODER_FILE),
            os.path.join(functions_dir, TOKENIZER_DIR),
            intra_op_threads,
        )

    def __call__(self, texts: list[str]) -> np.ndarray:
        ids, mask = minilm_tokens.encode(self.tokenizer, texts)
        (tokens,) = self.session.run(None, {"INPUT_IDS": ids, "ATTENTION_MASK": mask})
        return minilm_pooling.mean_pool_normalize(tokens, mask)


def decode(values: np.ndarray) -> list[str]:
    """A BYTES tensor's elements (bytes, or str where a codec already decoded) as text."""
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values.reshape(-1)]
