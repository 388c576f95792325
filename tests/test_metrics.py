"""Prometheus metrics on the metrics port, with Triton's nv_inference_* names."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import numpy as np
import redis
import requests
import tritonclient.http as httpclient

from harness import start_gateway, start_worker, wait_model_ready, wait_until
from models import add_model


def sample(text: str, name: str, model: str) -> float:
    m = re.search(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} ([0-9.e+]+)$', text, re.M)
    assert m, f"{name} for {model} not in:\n{text}"
    return float(m.group(1))


def test_metrics_count_requests_and_queue(tmp_path: Path, redis_url: str, log_dir: Path) -> None:
    repo = tmp_path / "models"
    add_model(repo / "add", max_batch_size=8, delay_us=20_000)
    add_model(repo / "idle")
    db = redis_url.rsplit("/", 1)[0] + "/13"
    redis.Redis.from_url(db).flushdb()
    worker = start_worker(repo, db, log_dir, "--models", "add")
    gateway, url = start_gateway(repo, db, log_dir)
    try:
        wait_model_ready(url, "add", 60, worker, gateway)
        client = httpclient.InferenceServerClient(url)
        a = np.ones((2, 4), np.float32)
        inputs = []
        for name in ("A", "B"):
            i = httpclient.InferInput(name, [2, 4], "FP32")
            i.set_data_from_numpy(a)
            inputs.append(i)
        for _ in range(5):
            client.infer("add", inputs)
        metrics = f"http://{gateway.metrics_url}/metrics"

        def scraped() -> str:
            return requests.get(metrics, timeout=10).text

        wait_until(
            lambda: sample(scraped(), "nv_inference_request_success", "add") >= 5, 10, "counters"
        )
        text = scraped()
        assert "# TYPE nv_inference_request_success counter" in text
        assert sample(text, "nv_inference_count", "add") == 10  # 5 requests of 2 rows
        assert 1 <= sample(text, "nv_inference_exec_count", "add") <= 5
        assert sample(text, "nv_inference_request_failure", "add") == 0
        assert sample(text, "nv_inference_queue_duration_us", "add") > 0
        assert sample(text, "nv_inference_compute_infer_duration_us", "add") > 0
        for name in ("input", "output"):
            assert f"# TYPE nv_inference_compute_{name}_duration_us counter" in text
        # End to end covers the queue and the compute, and every series names its version.
        assert sample(text, "nv_inference_request_duration_us", "add") >= sample(
            text, "nv_inference_queue_duration_us", "add"
        ) + sample(text, "nv_inference_compute_infer_duration_us", "add")
        assert re.search(r'^nv_inference_count\{model="add",version="1"\} 10$', text, re.M), text
        # A worker that goes takes nothing with it: counters never run backwards.
        worker.stop()
        worker = start_worker(repo, db, log_dir, "--models", "add")
        wait_model_ready(url, "add", 60, worker, gateway)
        assert sample(scraped(), "nv_inference_count", "add") == 10
        client.infer("add", inputs)
        assert sample(scraped(), "nv_inference_count", "add") == 12
        # The pending gauge is the queue's depth: "idle" has no worker, so its request waits.
        with contextlib.suppress(Exception):
            client.infer("idle", inputs, timeout=200_000)
        assert sample(scraped(), "nv_inference_pending_request_count", "idle") == 1
        # Only /metrics is served there, and the inference port does not serve it.
        assert requests.get(f"http://{gateway.metrics_url}/v2", timeout=10).status_code == 404
        assert requests.get(f"http://{url}/metrics", timeout=10).status_code == 404
    finally:
        gateway.stop()
        worker.stop()
