"""Tokenize text and label its sentiment with a small built-in lexicon.

A Python model for Triton's python backend over BYTES tensors: each row of TEXT (UTF-8)
becomes lower-cased word tokens, their count, a label and the score behind it. The
scoring is a plain lexicon count: each positive word adds its weight, each negative word
subtracts it, a negation ("not", "never", "isn't", ...) within the three tokens before a
word flips it, and an intensifier ("very", "really", ...) right before it doubles it.
Text that is not valid UTF-8 fails its own request with INVALID_ARG; the others in the
batch are answered as usual.
"""

import re

import numpy as np
import triton_python_backend_utils as pb_utils

TOKEN = re.compile(r"\w+(?:'\w+)?")

POSITIVE = {
    "good": 1.0,
    "great": 2.0,
    "excellent": 3.0,
    "amazing": 3.0,
    "love": 2.0,
    "loved": 2.0,
    "like": 1.0,
    "liked": 1.0,
    "nice": 1.0,
    "happy": 2.0,
    "fast": 1.0,
    "best": 3.0,
    "wonderful": 3.0,
    "enjoy": 2.0,
    "enjoyed": 2.0,
    "recommend": 2.0,
    "perfect": 3.0,
    "fine": 0.5,
}
NEGATIVE = {
    "bad": 1.0,
    "poor": 1.0,
    "terrible": 3.0,
    "awful": 3.0,
    "hate": 2.0,
    "hated": 2.0,
    "slow": 1.0,
    "worst": 3.0,
    "broken": 2.0,
    "boring": 2.0,
    "sad": 2.0,
    "angry": 2.0,
    "disappointing": 2.0,
    "disappointed": 2.0,
    "useless": 3.0,
    "bug": 1.0,
    "crash": 2.0,
}
NEGATIONS = {"not", "no", "never", "nothing", "nobody", "hardly", "without"}
INTENSIFIERS = {"very", "really", "extremely", "so", "super", "too"}
NEGATION_WINDOW = 3


def tokenize(text):
    return TOKEN.findall(text.casefold())


def is_negation(token):
    return token in NEGATIONS or token.endswith("n't")


def score(tokens):
    total = 0.0
    for i, token in enumerate(tokens):
        weight = POSITIVE.get(token, 0.0) - NEGATIVE.get(token, 0.0)
        if weight == 0.0:
            continue
        if i > 0 and tokens[i - 1] in INTENSIFIERS:
            weight *= 2.0
        if any(is_negation(t) for t in tokens[max(0, i - NEGATION_WINDOW) : i]):
            weight = -weight
        total += weight
    return total


def label(value):
    if value > 0:
        return b"positive"
    if value < 0:
        return b"negative"
    return b"neutral"


class TritonPythonModel:
    def initialize(self, args):
        self.logger = pb_utils.Logger

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            rows = texts.reshape(texts.shape[0], -1)[:, 0] if texts.ndim > 1 else texts
            try:
                decoded = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in rows]
            except UnicodeDecodeError as exc:
                error = pb_utils.TritonError(
                    f"TEXT must be UTF-8: {exc}", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            token_rows = [tokenize(text) for text in decoded]
            width = max([1] + [len(tokens) for tokens in token_rows])
            tokens_out = np.full((len(token_rows), width), b"", dtype=np.object_)
            for r, tokens in enumerate(token_rows):
                tokens_out[r, : len(tokens)] = [t.encode("utf-8") for t in tokens]
            scores = [score(tokens) for tokens in token_rows]
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("TOKENS", tokens_out),
                        pb_utils.Tensor(
                            "LENGTH",
                            np.array([[len(t)] for t in token_rows], dtype=np.int32),
                        ),
                        pb_utils.Tensor(
                            "LABEL", np.array([[label(s)] for s in scores], dtype=np.object_)
                        ),
                        pb_utils.Tensor("SCORE", np.array([[s] for s in scores], dtype=np.float32)),
                    ]
                )
            )
        return responses
