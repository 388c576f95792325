"""Text to the encoder's token ids, a batch at a time, with Hugging Face ``tokenizers``.

``tokenizer.json`` beside this file is written by ``functions/build_text_embedding.py``
with the settings sentence-transformers encodes with baked in: cut at the model's
``max_seq_length`` and padded with ``[PAD]`` to the longest text of the call. Kept apart
from ``model.py`` so the benchmark's MLServer runtime and in-process runs tokenize with the
very same code.
"""

import os

import numpy as np
from tokenizers import Tokenizer

FILE = "tokenizer.json"


def load(folder=None):
    """The tokenizer written beside this file (or in ``folder``)."""
    folder = folder or os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(folder, FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} is missing: it is built, not committed; run `make functions` "
            "(functions/build_text_embedding.py)"
        )
    return Tokenizer.from_file(path)


def encode(tokenizer, texts):
    """``INPUT_IDS`` and ``ATTENTION_MASK`` (int64, ``[len(texts), longest]``) for ``texts``."""
    encoded = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    return ids, mask
