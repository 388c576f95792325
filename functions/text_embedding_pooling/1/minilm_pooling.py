"""Sentence embeddings from token embeddings: the mean over real tokens, L2-normalised.

What sentence-transformers' ``Pooling`` (mean tokens) and ``Normalize`` modules compute for
all-MiniLM-L6-v2. Kept apart from ``model.py`` so the benchmark's MLServer runtime and
in-process runs pool with the very same code.
"""

import numpy as np


def mean_pool_normalize(token_embeddings, attention_mask):
    """``[n, tokens, d]`` float and ``[n, tokens]`` 0/1 mask -> ``[n, d]`` float32, unit rows."""
    mask = attention_mask.astype(np.float32)[:, :, None]
    summed = (token_embeddings * mask).sum(axis=1)
    pooled = summed / np.maximum(mask.sum(axis=1), 1e-9)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
