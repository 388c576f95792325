"""Add and subtract two FP32 vectors: a Python model written for Triton's python backend.

Nothing here knows about conch: the file uses only the ``triton_python_backend_utils``
module that Triton (and conch) provide, and the numpy arrays it hands out.
"""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # args values are all strings; model_config is the completed config as JSON.
        self.model_config = json.loads(args["model_config"])
        sum_config = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        diff_config = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT1")
        self.sum_dtype = pb_utils.triton_string_to_numpy(sum_config["data_type"])
        self.diff_dtype = pb_utils.triton_string_to_numpy(diff_config["data_type"])
        self.logger = pb_utils.Logger
        self.logger.log_info(
            "add_sub instance {} ready (kind {})".format(
                args["model_instance_name"], args["model_instance_kind"]
            )
        )

    def execute(self, requests):
        # A dynamic batch arrives as several requests; answer each one on its own.
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if a.shape != b.shape:
                error = pb_utils.TritonError(
                    f"INPUT0 has shape {a.shape} but INPUT1 has shape {b.shape}",
                    pb_utils.TritonError.INVALID_ARG,
                )
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            out_sum = pb_utils.Tensor("OUTPUT0", (a + b).astype(self.sum_dtype))
            out_diff = pb_utils.Tensor("OUTPUT1", (a - b).astype(self.diff_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_sum, out_diff]))
        return responses

    def finalize(self):
        self.logger.log_info("add_sub unloaded")
