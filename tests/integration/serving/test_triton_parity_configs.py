"""Configs as Triton normalizes them, through the real path (issue 29, point 5).

A private redis-server, a worker, a gateway and a gRPC server serve Triton's
L0_model_config autofill cases for onnx, pytorch and python models (configs partly or
wholly missing: tests/triton_autofill.py); stock tritonclient reads each config back over
HTTP and gRPC, and it must be the config Triton answers for the same case (as Triton's
own test compares them: the whole message). Pinned memory, which normalization adds, is
warned about only for the model whose own config.pbtxt sets it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import triton_autofill
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format

from conch.backends.completion import complete
from conch.devtools.redis_server import start_private

from harness import start_gateway, start_grpc, start_worker, wait_model_ready

NAMES = sorted(triton_autofill.CASES)
# The case whose config.pbtxt sets pinned memory itself (Triton's pytorch/cpu_instance).
SETS_PINNED = "cpu_instance_pytorch"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[dict[str, object]]:
    repo = triton_autofill.build(tmp_path_factory.mktemp("autofill") / "models")
    server = start_private()
    worker = start_worker(repo, server.url, log_dir)
    gateway, url = start_gateway(repo, server.url, log_dir)
    grpc, grpc_url = start_grpc(repo, server.url, log_dir)
    try:
        for name in NAMES:
            wait_model_ready(url, name, 120, worker, gateway)
        yield {"http": url, "grpc": grpc_url, "worker": worker, "gateway": gateway}
    finally:
        grpc.stop()
        gateway.stop()
        worker.stop()
        server.stop()


def _want(name: str):
    # The GPUs the servers give this backend, as they count them.
    return triton_autofill.expected(name, complete.gpu_count(triton_autofill.CASES[name].backend))


def _same(got, want) -> None:
    assert got == want, (
        f"got:\n{text_format.MessageToString(got)}\nwant:\n{text_format.MessageToString(want)}"
    )


@pytest.mark.parametrize("name", NAMES)
def test_http_config_is_tritons(stack: dict[str, object], name: str) -> None:
    client = httpclient.InferenceServerClient(str(stack["http"]))
    _same(triton_autofill.as_config(client.get_model_config(name)), _want(name))


@pytest.mark.parametrize("name", NAMES)
def test_grpc_config_is_tritons(stack: dict[str, object], name: str) -> None:
    client = grpcclient.InferenceServerClient(str(stack["grpc"]))
    try:
        _same(triton_autofill.as_config(client.get_model_config(name).config), _want(name))
    finally:
        client.close()


def test_a_model_whose_config_reports_tritons_two_instances_serves(
    stack: dict[str, object],
) -> None:
    """no_config's group reads count 2 (Triton's); the worker runs it (one instance:
    tests/unit/core/test_config_normalization.py checks the instances)."""
    client = httpclient.InferenceServerClient(str(stack["http"]))
    [group] = client.get_model_config("no_config")["instance_group"]
    assert (group["kind"], group["count"]) == ("KIND_CPU", 2)
    x = np.arange(32, dtype=np.int32).reshape(2, 16)
    inputs = []
    for n in ("INPUT0", "INPUT1"):
        i = httpclient.InferInput(n, [2, 16], "INT32")
        i.set_data_from_numpy(x)
        inputs.append(i)
    out = client.infer("no_config", inputs).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, x.astype(np.int8))
    stats = client.get_inference_statistics("no_config")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 1


def test_pinned_memory_is_warned_about_only_where_the_config_sets_it(
    stack: dict[str, object],
) -> None:
    for service in ("worker", "gateway"):
        log = stack[service].log()  # type: ignore[attr-defined]
        warned = [line for line in log.splitlines() if "pinned_memory is ignored" in line]
        assert warned, f"{service}: no pinned-memory warning for {SETS_PINNED}"
        assert all(f"'{SETS_PINNED}'" in line for line in warned), warned
