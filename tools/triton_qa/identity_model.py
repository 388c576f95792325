"""A Python-backend stand-in for Triton's C++ ``identity`` backend, written for the runner.

Triton's qa repositories serve many models on ``backend: "identity"`` (the nop steps of
ensembles, ``custom_zero_1_float32``, ``identity_delay``): each output is its input, in
config order, after ``execute_delay_ms`` (a parameter) once per execution. conch has no
identity backend, so the runner copies this file into such a model's version folder and
names the Python backend in its config; the rest of the config stays as the test wrote it.
Runs inside a conch worker, where ``triton_python_backend_utils`` is importable.
"""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.names = [
            (i["name"], o["name"]) for i, o in zip(config["input"], config["output"], strict=True)
        ]
        delay = config.get("parameters", {}).get("execute_delay_ms", {})
        self.delay_s = int(delay.get("string_value") or 0) / 1000

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        return [
            pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor(out, pb_utils.get_input_tensor_by_name(request, inp).as_numpy())
                    for inp, out in self.names
                ]
            )
            for request in requests
        ]
