"""Ensembles over ``reshape`` (issue 29 point 4; Triton's L0_infer_reshape test_ff2-ff4).

qa/common/gen_qa_reshape_models.py builds ensembles whose inputs and outputs declare a
``reshape``, over identity steps that batch, with ``_nobatch`` ensembles (max_batch_size
0) over those same batching steps, and "tunnel" steps whose own inputs reshape. Triton
loads them: an ensemble's tensor counts by its ``reshape`` inside the graph, a step's by
its model's ``dims``, and a batch dimension is added or dropped between batching and
non-batching models. conch used to refuse them at load ("tensor 'IN' is FP32 [-1, 8]
from the ensemble's input but ... takes FP32 [-1, 4, 1, 2]").

A private redis-server, a worker, the gateway and the gRPC server serve the repository
built here; stock tritonclient (HTTP and gRPC) checks the values and shapes Triton gives.
Steps whose config reshapes are ONNX identities (a model's ``reshape`` is applied by its
backend); the non-batching step is a Python identity.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from conch.devtools.redis_server import start_private

from harness import start_gateway, start_grpc, start_worker, wait_model_ready
from integration.serving.test_triton_parity import IDENTITY_MODEL, python_model
from models import ensemble, ensemble_step

# -- the models -------------------------------------------------------------------------


def onnx_identity(root: Path, name: str, model_dims: list[int], config: str) -> None:
    """An ONNX Identity X -> Y of shape [batch, *model_dims], with ``config``."""
    shape = ["batch", *model_dims]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / name / "1").mkdir(parents=True)
    onnx.save(model, str(root / name / "1" / "model.onnx"))
    (root / name / "config.pbtxt").write_text(
        f'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n{textwrap.dedent(config)}'
    )


def fp32(name: str, dims: str, reshape: str | None = None) -> str:
    extra = f" reshape: {{ shape: [ {reshape} ] }}" if reshape is not None else ""
    return f'{{ name: "{name}" data_type: TYPE_FP32 dims: [ {dims} ]{extra} }}'


def io(inputs: list[str], outputs: list[str]) -> str:
    return f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]"


# gen_qa_reshape_models.py's tunnels: [3, 2, 2] in, [12] inside, [3, 2, 2] out again.
TUNNEL_IN = io([fp32("X", "3, 2, 2", "12")], [fp32("Y", "12")])
TUNNEL_OUT = io([fp32("X", "12", "3, 2, 2")], [fp32("Y", "3, 2, 2")])
NOP_16 = io([fp32("X", "16")], [fp32("Y", "16")])
NOP_412 = io([fp32("X", "4, 1, 2")], [fp32("Y", "4, 1, 2")])
# Does not batch: takes the batching steps' batch as a dimension of its own.
FLAT = f'backend: "python"\nmax_batch_size: 0\n{io([fp32("X", "-1, 12")], [fp32("Y", "-1, 12")])}\n'

# INPUT0: reshaped in and out, through a batching, a non-batching and a batching step.
# INPUT1: reshaped on the way in only (ff4's "models that reshape only the input") in the
# batching ensemble, both ways in the non-batching one (ff3's *_nobatch).
CHAIN = [
    ensemble_step("tunnel_in", {"X": "INPUT0"}, {"Y": "t"}),
    ensemble_step("flat", {"X": "t"}, {"Y": "u"}),
    ensemble_step("tunnel_out", {"X": "u"}, {"Y": "OUTPUT0"}),
    ensemble_step("nop_16", {"X": "INPUT1"}, {"Y": "OUTPUT1"}),
]
MIXED_IO = io(
    [fp32("INPUT0", "2, 2, 3", "3, 2, 2"), fp32("INPUT1", "4, 4", "16")],
    [fp32("OUTPUT0", "2, 2, 3", "3, 2, 2"), fp32("OUTPUT1", "16")],
)
NOBATCH_IO = io(
    [fp32("INPUT0", "2, 2, 3", "3, 2, 2"), fp32("INPUT1", "4, 4", "16")],
    [fp32("OUTPUT0", "2, 2, 3", "3, 2, 2"), fp32("OUTPUT1", "4, 4", "16")],
)
# test_ff2's simple_reshape: [8] reshaped to the step's [4, 1, 2], in and out.
FF2_IO = io([fp32("INPUT1", "8", "4, 1, 2")], [fp32("OUTPUT1", "8", "4, 1, 2")])
# Refused, as Triton refuses it: the output's reshape [8] is not the step's [4, 1, 2].
REFUSED_IO = io([fp32("INPUT1", "8", "4, 1, 2")], [fp32("OUTPUT1", "4, 1, 2", "8")])
NOP_412_STEP = [ensemble_step("nop_412", {"X": "INPUT1"}, {"Y": "OUTPUT1"})]

# gen_ensemble_model_utils.py's nop tunnels are identity-backend models; here they are
# Python identities, which must see their input in its reshape and give back an output
# in its dims, as Triton does for every backend.
PY_TUNNEL_IN = (
    f'backend: "python"\nmax_batch_size: 8\n{io([fp32("X", "4, 1, 2", "8")], [fp32("Y", "8")])}\n'
)
PY_TUNNEL_OUT = f'backend: "python"\nmax_batch_size: 8\n{io([fp32("X", "8", "4, 1, 2")], [fp32("Y", "4, 1, 2")])}\n'
# Its output reshapes: the model returns [4, 1, 2], the client gets the dims [8].
PY_RESHAPE_OUT = f'backend: "python"\nmax_batch_size: 8\n{io([fp32("X", "4, 1, 2")], [fp32("Y", "8", "4, 1, 2")])}\n'
# test_ff2's sequence_reshape_zero_2_float32, its INPUT1 path: [8] enters as [4, 1, 2],
# the first tunnel gives [8], the second [4, 1, 2] again, and OUTPUT1 leaves as [8].
PY_TUNNELS = [
    ensemble_step("py_tunnel_in", {"X": "INPUT1"}, {"Y": "temp_1"}),
    ensemble_step("py_tunnel_out", {"X": "temp_1"}, {"Y": "OUTPUT1"}),
]

SERVED = ("reshape_mixed", "reshape_nobatch", "ff2_simple", "ff2_sequence")


def build_repository(root: Path) -> Path:
    onnx_identity(root, "tunnel_in", [12], TUNNEL_IN)
    onnx_identity(root, "tunnel_out", [3, 2, 2], TUNNEL_OUT)
    onnx_identity(root, "nop_16", [16], NOP_16)
    onnx_identity(root, "nop_412", [4, 1, 2], NOP_412)
    python_model(root, "flat", FLAT, IDENTITY_MODEL)
    ensemble(root, "reshape_mixed", MIXED_IO, CHAIN, max_batch_size=8)
    ensemble(root, "reshape_nobatch", NOBATCH_IO, CHAIN, max_batch_size=0)
    ensemble(root, "ff2_simple", FF2_IO, NOP_412_STEP, max_batch_size=8)
    ensemble(root, "refused", REFUSED_IO, NOP_412_STEP, max_batch_size=8)
    python_model(root, "py_tunnel_in", PY_TUNNEL_IN, IDENTITY_MODEL)
    python_model(root, "py_tunnel_out", PY_TUNNEL_OUT, IDENTITY_MODEL)
    python_model(root, "py_reshape_out", PY_RESHAPE_OUT, IDENTITY_MODEL)
    ensemble(root, "ff2_sequence", FF2_IO, PY_TUNNELS, max_batch_size=8)
    return root


# -- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[tuple[str, str]]:
    """(gateway URL, gRPC URL) over a Redis of this module's own."""
    repo = build_repository(tmp_path_factory.mktemp("reshape") / "models")
    server = start_private()
    worker = start_worker(repo, server.url, log_dir)
    gateway, url = start_gateway(repo, server.url, log_dir)
    grpc, grpc_url = start_grpc(repo, server.url, log_dir)
    try:
        steps = ("tunnel_in", "tunnel_out", "nop_16", "nop_412", "flat", "py_reshape_out")
        for m in (*steps, "py_tunnel_in", "py_tunnel_out", *SERVED):
            wait_model_ready(url, m, 120, worker, gateway, grpc)
        yield url, grpc_url
    finally:
        grpc.stop()
        gateway.stop()
        worker.stop()
        server.stop()


def inputs(module, shapes: dict[str, tuple[int, ...]], seed: int) -> tuple[list, dict]:
    """Random FP32 inputs of ``shapes`` for ``module`` (tritonclient.http or .grpc)."""
    rng = np.random.default_rng(seed)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    made = []
    for name, array in arrays.items():
        i = module.InferInput(name, list(array.shape), "FP32")
        i.set_data_from_numpy(array)
        made.append(i)
    return made, arrays


def infer(module, url: str, model: str, shapes: dict[str, tuple[int, ...]], seed: int):
    """The ensemble's answer through the stock client of ``module``, and the inputs sent."""
    client = (
        httpclient.InferenceServerClient(url, network_timeout=60)
        if module is httpclient
        else grpcclient.InferenceServerClient(url)
    )
    sent, arrays = inputs(module, shapes, seed)
    try:
        return client.infer(model, sent), arrays
    finally:
        client.close()


# (client module, index in ``urls``): the gateway over HTTP, the gRPC server.
PROTOCOLS = [pytest.param(httpclient, 0, id="http"), pytest.param(grpcclient, 1, id="grpc")]


# -- the tests --------------------------------------------------------------------------


@pytest.mark.parametrize(("module", "which"), PROTOCOLS)
@pytest.mark.parametrize("batch", [1, 8])
def test_a_batching_ensemble_reshapes_through_batching_and_non_batching_steps(
    urls: tuple[str, str], module, which: int, batch: int
) -> None:
    """test_ff3/ff4 at batch 1 and 8: INPUT0 enters the graph as [3, 2, 2] (its reshape),
    goes through the tunnel's [12], a non-batching step and back, and leaves as its dims
    [2, 2, 3]; INPUT1 [4, 4] enters as [16] and leaves as OUTPUT1's dims [16]."""
    shapes = {"INPUT0": (batch, 2, 2, 3), "INPUT1": (batch, 4, 4)}
    result, sent = infer(module, urls[which], "reshape_mixed", shapes, seed=batch)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0.shape == (batch, 2, 2, 3)
    np.testing.assert_array_equal(out0, sent["INPUT0"])
    assert out1.shape == (batch, 16)
    np.testing.assert_array_equal(out1, sent["INPUT1"].reshape(batch, 16))


@pytest.mark.parametrize(("module", "which"), PROTOCOLS)
def test_a_non_batching_ensemble_reshapes_through_batching_steps(
    urls: tuple[str, str], module, which: int
) -> None:
    """test_ff3's *_nobatch: no batch dimension outside; each batching step gets a batch
    of one, which is dropped again before the outputs go back in their dims."""
    shapes = {"INPUT0": (2, 2, 3), "INPUT1": (4, 4)}
    result, sent = infer(module, urls[which], "reshape_nobatch", shapes, seed=3)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0.shape == (2, 2, 3)
    np.testing.assert_array_equal(out0, sent["INPUT0"])
    assert out1.shape == (4, 4)
    np.testing.assert_array_equal(out1, sent["INPUT1"])


@pytest.mark.parametrize("batch", [1, 8])
def test_ff2s_simple_reshape_ensemble_loads_and_answers(urls: tuple[str, str], batch: int) -> None:
    """The ensemble of the issue's error: INPUT1 [8] is [4, 1, 2] inside, as its step."""
    result, sent = infer(httpclient, urls[0], "ff2_simple", {"INPUT1": (batch, 8)}, seed=batch)
    out = result.as_numpy("OUTPUT1")
    assert out.shape == (batch, 8)
    np.testing.assert_array_equal(out, sent["INPUT1"])


@pytest.mark.parametrize(("module", "which"), PROTOCOLS)
@pytest.mark.parametrize("batch", [1, 8])
def test_ff2s_sequence_reshape_ensemble_of_python_tunnels_answers(
    urls: tuple[str, str], module, which: int, batch: int
) -> None:
    """Each Python step sees its input in its reshape and answers in its output's dims,
    so the second tunnel gets the first's [8]. conch used to give a Python model its
    input in the config's dims, and refused the second step ("unexpected shape for input
    ... Expected [-1,8], got [1,4,1,2]")."""
    result, sent = infer(module, urls[which], "ff2_sequence", {"INPUT1": (batch, 8)}, seed=batch)
    out = result.as_numpy("OUTPUT1")
    assert out.shape == (batch, 8)
    np.testing.assert_array_equal(out, sent["INPUT1"])


@pytest.mark.parametrize(
    ("model", "given", "answered"),
    [
        pytest.param("py_tunnel_in", (4, 1, 2), (8,), id="input-reshape"),
        pytest.param("py_reshape_out", (4, 1, 2), (8,), id="output-reshape"),
    ],
)
def test_a_python_model_sees_its_reshape(
    urls: tuple[str, str], model: str, given: tuple[int, ...], answered: tuple[int, ...]
) -> None:
    """A Python identity called directly: an input with a reshape arrives in it (the
    identity's output, dims [8], is that shape), and an output with a reshape is given in
    its dims ([4, 1, 2] returned, [8] answered), as Triton's core does for every backend."""
    result, sent = infer(httpclient, urls[0], model, {"X": (3, *given)}, seed=5)
    out = result.as_numpy("Y")
    assert out.shape == (3, *answered)
    np.testing.assert_array_equal(out, sent["X"].reshape(3, *answered))


def test_an_ensemble_triton_refuses_is_refused_with_its_reason(urls: tuple[str, str]) -> None:
    rows = {
        m["name"]: m for m in httpclient.InferenceServerClient(urls[0]).get_model_repository_index()
    }
    assert rows["refused"]["state"] == "UNAVAILABLE"
    assert rows["refused"]["reason"] == (
        "ensemble 'refused': tensor 'OUTPUT1' is FP32 [-1, 8] as the ensemble's output "
        "(its reshape) but FP32 [-1, 4, 1, 2] as output 'Y' of step 0 ('nop_412')"
    )
