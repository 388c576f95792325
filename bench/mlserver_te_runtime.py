"""An MLServer runtime for text_embedding: the same three steps as conch's ensemble.

Loaded by MLServer (``.cache/bench/mlserver-venv``) with ``bench/`` and conch's two helper
folders on ``PYTHONPATH``. It is ``mlserver_runtime.OnnxRuntimeModel`` (the same session
options, the Triton config route perf_analyzer reads) with the tokenizer before the session
and the pooling after it, through ``te_pipeline.ThreeSteps``. ``parameters.extra`` adds
``tokenizer_dir``, the folder of conch's ``tokenizer.json``.
"""

from __future__ import annotations

import numpy as np
import te_pipeline
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput
from mlserver_runtime import OnnxRuntimeModel


class TextEmbeddingModel(OnnxRuntimeModel):
    async def load(self) -> bool:
        await super().load()
        tokenizer = te_pipeline.minilm_tokens.load(self.settings.parameters.extra["tokenizer_dir"])
        self._embed = te_pipeline.ThreeSteps(tokenizer, self._session)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        (text,) = payload.inputs
        embedding = self._embed(te_pipeline.decode(np.asarray(NumpyCodec.decode_input(text))))
        out: ResponseOutput = NumpyCodec.encode_output(name="EMBEDDING", payload=embedding)
        out.parameters = None  # perf_analyzer rejects outputs that carry parameters
        return InferenceResponse(
            model_name=self.name, model_version=self.version, id=payload.id, outputs=[out]
        )
