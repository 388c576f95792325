"""Stand-ins for the TensorRT reshape models that L0_infer_reshape's test_ff2 and test_ff4
also infer on (``plan_zero_2_float32``, ``plan_zero_4_float32`` and their nobatch twins).

A TensorRT plan needs a GPU and TensorRT to build. These stand-ins keep what the test reads
of such a model: its config, written by Triton's own generator (``gen_qa_reshape_models.py``,
the same function and shapes as its ``--tensorrt`` run), with the platform changed to
onnxruntime, and an ONNX model with the plan's inner shapes, written by the same
generator's ONNX writer. The reshaping the test checks is the config's, which conch does
the same way for every backend.

Run as ``python plan_stand_in.py --models_dir=DIR`` in Triton's ``qa/common`` with that
folder on ``PYTHONPATH``, as its generators are, by ``repository.Build.data``.
"""

import argparse
import shutil
import tempfile
from pathlib import Path

import gen_qa_reshape_models as gen  # Triton's qa/common, on PYTHONPATH
import numpy as np
import onnx
import test_util

# (input dims, the plan's input shapes, output dims, the plan's output shapes): the float32
# models of the generator's --tensorrt run that reshape.
PLANS = (
    (([1], [8]), ([1, 1, 1], [4, 1, 2]), ([1], [8]), ([1, 1, 1], [4, 1, 2])),
    (
        ([4, 4], [2], [2, 2, 3], [1]),
        ([2, 2, 4], [1, 2, 1], [3, 2, 2], [1, 1, 1]),
        ([2, 2, 4], [1, 2, 1], [3, 2, 2], [1, 1, 1]),
        ([2, 2, 4], [1, 2, 1], [3, 2, 2], [1, 1, 1]),
    ),
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models_dir", required=True)
    dest = Path(parser.parse_args().models_dir)
    gen.FLAGS = argparse.Namespace(onnx_opset=0, tensorrt=True, onnx=True)
    gen.tu, gen.onnx = test_util, onnx
    for inputs, plan_inputs, outputs, plan_outputs in PLANS:
        for max_batch in (8, 0):
            gen.create_plan_modelconfig(
                str(dest), max_batch, np.float32, inputs, plan_inputs, outputs, plan_outputs
            )
            prefix = "plan_nobatch" if max_batch == 0 else "plan"
            model = dest / test_util.get_zero_model_name(prefix, len(inputs), np.float32)
            with tempfile.TemporaryDirectory() as scratch:
                gen.create_onnx_modelfile(
                    scratch, 1, max_batch, np.float32, plan_inputs, plan_outputs
                )
                [made] = Path(scratch).glob("*/1/model.onnx")
                (model / "1").mkdir(parents=True, exist_ok=True)
                shutil.copyfile(made, model / "1" / "model.onnx")
            config = model / "config.pbtxt"
            text = config.read_text()
            config.write_text(
                text.replace('platform: "tensorrt_plan"', 'platform: "onnxruntime_onnx"')
            )


if __name__ == "__main__":
    main()
