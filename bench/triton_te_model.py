"""text_embedding for NVIDIA Triton's Python backend: the three steps in one model.

The Triton wheel the benchmark runs has no ONNX backend, so Triton serves text_embedding as
this one Python model (bench/text_embedding.py copies it in as ``model.py``, beside
``te_pipeline.py`` and conch's two helper modules). All requests of an execution are
embedded in one call, as conch's tokenizer batches them; the batch is cut back per request.
"""

import json
import os

import numpy as np
import te_pipeline
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        here = os.path.dirname(os.path.abspath(__file__))
        parameters = json.loads(args["model_config"]).get("parameters", {})
        threads = int(parameters.get("intra_op_thread_count", {}).get("string_value", 1))
        self.embed = te_pipeline.ThreeSteps.load(os.path.join(here, "model.onnx"), here, threads)

    def execute(self, requests):
        columns = [pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy() for r in requests]
        embeddings = self.embed([t for c in columns for t in te_pipeline.decode(c)])
        ends = np.cumsum([c.shape[0] for c in columns])
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDING", part)])
            for part in np.split(embeddings, ends[:-1])
        ]
