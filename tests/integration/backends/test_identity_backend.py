"""The identity backend through the real path: a worker serving identity models from empty
version folders, a gateway and a gRPC server in front, asked with stock tritonclient.
Concurrent requests are batched into one delayed execution and each gets its own tensors
back (FP32 of varying width, empty ones, BYTES) over HTTP and gRPC; an ensemble of two
identity steps passes tensors through; a sequence model answers each step; the backend's byte counter shows on the metrics
port; a config that does not pair loads as unavailable, with Triton's reason."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from harness import fresh_db, start_gateway, start_grpc, start_worker, wait_model_ready

ECHO = """name: "echo"
backend: "identity"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 300000 }
parameters [ { key: "execute_delay_ms" value: { string_value: "400" } } ]
"""

# Two identity steps, the first taking [2,2] as [4] and the second [4] as [2,2], as the
# qa repositories' nop tunnels do (each reshape on the step's input).
TUNNEL_IN = """name: "tunnel_in"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""
TUNNEL_OUT = """name: "tunnel_out"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2, 2 ] } ]
"""
TUNNEL = """name: "tunnel"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2, 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2, 2 ] } ]
ensemble_scheduling { step [
  { model_name: "tunnel_in" model_version: -1
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "flat" } },
  { model_name: "tunnel_out" model_version: -1
    input_map { key: "INPUT0" value: "flat" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""
# As Triton's L0_metrics holds sequences with identity_delay: no control inputs.
SEQUENCE = """name: "sequence"
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching { direct { max_queue_delay_microseconds: 1000 } }
"""
UNPAIRED = """name: "unpaired"
backend: "identity"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
CONFIGS = {
    "echo": ECHO,
    "tunnel_in": TUNNEL_IN,
    "tunnel_out": TUNNEL_OUT,
    "tunnel": TUNNEL,
    "sequence": SEQUENCE,
    "unpaired": UNPAIRED,
}
READY = ("echo", "tunnel_in", "tunnel_out", "tunnel", "sequence")


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path
) -> Iterator[tuple[str, str, str]]:
    """(HTTP URL, gRPC URL, metrics URL) in front of a worker serving the models above,
    each from a config and an empty version folder."""
    root = tmp_path_factory.mktemp("identity") / "models"
    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    db = fresh_db(redis_url, 13)
    worker = start_worker(root, db, log_dir)
    gateway, url = start_gateway(root, db, log_dir)
    grpc, grpc_url = start_grpc(root, db, log_dir)
    try:
        for name in READY:
            wait_model_ready(url, name, 90, worker, gateway)
        yield url, grpc_url, gateway.metrics_url
    finally:
        grpc.stop()
        gateway.stop()
        worker.stop()


def request(width: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    floats = np.arange(width, dtype=np.float32).reshape(1, width) + k
    words = np.array([[f"word {k}".encode()]], dtype=object)
    return floats, words


def ask(module, client, floats: np.ndarray, words: np.ndarray):
    inputs = [
        module.InferInput("INPUT0", list(floats.shape), "FP32"),
        module.InferInput("INPUT1", list(words.shape), "BYTES"),
    ]
    inputs[0].set_data_from_numpy(floats)
    inputs[1].set_data_from_numpy(words)
    result = client.infer("echo", inputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def executions(url: str) -> tuple[int, int]:
    stats = httpclient.InferenceServerClient(url).get_inference_statistics("echo")
    echo = stats["model_stats"][0]
    return echo["inference_count"], echo["execution_count"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrent_requests_run_as_one_delayed_batch_each_with_its_own_tensors(
    stack, protocol
) -> None:
    url, grpc_url, _ = stack
    module = httpclient if protocol == "http" else grpcclient
    where = url if protocol == "http" else grpc_url
    asks = [request(width, k) for k, width in enumerate([3, 0, 5, 1, 0, 8])]
    before = executions(url)
    began = time.monotonic()

    def one(pair):
        client = module.InferenceServerClient(where)
        try:
            return ask(module, client, *pair)
        finally:
            client.close()

    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(one, asks))
    took = time.monotonic() - began
    for (floats, words), (got_floats, got_words) in zip(asks, answers, strict=True):
        assert got_floats.dtype == np.float32 and got_floats.shape == floats.shape
        np.testing.assert_array_equal(got_floats, floats)
        assert got_words.tolist() == words.tolist()
    after = executions(url)
    assert after[0] - before[0] == len(asks)
    # Six requests of different widths meet in the batcher's window and share one
    # execution, so one 400 ms delay, not six.
    assert after[1] - before[1] < len(asks)
    assert took < 0.4 * len(asks)


def test_an_ensemble_of_identity_steps_takes_their_reshapes(stack) -> None:
    url, grpc_url, _ = stack
    x = np.arange(12, dtype=np.int32).reshape(3, 2, 2)
    inp = httpclient.InferInput("IN", list(x.shape), np_to_triton_dtype(x.dtype))
    inp.set_data_from_numpy(x)
    got = httpclient.InferenceServerClient(url).infer("tunnel", [inp]).as_numpy("OUT")
    np.testing.assert_array_equal(got, x)
    flat = grpcclient.InferInput("INPUT0", [3, 2, 2], "INT32")
    flat.set_data_from_numpy(x)
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        step = client.infer("tunnel_in", [flat]).as_numpy("OUTPUT0")
    finally:
        client.close()
    np.testing.assert_array_equal(step, x.reshape(3, 4))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_model_answers_each_request_of_its_sequence(stack, protocol) -> None:
    url, grpc_url, _ = stack
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(url if protocol == "http" else grpc_url)
    try:
        for step, (start, end) in enumerate([(True, False), (False, False), (False, True)]):
            x = np.array([[float(step)]], np.float32)
            inp = module.InferInput("INPUT0", [1, 1], "FP32")
            inp.set_data_from_numpy(x)
            got = client.infer(
                "sequence", [inp], sequence_id=77, sequence_start=start, sequence_end=end
            ).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(got, x)
    finally:
        client.close()


def test_the_byte_counter_shows_on_the_metrics_port(stack) -> None:
    url, _, metrics_url = stack
    client = httpclient.InferenceServerClient(url)
    floats, words = request(4, 7)  # 16 bytes, and 4 + 6 bytes of BYTES as Triton counts them
    ask(httpclient, client, floats, words)
    line = 'input_byte_size_counter{model="echo",version="1"}'

    def counted() -> float:
        text = requests.get(f"http://{metrics_url}/metrics", timeout=5).text
        return max(
            (float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)), default=0
        )

    deadline = time.monotonic() + 15  # the worker publishes its metrics every few seconds
    while counted() < 26 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert counted() >= 26


def test_a_config_that_does_not_pair_is_unavailable_with_tritons_reason(stack) -> None:
    url, _, _ = stack
    client = httpclient.InferenceServerClient(url)
    deadline = time.monotonic() + 30
    reason = ""
    while time.monotonic() < deadline:
        index = {m["name"]: m for m in client.get_model_repository_index()}
        reason = index["unpaired"].get("reason", "")
        if reason:
            break
        time.sleep(0.5)
    assert "expected input and output datatype to match, got TYPE_FP32 and TYPE_INT32" in reason
    assert not client.is_model_ready("unpaired")
