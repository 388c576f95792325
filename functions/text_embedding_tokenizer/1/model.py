"""Text to BERT token ids for ``text_embedding``, written for Triton's Python backend.

Every text of the batch (all requests together) is tokenized in one call and padded to the
batch's longest, so the encoder's dynamic batcher can stack the whole batch: requests of
one shape run as one. Text that is not UTF-8 fails its own request with INVALID_ARG; the
others are answered as usual.
"""

import minilm_tokens
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = minilm_tokens.load()

    def execute(self, requests):
        texts, rows, errors = [], [], {}
        for i, request in enumerate(requests):
            column = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            try:
                decoded = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in column]
            except UnicodeDecodeError as exc:
                errors[i] = pb_utils.TritonError(
                    f"TEXT must be UTF-8: {exc}", pb_utils.TritonError.INVALID_ARG
                )
                decoded = []
            texts.extend(decoded)
            rows.append(len(decoded))
        ids, mask = (
            minilm_tokens.encode(self.tokenizer, texts)
            if texts
            else (np.zeros((0, 1), np.int64), np.zeros((0, 1), np.int64))
        )
        responses, start = [], 0
        for i, n in enumerate(rows):
            if i in errors:
                responses.append(pb_utils.InferenceResponse(error=errors[i]))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("INPUT_IDS", ids[start : start + n]),
                        pb_utils.Tensor("ATTENTION_MASK", mask[start : start + n]),
                    ]
                )
            )
            start += n
        return responses
