"""MLServer's own XGBoost runtime, as the tree benchmark (bench/trees.py) gives it to MLServer.

Loaded by MLServer (``.cache/bench/mlserver-venv``, where ``make bench`` installs
``mlserver-xgboost``), never by conch. Prediction is ``mlserver_xgboost.XGBoostModel``'s,
unchanged: it loads the file through XGBoost's scikit-learn interface and answers the
``predict`` output. Two things are added so that perf_analyzer can drive it as it drives
conch, and one so that both servers do the same work:

* the Triton config route perf_analyzer reads (``mlserver_runtime.TritonConfigRoute``);
* outputs without ``parameters`` (MLServer's codec adds ``content_type`` there, which
  perf_analyzer rejects);
* ``parameters.extra.nthread``: XGBoost's threads for prediction, as conch's model config
  gives its instance (``cpu_nthread``); XGBoost's default is every core.
"""

from __future__ import annotations

from mlserver.types import InferenceRequest, InferenceResponse
from mlserver_runtime import TritonConfigRoute
from mlserver_xgboost import XGBoostModel


class XGBoostBenchModel(XGBoostModel, TritonConfigRoute):
    async def load(self) -> bool:
        await super().load()
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        if "nthread" in extra:
            self._model.set_params(n_jobs=int(extra["nthread"]))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        response = await super().predict(payload)
        for out in response.outputs:
            out.parameters = None  # perf_analyzer rejects outputs that carry parameters
        return response
