"""An MLServer runtime that runs an ONNX file with onnxruntime, for the peer benchmark.

Loaded by MLServer (in its own venv, ``.cache/bench/mlserver-venv``), never by conch. The
model settings name it as ``mlserver_runtime.OnnxRuntimeModel`` and pass, under
``parameters.extra``:

* ``model_file``: the .onnx file (the same file conch serves);
* ``intra_op_threads`` / ``inter_op_threads``: onnxruntime thread counts (conch's defaults: 1);
* ``triton_config``: the model's configuration as Triton's ``/v2/models/<m>/config`` returns
  it (JSON). perf_analyzer reads that route before it sends anything, and MLServer has no
  such route, so the runtime adds one with a custom handler.

Responses carry no ``parameters`` on outputs: MLServer's NumpyCodec adds
``{"content_type": "np"}`` there, and perf_analyzer rejects outputs with parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.handlers import custom_handler
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

# MLServer (KServe v2) datatype names -> numpy dtypes for the inputs we accept.
_DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}


class TritonConfigRoute(MLModel):
    """A runtime that answers ``GET /v2/models/<m>/config`` with ``parameters.extra``'s
    ``triton_config``, which perf_analyzer reads before it sends anything."""

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        extra = (settings.parameters.extra if settings.parameters else None) or {}
        config: dict[str, Any] = extra.get("triton_config", {})

        # One GET route per model, on its own path. (MLServer re-imports this module for
        # every model it loads, so class-level state is not shared between models, and a
        # shared ``/v2/models/{model_name}/config`` route would answer from one of them.)
        async def triton_config() -> dict[str, Any]:
            return config

        self.triton_config_route = custom_handler(
            rest_path=f"/v2/models/{settings.name}/config", rest_method="GET"
        )(triton_config)


class OnnxRuntimeModel(TritonConfigRoute):
    async def load(self) -> bool:
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(extra.get("intra_op_threads", 1))
        opts.inter_op_num_threads = int(extra.get("inter_op_threads", 1))
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(
            extra["model_file"], opts, providers=["CPUExecutionProvider"]
        )
        self._output_names = [o.name for o in self._session.get_outputs()]
        self._input_names = [i.name for i in self._session.get_inputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {}
        for request_input in payload.inputs:
            if request_input.name not in self._input_names:
                raise MLServerError(f"unknown input '{request_input.name}'", status_code=400)
            array = NumpyCodec.decode_input(request_input)
            want = _DTYPES.get(request_input.datatype)
            if want is not None and array.dtype != want:
                array = array.astype(want)
            feed[request_input.name] = array
        values = self._session.run(self._output_names, feed)
        outputs = []
        for name, value in zip(self._output_names, values, strict=True):
            out: ResponseOutput = NumpyCodec.encode_output(name=name, payload=value)
            out.parameters = None  # perf_analyzer rejects outputs that carry parameters
            outputs.append(out)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            outputs=outputs,
        )
