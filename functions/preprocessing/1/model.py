"""Word-level tokenizer for the sentiment pipeline, written for Triton's Python backend.

The vocabulary ships beside this file (vocab.txt: one token per line, its line number is
its id); nothing is downloaded. Text is lower-cased and split into words; each row
becomes [CLS] + word ids, padded with [PAD] (0) or cut to SEQUENCE_LENGTH, with an
attention mask of 1 on real tokens.
"""

import os
import re

import numpy as np
import triton_python_backend_utils as pb_utils

SEQUENCE_LENGTH = 32
WORD = re.compile(r"[a-z0-9']+")


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(folder, "vocab.txt"), encoding="utf-8") as f:
            self.vocab = {token: i for i, token in enumerate(f.read().split("\n")) if token}
        self.pad, self.unk, self.cls = self.vocab["[PAD]"], self.vocab["[UNK]"], self.vocab["[CLS]"]

    def encode(self, text):
        ids = [self.cls] + [self.vocab.get(w, self.unk) for w in WORD.findall(text.lower())]
        ids = ids[:SEQUENCE_LENGTH]
        mask = [1] * len(ids) + [0] * (SEQUENCE_LENGTH - len(ids))
        return ids + [self.pad] * (SEQUENCE_LENGTH - len(ids)), mask

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            try:
                rows = [self.encode(t.decode("utf-8")) for t in texts]
            except UnicodeDecodeError as exc:
                error = pb_utils.TritonError(
                    f"TEXT is not UTF-8: {exc}", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            ids = np.array([r[0] for r in rows], dtype=np.int64)
            mask = np.array([r[1] for r in rows], dtype=np.int64)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("INPUT_IDS", ids),
                        pb_utils.Tensor("ATTENTION_MASK", mask),
                    ]
                )
            )
        return responses
