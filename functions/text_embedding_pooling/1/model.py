"""Token embeddings to sentence embeddings for ``text_embedding``: mean pooling over the
real tokens, then L2 normalisation. Written for Triton's Python backend."""

import minilm_pooling
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKEN_EMBEDDINGS").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "ATTENTION_MASK").as_numpy()
            embedding = minilm_pooling.mean_pool_normalize(tokens, mask)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDING", embedding)])
            )
        return responses
