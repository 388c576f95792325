"""TensorFlow models the tests build at test time: a Keras model saved as a SavedModel, a
tf.Module with tf.string signatures, and a frozen GraphDef; with the in-process answers
the served ones must match.

tensorflow is imported inside each function, so collecting a test module that imports
this one stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _tf() -> Any:
    import tensorflow as tf

    return tf


def save_keras_dense(path: Path, *, seed: int = 0) -> None:
    """``features`` [-1, 4] FP32 -> ``output_0`` [-1, 3] FP32 (a Dense layer with a relu)."""
    import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input(shape=(4,), name="features")
    out = keras.layers.Dense(3, activation="relu", name="dense")(inp)
    model = keras.Model(inp, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.export(str(path), format="tf_saved_model", verbose=False)


def run_saved_model(path: Path, signature: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    """The SavedModel's answer in this process, as the reference."""
    tf = _tf()
    fn = tf.saved_model.load(str(path)).signatures[signature]
    out = fn(**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in out.items()}


def save_text_module(path: Path) -> None:
    """Signatures over a tf.string input ``TEXT`` [-1, 1]:
    ``serving_default``: ``UPPER`` (BYTES, upper-cased) and ``LENGTH`` (INT32, bytes);
    ``doubled``: ``TWICE`` (BYTES, the text twice)."""
    tf = _tf()

    class Text(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.string)])
        def serve(self, TEXT):  # the signature key is the argument name
            return {"UPPER": tf.strings.upper(TEXT), "LENGTH": tf.strings.length(TEXT)}

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.string)])
        def doubled(self, TEXT):
            return {"TWICE": tf.strings.join([TEXT, TEXT])}

    module = Text()
    path.parent.mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(
        module, str(path), signatures={"serving_default": module.serve, "doubled": module.doubled}
    )


def save_graphdef(path: Path, *, init_op: str = "") -> None:
    """A frozen GraphDef: Placeholders ``x`` and ``y`` [-1, 2] FP32; node ``out`` is
    ``x * w + y`` with ``w`` a constant folded in from a variable; with ``init_op``, a
    NoOp of that name too (for ``TF_INIT_OPS_FILE``)."""
    tf = _tf()
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    w = tf.Variable([[2.0, -1.0]], dtype=tf.float32)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 2], tf.float32, name="x"),
            tf.TensorSpec([None, 2], tf.float32, name="y"),
        ]
    )
    def f(x, y):
        return tf.identity(x * w + y, name="out")

    frozen = convert_variables_to_constants_v2(f.get_concrete_function())
    path.parent.mkdir(parents=True, exist_ok=True)
    graph_def = frozen.graph.as_graph_def()
    if init_op:
        graph_def.node.add(name=init_op, op="NoOp")
    path.write_bytes(graph_def.SerializeToString())


def graphdef_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x * np.array([[2.0, -1.0]], np.float32) + y
