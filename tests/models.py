"""Model repositories for tests, built from the shipped functions/ plus test models."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from harness import ROOT, wait_until

# Every Triton datatype onnxruntime can pass through Identity on the CPU.
IDENTITY_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def identity_model(path: Path) -> None:
    """IN_<T> -> OUT_<T> for every datatype, batch dim and one variable dim."""
    nodes, inputs, outputs = [], [], []
    for name, t in IDENTITY_TYPES.items():
        inputs.append(helper.make_tensor_value_info(f"IN_{name}", t, ["batch", "n"]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{name}", t, ["batch", "n"]))
        nodes.append(helper.make_node("Identity", [f"IN_{name}"], [f"OUT_{name}"]))
    graph = helper.make_graph(nodes, "identity", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, path / "1" / "model.onnx")
    dims = "dims: [ -1 ]"
    ins = ",\n".join(
        f'  {{ name: "IN_{n}" data_type: {"TYPE_STRING" if n == "BYTES" else "TYPE_" + n} {dims} }}'
        for n in IDENTITY_TYPES
    )
    outs = ",\n".join(
        f'  {{ name: "OUT_{n}" data_type: {"TYPE_STRING" if n == "BYTES" else "TYPE_" + n} {dims} }}'
        for n in IDENTITY_TYPES
    )
    (path / "config.pbtxt").write_text(
        f'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninput [\n{ins}\n]\noutput [\n{outs}\n]\n'
    )


def identity_array(name: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    """A test array of datatype ``name`` for ``identity_model`` (BYTES: tricky words)."""
    rng = np.random.default_rng(seed)
    if name == "BYTES":
        words = np.array(
            [b"", b"alpha", "caf\u00e9 \u2603".encode(), b"x" * 300, b"\x00\x01tail"], dtype=object
        )
        return rng.choice(words, size=shape).astype(object)
    if name == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(name)
    if dtype is not None:
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(getattr(np, name.lower()))
    return rng.integers(
        info.min, info.max, size=shape, dtype=getattr(np, name.lower()), endpoint=True
    )


def add_inputs(
    a: np.ndarray, b: np.ndarray | None = None, *, binary: bool = True
) -> list[httpclient.InferInput]:
    """The inputs A and B of ``add_model``'s model (B is A when not given)."""
    inputs = []
    for name, arr in (("A", a), ("B", a if b is None else b)):
        i = httpclient.InferInput(name, list(arr.shape), "FP32")
        i.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(i)
    return inputs


def python_model(path: Path, config: str, source: str) -> None:
    """A Python backend model at ``path``: version 1's ``model.py`` and its config."""
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.py").write_text(source)
    (path / "config.pbtxt").write_text(config)


# Runs a request for up to 2 s, or until its caller goes away (is_cancelled), then
# writes "<cancelled> <seconds>" to <marks>/<request id>.
CANCEL_WATCHER = """
import json
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marks = Path(config["parameters"]["marks"]["string_value"])

    def execute(self, requests):
        out = []
        for r in requests:
            began = time.monotonic()
            while time.monotonic() - began < 2 and not r.is_cancelled():
                time.sleep(0.05)
            took = time.monotonic() - began
            (self.marks / r.request_id()).write_text(f"{r.is_cancelled()} {took:.2f}")
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
"""


def cancel_watcher_model(path: Path, marks: Path, *, instances: int = 2) -> None:
    """A Python model (``CANCEL_WATCHER``, X -> Y, FP32 [4]) that tells whether its
    request's caller went away while it ran; ``marks`` is made here."""
    marks.mkdir(parents=True, exist_ok=True)
    python_model(
        path,
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f'parameters [ {{ key: "marks" value: {{ string_value: "{marks}" }} }} ]\n'
        f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n",
        CANCEL_WATCHER,
    )


def watched(marks: Path, request_id: str) -> tuple[bool, float]:
    """What ``CANCEL_WATCHER`` wrote for the request: whether it saw it cancelled, and
    after how many seconds."""
    mark = marks / request_id
    wait_until(lambda: mark.exists() and mark.read_text() != "", 10, f"the mark of {request_id}")
    cancelled, took = mark.read_text().split()
    return cancelled == "True", float(took)


def add_model(path: Path, *, max_batch_size: int = 8, delay_us: int = 0, extra: str = "") -> None:
    """OUT = A + B, FP32 [4]: small and exact, for batching and routing tests."""
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["batch", 4])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, ["batch", 4])
    out = helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Add", ["A", "B"], ["OUT"])], "add", [a, b], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, path / "1" / "model.onnx")
    batching = (
        f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}" if delay_us else ""
    )
    (path / "config.pbtxt").write_text(
        f'platform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"{batching}\n{extra}\n"
    )


def build_repository(root: Path) -> Path:
    """functions/ as shipped, plus the test models."""
    root.mkdir(parents=True, exist_ok=True)
    for model in ("mlp", "mlp_autocomplete"):
        shutil.copytree(ROOT / "functions" / model, root / model)
    identity_model(root / "identity")
    add_model(root / "add")
    add_model(root / "add_batched", max_batch_size=16, delay_us=20000)
    transpose_model(root / "transpose")
    slow_model(root / "slow")
    # Policies over a ~40 ms model that runs one request at a time.
    slow_model(root / "step", seconds=0.04, max_batch_size=1, delay_us=1)
    with_config(root / "step", root / "step_prio", "priority_levels: 2 default_priority_level: 2")
    with_config(
        root / "step",
        root / "step_reject",
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 150000 }",
    )
    with_config(
        root / "step",
        root / "step_delay",
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 150000 }",
    )
    with_config(root / "step", root / "step_bounded", "default_queue_policy { max_queue_size: 2 }")
    add_model(root / "add_preferred", max_batch_size=16, delay_us=1_000_000, extra="")
    with_config(root / "add_preferred", root / "add_pref4", "preferred_batch_size: [ 4 ]")
    batch_probe(root / "batch_probe")
    batch_probe(root / "batch_probe_alone", dynamic_batching=False)
    picky_model(root / "picky")
    loop_model(root / "loop_ordered")
    loop_model(root / "loop_unordered", preserve_ordering=False)
    gpu = root / "gpu_mlp"
    shutil.copytree(ROOT / "functions" / "mlp", gpu)
    cfg = (gpu / "config.pbtxt").read_text().replace('name: "mlp"', 'name: "gpu_mlp"')
    (gpu / "config.pbtxt").write_text(cfg.replace("KIND_CPU", "KIND_GPU"))
    broken = root / "broken"
    (broken / "1").mkdir(parents=True)
    shutil.copy(ROOT / "functions" / "mlp" / "1" / "model.onnx", broken / "1" / "model.onnx")
    (broken / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: [ oops\n')
    return root


def rng_input(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def transpose_model(path: Path) -> None:
    """Y = each 2x2 matrix of X transposed; the config shows them as rows of 4 (``reshape``)."""
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["X"], ["Y"], perm=[0, 2, 1])],
        "transpose",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 2, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 2, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, path / "1" / "model.onnx")
    (path / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]\n'
    )


_MATMUL_S: list[float] = []  # one 1024² matmul on one core here, measured once


def matmul_seconds() -> float:
    """What one link of ``slow_model``'s chain costs on this machine (one onnxruntime thread).

    Machines differ threefold; tests that need a model to take a given time size its
    chain from this rather than assume a speed.
    """
    if not _MATMUL_S:
        import tempfile
        import time

        import onnxruntime as ort

        links = 4
        with tempfile.TemporaryDirectory() as tmp:
            _slow_graph(Path(tmp), links, max_batch_size=1, delay_us=1)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = opts.inter_op_num_threads = 1
            session = ort.InferenceSession(str(Path(tmp) / "1" / "model.onnx"), opts)
            x = np.ones((1, 4), np.float32)
            best = float("inf")
            for _ in range(4):
                t = time.perf_counter()
                session.run(None, {"X": x})
                best = min(best, time.perf_counter() - t)
        _MATMUL_S.append(best / links)
    return _MATMUL_S[0]


def slow_model(
    path: Path, *, seconds: float = 1.0, max_batch_size: int = 8, delay_us: int = 200_000
) -> None:
    """Y = X + 1, after a chain of 1024² matmuls that costs ``seconds`` on one idle core.

    The chain starts from the input, so onnxruntime cannot fold it away at load. On a
    busy machine it takes longer, never shorter.
    """
    links = max(1, round(seconds / matmul_seconds()))
    _slow_graph(path, links, max_batch_size=max_batch_size, delay_us=delay_us)


def _slow_graph(path: Path, matmuls: int, *, max_batch_size: int, delay_us: int) -> None:
    eye = helper.make_tensor(
        "EYE", TensorProto.FLOAT, [1024, 1024], np.eye(1024, dtype=np.float32).ravel()
    )
    zero_axes = helper.make_tensor("AXES", TensorProto.INT64, [2], [0, 1])
    nodes = [
        helper.make_node("ReduceSum", ["X", "AXES"], ["S"], keepdims=0),
        helper.make_node("Mul", ["S", "ZERO"], ["S0"]),
        helper.make_node("Add", ["EYE", "S0"], ["M0"]),
    ]
    for k in range(matmuls):
        nodes.append(helper.make_node("MatMul", [f"M{k}", "EYE"], [f"M{k + 1}"]))
    nodes += [
        helper.make_node("ReduceMax", [f"M{matmuls}"], ["T"], keepdims=0),
        helper.make_node("Add", ["X", "T"], ["Y"]),  # the max of an identity matrix is 1
    ]
    zero = helper.make_tensor("ZERO", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[eye, zero_axes, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, path / "1" / "model.onnx")
    (path / "config.pbtxt").write_text(
        f'platform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"
    )


def ensemble_step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    """One step of an ensemble's ``ensemble_scheduling``: the model's latest version, its
    inputs and outputs mapped to the ensemble's tensors."""
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


def ensemble(root: Path, name: str, io: str, steps: list[str], max_batch_size: int = 8) -> None:
    """An ensemble model ``name`` in ``root``: ``io`` its inputs and outputs, then its steps."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(
        f'platform: "ensemble"\nmax_batch_size: {max_batch_size}\n{io}\n'
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


def with_config(src: Path, dst: Path, extra: str) -> None:
    """A copy of a test model under a new name, with more config lines."""
    shutil.copytree(src, dst)
    cfg = dst / "config.pbtxt"
    cfg.write_text(
        cfg.read_text().replace("dynamic_batching {", f"dynamic_batching {{\n{extra}\n", 1)
    )


def loop_model(path: Path, *, instances: int = 2, preserve_ordering: bool = True) -> None:
    """Y = X, after X[0][0] rounds of a 512² matmul: the input sets how long it runs."""
    eye = np.eye(512, dtype=np.float32)
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["v_in", "EYE"], ["v_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [512, 512]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [512, 512]),
        ],
    )
    nodes = [
        helper.make_node("ReduceMax", ["X"], ["XMAX"], keepdims=0),
        helper.make_node("Cast", ["XMAX"], ["N"], to=TensorProto.INT64),
        helper.make_node("Loop", ["N", "TRUE", "EYE"], ["V"], body=body),
        # The identity's max is 1: Y = X + (1 - 1), and the loop cannot be pruned away.
        helper.make_node("ReduceMax", ["V"], ["VMAX"], keepdims=0),
        helper.make_node("Sub", ["VMAX", "ONE"], ["Z"]),
        helper.make_node("Add", ["X", "Z"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "loop",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 1])],
        initializer=[
            helper.make_tensor("EYE", TensorProto.FLOAT, [512, 512], eye.ravel()),
            helper.make_tensor("TRUE", TensorProto.BOOL, [], [True]),
            helper.make_tensor("ONE", TensorProto.FLOAT, [], [1.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, path / "1" / "model.onnx")
    ordering = "preserve_ordering: true" if preserve_ordering else ""
    (path / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 1\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"dynamic_batching {{ {ordering} }}\n"
        f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n"
    )


def offset_model(path: Path, version: int, offset: float) -> None:
    """Version ``version`` of a model answering Y = X + offset: answers tell versions apart."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "OFFSET"], ["Y"])],
        "offset",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[helper.make_tensor("OFFSET", TensorProto.FLOAT, [], [offset])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, path / str(version) / "model.onnx")
    if not (path / "config.pbtxt").exists():
        (path / "config.pbtxt").write_text(
            'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        )


BATCH_PROBE = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executions = 0

    def execute(self, requests):
        # Sleeps for the largest X in the batch, then tells every request which
        # execution it was in and how many requests that execution held.
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        time.sleep(float(max(x.max() for x in xs)))
        self.executions += 1
        out = []
        for x in xs:
            info = np.array([[self.executions, len(requests)]] * x.shape[0], np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", info)]))
        return out
"""


def batch_probe(path: Path, *, dynamic_batching: bool = True) -> None:
    """A Python model whose output says which execution served a request, and its size.

    Without ``dynamic_batching`` it is on Triton's default scheduler: max_batch_size 8
    bounds what one request may carry, and each request runs alone."""
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.py").write_text(BATCH_PROBE)
    (path / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        + ("dynamic_batching { max_queue_delay_microseconds: 0 }\n" if dynamic_batching else "")
    )


PICKY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        # Doubles X; a request holding a negative X fails alone, as Triton's per-request
        # errors do. Y's second column is the rows of the request that row came in.
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if (x < 0).any():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative X")))
                continue
            y = np.stack([2 * x[:, 0], np.full(len(x), len(x), np.float32)], axis=1)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.astype(np.float32))]))
        return out
"""


def picky_model(path: Path) -> None:
    """A Python model that fails a request with a negative X and answers the others."""
    python_model(
        path,
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        "dynamic_batching { }\n",
        PICKY,
    )


GATE = """
import os
import time

import triton_python_backend_utils as pb_utils

ALLOWED = {allowed!r}  # how many executions may finish (a number the test writes)
STARTED = {started!r}  # how many have started (written here)


def allowed():
    try:
        with open(ALLOWED) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


class TritonPythonModel:
    def initialize(self, args):
        self.started = 0

    def execute(self, requests):
        self.started += 1
        with open(STARTED + ".tmp", "w") as f:
            f.write(str(self.started))
        os.replace(STARTED + ".tmp", STARTED)
        while allowed() < self.started:
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""


def gate_model(path: Path, allowed: Path, started: Path, *, delay_us: int) -> None:
    """Y = X, a Python model whose executions wait for the test's word: execution n
    finishes once ``allowed`` holds n or more (``set_gate``); ``started`` counts the
    executions begun. Batches of up to 4, three priority levels (default 2)."""
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.py").write_text(GATE.format(allowed=str(allowed), started=str(started)))
    (path / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us}\n"
        "  priority_levels: 3 default_priority_level: 2 }\n"
    )


def set_gate(allowed: Path, executions: int) -> None:
    """Let ``gate_model``'s executions finish up to number ``executions``."""
    tmp = allowed.with_suffix(".tmp")
    tmp.write_text(str(executions))
    tmp.replace(allowed)


# -- sequence models (issue 17): running sums with Triton's control inputs and state ------

# The accumulators' numeric types: config name, ONNX type, numpy type.
SEQ_TYPES = {
    "INT32": (TensorProto.INT32, np.int32),
    "FP32": (TensorProto.FLOAT, np.float32),
}


def seq_config(
    backend: str,
    *,
    strategy: str = "direct",
    idle_us: int = 0,
    max_batch_size: int = 8,
    instances: int = 1,
    inputs: str,
    outputs: str,
    controls: str = "",
    state: str = "",
    max_candidate_sequences: int = 4,
    max_queue_delay_us: int = 0,
) -> str:
    """A sequence model's config.pbtxt: Direct or Oldest, with the given I/O and controls.
    The ``seq_*_accumulator`` builders pass their ``options`` (the keyword arguments from
    ``idle_us`` on) through to here."""
    if strategy == "direct":
        chosen = f"direct {{ max_queue_delay_microseconds: {max_queue_delay_us} }}"
    elif strategy == "oldest":
        chosen = (
            f"oldest {{ max_candidate_sequences: {max_candidate_sequences} "
            f"max_queue_delay_microseconds: {max_queue_delay_us} }}"
        )
    else:
        raise ValueError(f"strategy is 'direct' or 'oldest', not {strategy!r}")
    idle = f"max_sequence_idle_microseconds: {idle_us}\n  " if idle_us else ""
    sequence = f"sequence_batching {{\n  {idle}{chosen}\n{controls}{state}}}\n"
    return (
        f'backend: "{backend}"\nmax_batch_size: {max_batch_size}\n'
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n{sequence}"
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
    )


def _seq_controls(names: dict[str, str], control: str) -> str:
    """START and READY as ``control`` ("fp32" or "int32") flags, CORRID as UINT64."""
    form = {"fp32": "fp32_false_true", "int32": "int32_false_true"}[control]
    return (
        "  control_input [\n"
        f'    {{ name: "{names["START"]}" control [ {{ kind: CONTROL_SEQUENCE_START '
        f"{form}: [ 0, 1 ] }} ] }},\n"
        f'    {{ name: "{names["READY"]}" control [ {{ kind: CONTROL_SEQUENCE_READY '
        f"{form}: [ 0, 1 ] }} ] }},\n"
        f'    {{ name: "{names["CORRID"]}" control [ {{ kind: CONTROL_SEQUENCE_CORRID '
        "data_type: TYPE_UINT64 } ] }\n"
        "  ]\n"
    )


def _seq_state(state_in: str, state_out: str, dtype: str) -> str:
    return (
        f'  state [ {{ input_name: "{state_in}" output_name: "{state_out}" '
        f"data_type: TYPE_{dtype} dims: [ 1 ] "
        f'initial_state: {{ data_type: TYPE_{dtype} dims: [ 1 ] zero_data: true name: "zero" }} }} ]\n'
    )


# The accumulators' tensors: name -> TorchScript index (ONNX uses the bare names). Outputs
# and inputs are numbered apart, as Triton's <name>__<index> convention has them.
_ACC_INDEX = {
    "INPUT": 0, "START": 1, "READY": 2, "CORRID": 3, "STATE_IN": 4,
    "OUTPUT": 0, "STATE_OUT": 1, "CORRID_OUT": 2,
}  # fmt: skip


def _accumulator_config(
    path: Path,
    backend: str,
    sep: str,
    dtype: str,
    control: str,
    strategy: str,
    options: dict,
    *,
    echo_corrid: bool = True,
) -> None:
    """The accumulators' config.pbtxt; ``sep`` "__" names tensors ``<name>__<index>``."""
    n = {k: f"{k}{sep}{i}" if sep else k for k, i in _ACC_INDEX.items()}
    outputs = [f'  {{ name: "{n["OUTPUT"]}" data_type: TYPE_{dtype} dims: [ 1 ] }}']
    if echo_corrid:
        outputs.append(f'  {{ name: "{n["CORRID_OUT"]}" data_type: TYPE_UINT64 dims: [ 1 ] }}')
    (path / "config.pbtxt").write_text(
        seq_config(
            backend,
            strategy=strategy,
            **options,
            inputs=f'  {{ name: "{n["INPUT"]}" data_type: TYPE_{dtype} dims: [ 1 ] }}',
            outputs=",\n".join(outputs),
            controls=_seq_controls(n, control),
            state=_seq_state(n["STATE_IN"], n["STATE_OUT"], dtype),
        )
    )


def seq_onnx_accumulator(
    path: Path,
    strategy: str = "direct",
    *,
    dtype: str = "INT32",
    control: str = "fp32",
    echo_corrid: bool = True,
    **options: int,
) -> None:
    """A running sum kept in Triton's implicit state, as an ONNX graph.

    INPUT [1] -> OUTPUT [1] = (START ? 0 : STATE_IN) + INPUT when READY, else STATE_IN;
    STATE_OUT = OUTPUT; CORRID_OUT [1] (UINT64) echoes the CORRID control unless
    ``echo_corrid`` is false (then OUTPUT alone is answered: what perf_analyzer can check
    against its validation data). START and READY are ``control`` ("fp32" or "int32")
    flags; the state starts at zero.
    """
    onnx_type, _ = SEQ_TYPES[dtype]
    flag_type = {"fp32": TensorProto.FLOAT, "int32": TensorProto.INT32}[control]
    zero = helper.make_tensor("ZERO", onnx_type, [], [0])

    def vi(name: str, t: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, t, ["batch", 1])

    nodes = [
        helper.make_node("Cast", ["START"], ["start_b"], to=TensorProto.BOOL),
        helper.make_node("Cast", ["READY"], ["ready_b"], to=TensorProto.BOOL),
        helper.make_node("Where", ["start_b", "ZERO", "STATE_IN"], ["base"]),
        helper.make_node("Add", ["base", "INPUT"], ["summed"]),
        helper.make_node("Where", ["ready_b", "summed", "STATE_IN"], ["total"]),
        helper.make_node("Identity", ["total"], ["OUTPUT"]),
        helper.make_node("Identity", ["total"], ["STATE_OUT"]),
    ]
    outputs = [vi("OUTPUT", onnx_type), vi("STATE_OUT", onnx_type)]
    if echo_corrid:
        nodes.append(helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]))
        outputs.append(vi("CORRID_OUT", TensorProto.UINT64))

    graph = helper.make_graph(
        nodes,
        "seq_accumulator",
        [
            vi("INPUT", onnx_type),
            vi("START", flag_type),
            vi("READY", flag_type),
            vi("CORRID", TensorProto.UINT64),
            vi("STATE_IN", onnx_type),
        ],
        outputs,
        initializer=[zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, path / "1" / "model.onnx")
    _accumulator_config(
        path, "onnxruntime", "", dtype, control, strategy, options, echo_corrid=echo_corrid
    )


def seq_torch_accumulator(
    path: Path,
    strategy: str = "direct",
    *,
    dtype: str = "INT32",
    control: str = "fp32",
    **options: int,
) -> None:
    """``seq_onnx_accumulator`` as TorchScript (``pytorch_libtorch``), with Triton's
    ``<name>__<index>`` names: forward(INPUT__0, START__1, READY__2, CORRID__3,
    STATE_IN__4) -> (OUTPUT__0, STATE_OUT__1, CORRID_OUT__2)."""
    import torch

    class Accumulator(torch.nn.Module):
        def forward(
            self,
            x: torch.Tensor,
            start: torch.Tensor,
            ready: torch.Tensor,
            corrid: torch.Tensor,
            state: torch.Tensor,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            base = torch.where(start != 0, torch.zeros_like(state), state)
            total = torch.where(ready != 0, base + x, state)
            return total, total.clone(), corrid.clone()

    (path / "1").mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # torch 2.13 calls TorchScript deprecated; Triton serves it
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.jit.save(torch.jit.script(Accumulator()), str(path / "1" / "model.pt"))
    _accumulator_config(path, "pytorch", "__", dtype, control, strategy, options)


SEQ_PYTHON_MODEL = '''\
"""A running sum per sequence, kept by the model itself (Triton's python backend API)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            cid = request.correlation_id()
            flags = request.flags()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[cid] = 0
            total = self.sums.get(cid, 0) + int(x.sum())
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                self.sums.pop(cid, None)
            else:
                self.sums[cid] = total
            rows = x.shape[0]
            seen = np.array([[str(cid).encode()]] * rows, dtype=object)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT", np.full((rows, 1), total, dtype=np.int32)),
                        pb_utils.Tensor("CORRID_OUT", seen),
                    ]
                )
            )
        return responses
'''


def seq_python_accumulator(
    path: Path,
    strategy: str = "direct",
    **options: int,
) -> None:
    """A Python model keeping each sequence's running sum by ``request.correlation_id()``:
    reset on the START flag, dropped on END. INPUT INT32 [1] -> OUTPUT INT32 [1], the sum
    so far, and CORRID_OUT STRING [1], the correlation id it saw (as text)."""
    (path / "1").mkdir(parents=True, exist_ok=True)
    (path / "1" / "model.py").write_text(SEQ_PYTHON_MODEL)
    (path / "config.pbtxt").write_text(
        seq_config(
            "python",
            strategy=strategy,
            **options,
            inputs='  { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }',
            outputs=(
                '  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
                '  { name: "CORRID_OUT" data_type: TYPE_STRING dims: [ 1 ] }'
            ),
        )
    )
