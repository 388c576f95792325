"""Models resident within a memory budget (issue 32, point 5), through a real worker.

Three models of about 1 MiB each (their files: an ONNX graph and a padding file) and a
worker with ``--model-memory-budget`` of 2.5 MiB: none is resident at start, each reads
ready, a request loads its model, and the one used least recently is unloaded to make
room. A model larger than the budget is unavailable, with the reason.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient

from conch.frontend.model_view import STANDBY_REASON
from conch.wire import worker_reports

from harness import fresh_db, start_gateway, start_worker, wait_until
from models import offset_model

MIB = 1 << 20
MODELS = {"m1": 1.0, "m2": 2.0, "m3": 3.0}  # model -> the offset its answers add


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("budget") / "models"
    for name, offset in MODELS.items():
        offset_model(root / name, 1, offset)
        (root / name / "1" / "padding.bin").write_bytes(b"\0" * MIB)
    offset_model(root / "big", 1, 9.0)
    (root / "big" / "1" / "padding.bin").write_bytes(b"\0" * (3 * MIB))
    return root


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 15)


@pytest.fixture(scope="module")
def gateway_metrics() -> dict[str, str]:
    return {}


@pytest.fixture(scope="module")
def stack(repo: Path, db: str, log_dir: Path, gateway_metrics: dict[str, str]) -> Iterator[str]:
    worker = start_worker(repo, db, log_dir, "--model-memory-budget", "2560K")
    gateway, url = start_gateway(repo, db, log_dir)
    gateway_metrics["url"] = gateway.metrics_url
    try:
        client = httpclient.InferenceServerClient(url)
        wait_until(
            lambda: all(client.is_model_ready(m) for m in MODELS), 90, "standby", worker, gateway
        )
        yield url
    finally:
        gateway.stop()
        worker.stop()


def states(db: str) -> dict[str, dict]:
    reports = worker_reports.snapshot(redis.Redis.from_url(db))
    return worker_reports.model_states(reports)


def resident(db: str) -> set[str]:
    return {m for m, st in states(db).items() if worker_reports.READY in st["versions"].values()}


def infer(url: str, model: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    x = httpclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.zeros((1, 4), np.float32))
    return client.infer(model, [x], timeout=60_000_000).as_numpy("Y")


def index(url: str) -> dict[str, dict]:
    request = urllib.request.Request(f"http://{url}/v2/repository/index", data=b"{}")
    with urllib.request.urlopen(request, timeout=30) as resp:
        return {row["name"]: row for row in json.load(resp)}


def test_nothing_is_resident_at_start_and_every_model_reads_ready(stack: str, db: str) -> None:
    assert resident(db) == set()
    for name in MODELS:
        assert states(db)[name]["versions"] == {"1": worker_reports.STANDBY}
        row = index(stack)[name]
        assert (row["state"], row["reason"]) == ("READY", STANDBY_REASON)


def test_work_loads_a_model_and_the_least_recently_used_makes_room(stack: str, db: str) -> None:
    for name, offset in MODELS.items():  # m1, m2, then m3 evicts m1
        np.testing.assert_array_equal(infer(stack, name), np.full((1, 4), offset, np.float32))
        assert name in resident(db)
        assert len(resident(db)) <= 2
    assert resident(db) == {"m2", "m3"}
    assert states(db)["m1"]["versions"] == {"1": worker_reports.STANDBY}
    np.testing.assert_array_equal(infer(stack, "m1"), np.full((1, 4), 1.0, np.float32))
    assert resident(db) == {"m3", "m1"}  # m2 was the least recently used


def test_a_model_larger_than_the_budget_is_unavailable_with_the_reason(stack: str) -> None:
    row = index(stack)["big"]
    assert row["state"] == "UNAVAILABLE"
    assert "more than --model-memory-budget 2621440" in row["reason"]
    with pytest.raises(Exception, match="more than --model-memory-budget"):
        infer(stack, "big")


def test_the_work_owed_says_where_each_model_is_resident(
    stack: str, db: str, gateway_metrics: dict[str, str]
) -> None:
    infer(stack, "m2")  # resident now, beside one other
    query = "model=m1&model=m2&model=m3"
    with urllib.request.urlopen(
        f"http://{gateway_metrics['url']}/queue-depth?{query}", timeout=30
    ) as resp:
        models = json.load(resp)["models"]
    (worker,) = {w for m in models.values() for w in m["resident_on"] + m["standby_on"]}
    assert models["m2"]["resident_on"] == [worker]
    assert sorted(m for m in models if models[m]["resident_on"]) == sorted(resident(db))
    assert sum(bool(models[m]["standby_on"]) for m in models) == 1
