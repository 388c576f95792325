"""Triton's response cache through the real path: redis-server, a Celery worker, the
gateway under gunicorn and ``conch grpc``, driven by stock tritonclient.

A hit is answered by the frontend without reaching the model's queue: the model's
execution count stays put, and with ``redis`` the answer one gateway stored is
served by another while no worker runs at all.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from harness import (
    ROOT,
    Service,
    conch,
    free_port,
    start_gateway,
    start_grpc,
    start_redis,
    start_worker,
    wait_grpc_model_ready,
    wait_model_ready,
    wait_until,
)
from models import add_model, ensemble, ensemble_step

CACHED = "response_cache { enable: true }"
ADD_IO = (
    'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
    '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]'
)
MODELS = ("cached", "plain", "two_out")


def _repository(root: Path) -> Path:
    add_model(root / "cached", extra=CACHED)
    add_model(root / "plain")
    # Two outputs (Triton's add_sub, a Python model): asking for one is another request.
    shutil.copytree(ROOT / "functions" / "add_sub", root / "two_out")
    config = root / "two_out" / "config.pbtxt"
    config.write_text(
        config.read_text().replace('name: "add_sub"', 'name: "two_out"') + CACHED + "\n"
    )
    # Step 1 cached (A + B -> S), step 2 not (S + S -> OUT): OUT = 2 (A + B).
    steps = [
        ensemble_step("cached", {"A": "A", "B": "B"}, {"OUT": "S"}),
        ensemble_step("plain", {"A": "S", "B": "S"}, {"OUT": "OUT"}),
    ]
    ensemble(root, "pipeline", ADD_IO, steps)
    ensemble(root, "pipeline_cached", ADD_IO + "\n" + CACHED, steps)
    return root


def _inputs(a: np.ndarray, module=httpclient, names: tuple[str, str] = ("A", "B")) -> list:
    """``a`` and ones, as the model's two inputs."""
    out = []
    for name, value in zip(names, (a, np.ones_like(a)), strict=True):
        tensor = module.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


def _count(stats: dict, phase: str) -> int:
    return int(stats["inference_stats"][phase]["count"])


def _sample(text: str, name: str, model: str) -> float:
    m = re.search(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} ([0-9.e+]+)$', text, re.M)
    assert m, f"{name} for {model} not in:\n{text}"
    return float(m.group(1))


@pytest.fixture(scope="module")
def stack(tmp_path_factory, log_dir: Path) -> Iterator[dict]:
    """A broker, a worker, a gateway and a gRPC server, each frontend with a local cache."""
    repo = _repository(tmp_path_factory.mktemp("cache_repo"))
    broker, url = start_redis(log_dir)
    flags = ("--cache-config", "local,size=1048576")
    worker = start_worker(repo, url, log_dir, "--models", ",".join(MODELS))
    gateway, http_url = start_gateway(repo, url, log_dir, *flags)
    grpc, grpc_url = start_grpc(repo, url, log_dir, *flags, "--grpc-workers", "1")
    try:
        for m in (*MODELS, "pipeline", "pipeline_cached"):
            wait_model_ready(http_url, m, 120, worker, gateway)
        wait_grpc_model_ready(grpc_url, "cached", 60, grpc)
        yield {
            "http": httpclient.InferenceServerClient(http_url),
            "grpc_url": grpc_url,
            "gateway": gateway,
            "repo": repo,
            "broker_url": url,
        }
    finally:
        grpc.stop()
        gateway.stop()
        worker.stop()
        broker.stop()


def test_a_repeated_request_is_answered_from_the_cache_without_running_the_model(stack) -> None:
    client = stack["http"]
    a = np.arange(4, dtype=np.float32).reshape(1, 4) + 100
    before = _stats(client, "cached")
    first = client.infer("cached", _inputs(a)).as_numpy("OUT")
    second = client.infer("cached", _inputs(a)).as_numpy("OUT")
    np.testing.assert_array_equal(first, a + 1)
    np.testing.assert_array_equal(second, first)
    after = _stats(client, "cached")
    # The model ran once; the second answer never reached its queue.
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 1
    assert _count(after, "cache_miss") - _count(before, "cache_miss") == 1
    assert _count(after, "cache_hit") - _count(before, "cache_hit") == 1
    # As in Triton, a hit is a successful request (with no compute time of its own).
    assert _count(after, "success") - _count(before, "success") == 2
    assert after["inference_stats"]["cache_hit"]["ns"] > 0
    assert after["inference_stats"]["cache_miss"]["ns"] > 0


def test_other_inputs_or_outputs_are_other_requests(stack) -> None:
    client = stack["http"]
    a = np.full((1, 4), 7, dtype=np.float32)
    before = _stats(client, "cached")
    client.infer("cached", _inputs(a))
    client.infer("cached", _inputs(a + 1))  # other bytes
    client.infer("cached", _inputs(np.full((2, 4), 7, dtype=np.float32)))  # other shape
    after = _stats(client, "cached")
    assert _count(after, "cache_miss") - _count(before, "cache_miss") == 3
    assert _count(after, "cache_hit") == _count(before, "cache_hit")

    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    both = client.infer("two_out", _inputs(x, names=("INPUT0", "INPUT1")))
    only_sub = client.infer(
        "two_out",
        _inputs(x, names=("INPUT0", "INPUT1")),
        outputs=[httpclient.InferRequestedOutput("OUTPUT1")],
    )
    assert only_sub.as_numpy("OUTPUT0") is None  # only what was asked, not what was stored
    np.testing.assert_array_equal(only_sub.as_numpy("OUTPUT1"), both.as_numpy("OUTPUT1"))
    again = client.infer(
        "two_out",
        _inputs(x, names=("INPUT0", "INPUT1")),
        outputs=[httpclient.InferRequestedOutput("OUTPUT1")],
    )
    np.testing.assert_array_equal(again.as_numpy("OUTPUT1"), x - 1)
    stats = _stats(client, "two_out")
    assert (_count(stats, "cache_miss"), _count(stats, "cache_hit")) == (2, 1)
    assert stats["execution_count"] == 2


def test_a_model_without_response_cache_is_never_cached(stack) -> None:
    client = stack["http"]
    a = np.full((1, 4), 3, dtype=np.float32)
    before = _stats(client, "plain")
    for _ in range(3):
        client.infer("plain", _inputs(a))
    after = _stats(client, "plain")
    assert after["execution_count"] - before["execution_count"] == 3
    assert _count(after, "cache_hit") == _count(after, "cache_miss") == 0


def test_a_failed_request_is_never_cached(stack) -> None:
    client = stack["http"]
    a = np.full((1, 4), 5, dtype=np.float32)
    # Past its deadline before it runs: 'timeout' of 1 us fails in the queue.
    for _ in range(2):
        with pytest.raises(Exception, match=r"[Tt]imeout|deadline"):
            client.infer("cached", _inputs(a), timeout=1)
    np.testing.assert_array_equal(client.infer("cached", _inputs(a)).as_numpy("OUT"), a + 1)


def test_an_ensemble_caches_its_steps_whose_model_enables_it(stack) -> None:
    client = stack["http"]
    a = np.full((1, 4), 11, dtype=np.float32)
    cached, plain = _stats(client, "cached"), _stats(client, "plain")
    for _ in range(2):
        np.testing.assert_array_equal(
            client.infer("pipeline", _inputs(a)).as_numpy("OUT"), 2 * (a + 1)
        )
    cached2, plain2 = _stats(client, "cached"), _stats(client, "plain")
    assert cached2["execution_count"] - cached["execution_count"] == 1  # step 1: a hit
    assert _count(cached2, "cache_hit") - _count(cached, "cache_hit") == 1
    assert plain2["execution_count"] - plain["execution_count"] == 2  # step 2: no cache
    ens = _stats(client, "pipeline")
    assert _count(ens, "success") == 2 and _count(ens, "cache_hit") == 0


def test_an_ensemble_that_enables_the_cache_is_answered_whole(stack) -> None:
    """Triton caches a top-level ensemble request that enables it: no step runs."""
    client = stack["http"]
    a = np.full((1, 4), 13, dtype=np.float32)
    client.infer("pipeline_cached", _inputs(a))
    plain = _stats(client, "plain")
    np.testing.assert_array_equal(
        client.infer("pipeline_cached", _inputs(a)).as_numpy("OUT"), 2 * (a + 1)
    )
    assert _stats(client, "plain")["execution_count"] == plain["execution_count"]
    ens = _stats(client, "pipeline_cached")
    assert (_count(ens, "cache_miss"), _count(ens, "cache_hit")) == (1, 1)


def test_grpc_statistics_and_nv_cache_metrics(stack) -> None:
    client = grpcclient.InferenceServerClient(stack["grpc_url"])
    try:
        a = np.full((1, 4), 21, dtype=np.float32)
        before = client.get_inference_statistics("cached", as_json=True)["model_stats"][0]
        for _ in range(3):
            out = client.infer("cached", _inputs(a, grpcclient)).as_numpy("OUT")
            np.testing.assert_array_equal(out, a + 1)
        after = client.get_inference_statistics("cached", as_json=True)["model_stats"][0]
    finally:
        client.close()

    def delta(phase: str) -> int:
        return int(after["inference_stats"][phase].get("count", 0)) - int(
            before["inference_stats"][phase].get("count", 0)
        )

    assert (delta("cache_miss"), delta("cache_hit")) == (1, 2)
    http_stats = _stats(stack["http"], "cached")  # the same counters, by either protocol
    assert _count(http_stats, "cache_hit") == int(after["inference_stats"]["cache_hit"]["count"])

    text = requests.get(f"http://{stack['gateway'].metrics_url}/metrics", timeout=10).text
    assert "# TYPE nv_cache_num_hits_per_model counter" in text
    assert _sample(text, "nv_cache_num_hits_per_model", "cached") == _count(http_stats, "cache_hit")
    assert _sample(text, "nv_cache_num_misses_per_model", "cached") == _count(
        http_stats, "cache_miss"
    )
    assert _sample(text, "nv_cache_hit_duration_per_model", "cached") >= 0
    assert _sample(text, "nv_cache_miss_duration_per_model", "cached") > 0
    assert not re.search(r'^nv_cache_num_hits_per_model\{model="plain"', text, re.M)


def test_eviction_keeps_a_local_cache_within_its_size(stack, log_dir: Path) -> None:
    """An entry of the add model is ~40 bytes: 100 bytes hold two."""
    repo, url = stack["repo"], stack["broker_url"]
    small, small_url = start_gateway(repo, url, log_dir, "--cache-config", "local,size=100")
    try:
        client = httpclient.InferenceServerClient(small_url)
        wait_model_ready(small_url, "cached", 60, small)
        xs = [np.full((1, 4), 1000 + i, dtype=np.float32) for i in range(3)]
        before = _stats(client, "cached")
        for x in (*xs, xs[0], xs[2]):  # x0 was evicted by x2; x2 is still there
            np.testing.assert_array_equal(client.infer("cached", _inputs(x)).as_numpy("OUT"), x + 1)
        after = _stats(client, "cached")
        assert _count(after, "cache_miss") - _count(before, "cache_miss") == 4
        assert _count(after, "cache_hit") - _count(before, "cache_hit") == 1
    finally:
        small.stop()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("local", "the form is <cache>,<key>=<value>"),
        ("redis,host=127.0.0.1", "the redis cache needs port"),
        ("disk,size=10", "unknown cache 'disk'"),
    ],
)
def test_a_bad_cache_config_stops_the_start_with_what_to_write(
    tmp_path: Path, value: str, says: str
) -> None:
    for role in ("gateway", "grpc"):
        proc = subprocess.run(
            conch(role, "--model-repository", str(tmp_path), "--cache-config", value),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0
        assert says in proc.stderr and "--cache-config" in proc.stderr, proc.stderr


# -- one cache shared by every gateway (redis) --------------------------------------------


@pytest.fixture()
def shared(tmp_path: Path, log_dir: Path) -> Iterator[dict]:
    """Two gateways over one broker, sharing a cache in a Redis of its own."""
    repo = tmp_path / "models"
    add_model(repo / "cached", extra=CACHED)
    broker, url = start_redis(log_dir)
    cache, cache_url = start_redis(log_dir)
    port = cache_url.rsplit(":", 1)[1].split("/")[0]
    flags = ("--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={port}")
    worker = start_worker(repo, url, log_dir, "--models", "cached")
    services: list[Service] = [worker, broker, cache]
    try:
        one, one_url = start_gateway(repo, url, log_dir, *flags)
        services.insert(0, one)
        two, two_url = start_gateway(repo, url, log_dir, *flags)
        services.insert(0, two)
        wait_model_ready(one_url, "cached", 90, worker, one)
        yield {"one": one_url, "two": two_url, "worker": worker, "cache": cache, "url": cache_url}
    finally:
        for s in services:
            s.stop()


def test_a_shared_redis_cache_answers_behind_another_gateway_with_no_worker(shared) -> None:
    one = httpclient.InferenceServerClient(shared["one"])
    two = httpclient.InferenceServerClient(shared["two"])
    a = np.full((1, 4), 42, dtype=np.float32)
    np.testing.assert_array_equal(one.infer("cached", _inputs(a)).as_numpy("OUT"), a + 1)
    assert redis.Redis.from_url(shared["url"]).zcard("conch.cache.lru") == 1
    shared["worker"].stop()  # nothing can run the model now
    out = two.infer("cached", _inputs(a), timeout=5_000_000).as_numpy("OUT")
    np.testing.assert_array_equal(out, a + 1)
    stats = _stats(two, "cached")
    assert (_count(stats, "cache_miss"), _count(stats, "cache_hit")) == (1, 1)
    assert stats["execution_count"] == 1


def test_a_cache_redis_that_fails_costs_a_miss_never_the_request(shared) -> None:
    one = httpclient.InferenceServerClient(shared["one"])
    a = np.full((1, 4), 43, dtype=np.float32)
    one.infer("cached", _inputs(a))
    shared["cache"].stop()  # the cache's Redis goes away; the broker stays
    for _ in range(2):
        np.testing.assert_array_equal(one.infer("cached", _inputs(a)).as_numpy("OUT"), a + 1)
    stats = _stats(one, "cached")
    assert stats["execution_count"] == 3
    assert _count(stats, "cache_hit") == 0


def test_a_gateway_whose_cache_redis_does_not_answer_does_not_start(tmp_path, log_dir) -> None:
    add_model(tmp_path / "cached", extra=CACHED)
    broker, url = start_redis(log_dir)
    try:
        gateway = Service(
            "gateway",
            conch(
                "gateway",
                *("--model-repository", str(tmp_path), "--redis-url", url),
                *("--http-port", str(free_port()), "--metrics-port", str(free_port())),
                *("--cache-config", f"redis,host=127.0.0.1,port={free_port()}"),
            ),
            log_dir,
        )
        wait_until(lambda: not gateway.alive(), 60, "the gateway to exit")
        assert "cannot reach the cache's Redis" in gateway.log(), gateway.log()[-3000:]
        gateway.stop()
    finally:
        broker.stop()
