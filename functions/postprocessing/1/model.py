"""Classifier logits -> (label, softmax score), written for Triton's Python backend."""

import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = np.array([b"negative", b"neutral", b"positive"], dtype=object)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = (
                pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy().astype(np.float64)
            )
            exp = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs = exp / exp.sum(axis=1, keepdims=True)
            best = probs.argmax(axis=1)
            label = LABELS[best].reshape(-1, 1)
            score = probs[np.arange(len(best)), best].astype(np.float32).reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("LABEL", label),
                        pb_utils.Tensor("SCORE", score),
                    ]
                )
            )
        return responses
