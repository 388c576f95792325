"""conch over many hosts: Redis, the gateway (HTTP and gRPC) and two workers each on a
host of its own (``netns``: its own addresses, loopback, hostname and /tmp), sharing
nothing but the model repository's folder. Skipped, with the reason, where such hosts
cannot be made (not root, no iproute2).

The tests run in order on one cluster: the last one takes a worker's host away.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kombu.transport.redis import Channel

from conch.settings import Settings
from conch.wire import keys, worker_reports
from conch.wire.work_owed import work_owed
from conch.worker.app import transport_options

from harness import (
    Service,
    reference_mlp,
    start_gateway,
    start_grpc,
    start_redis,
    start_worker,
    wait_model_ready,
    wait_until,
    worker_requests,
)
from integration.deploy.netns import Host, Network, unavailable

# Triton's ports, and Redis's: every host has its own, so the defaults never collide.
REDIS_PORT, HTTP_PORT, GRPC_PORT, METRICS_PORT = 6379, 8000, 8001, 8002
MODELS = ("mlp", "slow")
# A held message whose worker stopped beating comes back after this long (default 6 s);
# above the 1.5 s heartbeat with room for a busy machine.
VISIBILITY_S = 3
WORKERS = ("worker-a", "worker-b")


@dataclass
class Cluster:
    network: Network
    hosts: dict[str, Host]
    redis_url: str
    http_url: str
    grpc_url: str
    metrics_url: str
    workers: dict[str, Service]

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, model_repo: Path, log_dir: Path
) -> Iterator[Cluster]:
    reason = unavailable()
    if reason:
        pytest.skip(f"no test hosts here: {reason}")
    services: list[Service] = []
    with Network(tmp_path_factory.mktemp("hosts")) as net:
        hosts = {name: net.add_host(name) for name in ("redis", "gateway", *WORKERS)}
        try:
            store, url = start_redis(log_dir, on=hosts["redis"], port=REDIS_PORT)
            services.append(store)
            env = {"CONCH_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S)}
            workers = {
                name: start_worker(
                    model_repo, url, log_dir, "--models", ",".join(MODELS), env=env, on=hosts[name]
                )
                for name in WORKERS
            }
            services += workers.values()
            gw, http_url = start_gateway(
                model_repo,
                url,
                log_dir,
                env=env,
                on=hosts["gateway"],
                port=HTTP_PORT,
                metrics_port=METRICS_PORT,
            )
            services.append(gw)
            grpc, grpc_url = start_grpc(
                model_repo, url, log_dir, env=env, on=hosts["gateway"], port=GRPC_PORT
            )
            services.append(grpc)
            client = redis.Redis.from_url(url)
            wait_until(
                lambda: len(worker_reports.snapshot(client)) == len(WORKERS),
                60,
                "both workers to report",
                *services,
            )
            for model in MODELS:
                wait_model_ready(http_url, model, 90, *services)
            yield Cluster(net, hosts, url, http_url, grpc_url, gw.metrics_url, workers)
        finally:
            for svc in reversed(services):
                svc.stop()


def mlp_http(url: str, x: np.ndarray) -> np.ndarray:
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return httpclient.InferenceServerClient(url).infer("mlp", [inp]).as_numpy("OUTPUT0")


def mlp_grpc(url: str, x: np.ndarray) -> np.ndarray:
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(url) as client:
        return client.infer("mlp", [inp]).as_numpy("OUTPUT0")


def slow_http(url: str, value: float) -> np.ndarray:
    inp = httpclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(np.full((1, 4), value, np.float32))
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    return client.infer("slow", [inp]).as_numpy("Y")


def test_requests_answer_across_hosts(cluster: Cluster) -> None:
    xs = [np.random.default_rng(i).standard_normal((2, 64), dtype=np.float32) for i in range(240)]
    with ThreadPoolExecutor(16) as pool:
        over_http = list(pool.map(lambda x: mlp_http(cluster.http_url, x), xs[:200]))
        over_grpc = list(pool.map(lambda x: mlp_grpc(cluster.grpc_url, x), xs[200:]))
    for x, got in zip(xs, over_http + over_grpc, strict=True):
        np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-5, atol=1e-5)

    # Both workers took a share, each under its own host's name.
    client = cluster.redis()
    wait_until(
        lambda: sum(worker_requests(client, "mlp").values()) == len(xs),
        10,
        "the workers' counters",
    )
    shares = worker_requests(client, "mlp")
    assert sorted(i.split(".")[0] for i in shares) == sorted(WORKERS), shares
    assert all(n > 0 for n in shares.values()), shares

    # The metrics port answers on the gateway host's address, with every request counted.
    text = requests.get(f"http://{cluster.metrics_url}/metrics", timeout=10).text
    success = re.search(
        r'^nv_inference_request_success\{[^}]*model="mlp"[^}]*\} (\S+)$', text, re.M
    )
    assert success and float(success.group(1)) == len(xs), text

    # Each worker reaches Redis and nothing else, and listens for no one; the gateway
    # host's only outgoing connections are to Redis too.
    redis_at = f"{cluster.hosts['redis'].address}:{REDIS_PORT}"
    for name in WORKERS:
        host = cluster.hosts[name]
        peers = {peer for _, peer in host.connections()}
        assert peers == {redis_at}, (name, peers)
        assert host.listening() == [], (name, host.listening())
    gateway = cluster.hosts["gateway"]
    served = {f"{gateway.address}:{p}" for p in (HTTP_PORT, GRPC_PORT, METRICS_PORT)}
    outgoing = {peer for local, peer in gateway.connections() if local not in served}
    assert outgoing == {redis_at}, outgoing


def test_a_worker_host_going_away_loses_nothing(cluster: Cluster) -> None:
    client = cluster.redis()
    victim, survivor = (cluster.hosts[name] for name in WORKERS)
    values = [float(i) for i in range(16)]
    pool = ThreadPoolExecutor(len(values))
    try:
        futures = [pool.submit(slow_http, cluster.http_url, v) for v in values]
        # A worker holds one batch (8) of "slow" at most: past 8 requests in flight, both
        # hold some. Counted in requests, not messages: a bundle carries several.
        wait_until(
            lambda: work_owed(client, ["slow"])["slow"].in_flight > 8,
            30,
            "both workers to hold requests",
            *cluster.workers.values(),
        )
        # The worst moment: in the middle of its restore sweep, holding kombu's lock on
        # sweeps (taken here on its behalf, as the victim's kombu takes it), which it
        # will never release.
        options = transport_options(Settings(visibility_timeout_s=VISIBILITY_S))
        # Its expiry as the victim's kombu reads it: conch's option, else kombu's default.
        expire = options.get("unacked_mutex_expire", Channel.unacked_mutex_expire)
        lock = client.lock(Channel.unacked_mutex_key, timeout=expire)
        wait_until(lambda: lock.acquire(blocking=False), 10, "kombu's lock on sweeps")
        cluster.network.take_away(victim)
        # What the victim held comes back once the lock and the visibility timeout have
        # run out, and runs again on the survivor: a second delivery.
        wait_until(
            lambda: any(int(n) > 1 for n in client.hvals(keys.ATTEMPTS)),
            2 * VISIBILITY_S + 10,
            "the gone host's requests to be delivered again",
            cluster.workers["worker-b"],
        )
        for value, future in zip(values, futures, strict=True):
            np.testing.assert_array_equal(
                future.result(timeout=60), np.full((1, 4), value + 1, np.float32)
            )
        assert client.zcard(keys.UNACKED_INDEX) == 0
        assert work_owed(client, ["slow"])["slow"].owed == 0
        assert client.llen(keys.DEADLETTER) == 0
        # The gone worker's report expires; the model stays ready on the survivor.
        wait_until(
            lambda: (
                [r["id"].split(".")[0] for r in worker_reports.snapshot(client)] == [survivor.name]
            ),
            15,
            "the gone worker's report to expire",
        )
        assert httpclient.InferenceServerClient(cluster.http_url).is_model_ready("slow")
        np.testing.assert_array_equal(
            slow_http(cluster.http_url, 7.0), np.full((1, 4), 8.0, np.float32)
        )
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
