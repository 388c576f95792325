"""Prometheus metrics on the metrics port, with Triton's nv_inference_* names."""

from __future__ import annotations

import contextlib
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.devtools.redis_server import start_private

from harness import start_gateway, start_worker, wait_model_ready, wait_until, waiting
from integration.serving.test_triton_parity import IDENTITY_CONFIG, ONE_INSTANCE, SLOW_MODEL
from models import add_inputs, add_model, ensemble, ensemble_step, python_model


def sample(text: str, name: str, model: str) -> float:
    m = re.search(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} ([0-9.e+]+)$', text, re.M)
    assert m, f"{name} for {model} not in:\n{text}"
    return float(m.group(1))


def test_metrics_count_requests_and_queue(tmp_path: Path, redis_url: str, log_dir: Path) -> None:
    repo = tmp_path / "models"
    add_model(repo / "add", max_batch_size=8, delay_us=20_000)
    add_model(repo / "idle")
    io = (
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    )
    step = ensemble_step("idle", {"A": "A", "B": "B"}, {"OUT": "OUT"})
    ensemble(repo, "idle_ensemble", io, [step])
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
        text = scraped()
        assert sample(text, "nv_inference_pending_request_count", "idle") == 1
        # An ensemble's requests wait in its steps' queues: its own gauge is 0, as Triton's.
        assert re.search(
            r'^nv_inference_pending_request_count\{model="idle_ensemble",version="1"\} 0$',
            text,
            re.M,
        ), text
        # Only /metrics is served there, and the inference port does not serve it.
        assert requests.get(f"http://{gateway.metrics_url}/v2", timeout=10).status_code == 404
        assert requests.get(f"http://{url}/metrics", timeout=10).status_code == 404
    finally:
        gateway.stop()
        worker.stop()


FAILING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("no")) for _ in requests]
"""


def series(text: str, name: str) -> dict[str, str]:
    """Every sample of ``name`` (exactly that name): its label text -> its value."""
    return {
        m.group(1): m.group(2) for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M)
    }


def test_metrics_are_exact_across_two_gateways_and_two_workers(
    tmp_path: Path, log_dir: Path
) -> None:
    """A known sequence of successes, rejections, cancellations and failures, through two
    gateway processes and two workers: both gateways print the same exact counts, the
    batcher's cuts by reason and sizes, and the workers' host once."""
    repo = tmp_path / "models"
    add_model(
        repo / "cut",  # waits 100 ms for more, but a preferred size (4) or 8 rows go at once
        extra="dynamic_batching { max_queue_delay_microseconds: 100000 preferred_batch_size: [4] }",
    )
    add_model(repo / "nodelay", extra="dynamic_batching { }")  # runs what the queue holds
    add_model(
        repo / "late",  # two may wait, each at most 100 ms
        extra="dynamic_batching { default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 100000 max_queue_size: 2 } }",
    )
    add_model(repo / "held")
    add_io = (repo / "held" / "config.pbtxt").read_text().split("\n", 1)[1]  # add's tensors
    python_model(repo / "failing", 'backend: "python"\n' + add_io, FAILING)
    server = start_private()
    db = server.url
    flags = (
        *("--metrics-config", "summary_latencies=true"),
        *("--metrics-config", "summary_quantiles=0.1:0.01,0.5:0.05,0.9:0.01"),
        *("--metrics-config", "histogram_latencies=true"),
    )
    (ga, url_a), (gb, url_b) = (start_gateway(repo, db, log_dir, *flags) for _ in range(2))
    workers: list = []
    try:
        one = np.ones((1, 4), np.float32)
        # Before any worker: "late" takes two (one through each gateway) and refuses two
        # more (503, REJECTED at the gateway); the two it took wait past their 100 ms.
        with ThreadPoolExecutor(2) as pool:
            waited = [
                pool.submit(httpclient.InferenceServerClient(u).infer, "late", add_inputs(one))
                for u in (url_a, url_b)
            ]
            wait_until(lambda: waiting(db, "late") == 2, 10, "two requests queued")
            for u in (url_a, url_b):
                with pytest.raises(InferenceServerException, match="Exceeds maximum queue size"):
                    httpclient.InferenceServerClient(u).infer("late", add_inputs(one))
            # An async job on "held", cancelled while it waits: CANCELED when a worker
            # finds it.
            body = {
                "inputs": [
                    {"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1] * 4} for n in "AB"
                ]
            }
            job = requests.post(f"http://{url_a}/v2/models/held/jobs", json=body, timeout=10)
            assert job.status_code in (200, 202), job.text
            assert requests.delete(f"http://{url_b}/v2/jobs/{job.json()['id']}").status_code == 200
            time.sleep(0.2)  # past the 100 ms: the workers find both "late" ones expired
            workers = [start_worker(repo, db, log_dir, *flags) for _ in range(2)]
            for f in waited:  # REJECTED at the worker
                with pytest.raises(InferenceServerException, match="Request timeout expired"):
                    f.result(timeout=120)
        for m in ("cut", "nodelay", "failing", "held"):
            wait_model_ready(url_a, m, 90, *workers, ga)
        a, b = httpclient.InferenceServerClient(url_a), httpclient.InferenceServerClient(url_b)
        for k in range(3):  # one row alone: cut when its 100 ms delay expires
            (a, b)[k % 2].infer("cut", add_inputs(one))
        a.infer("cut", add_inputs(np.ones((8, 4), np.float32)))  # full
        b.infer("cut", add_inputs(np.ones((4, 4), np.float32)))  # the preferred size
        for c in (a, b):
            c.infer("nodelay", add_inputs(one))  # nothing more queued, no delay: drained
        for c in (a, b, a):
            with pytest.raises(InferenceServerException, match="no"):
                c.infer("failing", add_inputs(one))

        failures = {
            "late": {"REJECTED": 4},
            "held": {"CANCELED": 1},
            "failing": {"BACKEND": 3},
            "cut": {},
            "nodelay": {},
        }
        expected = {
            f'model="{m}",reason="{r}",version="1"': str(by.get(r, 0))
            for m, by in failures.items()
            for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
        }

        def scrape(gateway: Any) -> str:
            return requests.get(f"http://{gateway.metrics_url}/metrics", timeout=10).text

        def failure_counts(text: str) -> dict[str, str]:
            got = series(text, "nv_inference_request_failure")
            return {k: v for k, v in got.items() if k in expected}

        wait_until(lambda: failure_counts(scrape(ga)) == expected, 20, f"failures {expected}")
        # A gateway calls a model ready once one worker has it; on a busy machine the other
        # may still be loading it when the requests above ran.
        wait_until(
            lambda: series(scrape(ga), "conch_model_loads_total").get('model="cut"') == "2",
            60,
            "both workers loaded cut",
        )
        texts = [scrape(ga), scrape(gb)]
        for text in texts:  # the same counts through either gateway
            assert failure_counts(text) == expected
            success = series(text, "nv_inference_request_success")
            assert success['model="cut",version="1"'] == "5"
            assert success['model="nodelay",version="1"'] == "2"
            assert series(text, "nv_inference_count")['model="cut",version="1"'] == "15"
            cuts = {k: v for k, v in series(text, "conch_batch_cut_total").items() if "cut" in k}
            assert cuts == {
                'model="cut",reason="full"': "1",
                'model="cut",reason="preferred"': "1",
                'model="cut",reason="delay"': "3",
                'model="cut",reason="drained"': "0",
            }
            assert series(text, "conch_batch_cut_total")['model="nodelay",reason="drained"'] == "2"
            assert series(text, "conch_model_loads_total")['model="cut"'] == "2"  # a worker each
            assert float(series(text, "conch_model_load_seconds_total")['model="cut"']) > 0
            assert "# TYPE conch_batch_size histogram" in text
            sizes = series(text, "conch_batch_size_bucket")
            assert [sizes[f'model="cut",le="{le}"'] for le in ("1", "2", "4", "8", "+Inf")] == [
                "3",
                "3",
                "4",
                "5",
                "5",
            ]
            assert series(text, "conch_batch_size_sum")['model="cut"'] == "15"
            assert series(text, "conch_batch_size_count")['model="cut"'] == "5"
            # Summaries: quantiles over the samples both workers pushed (one per success),
            # count and sum the counters'. Three of five requests waited out 100 ms.
            request = series(text, "nv_inference_request_summary_us")
            q = {
                k: float(request[f'model="cut",version="1",quantile="{k}"'])
                for k in ("0.1", "0.5", "0.9")
            }
            assert q["0.1"] < 100_000 <= q["0.5"] <= q["0.9"], q
            assert (
                series(text, "nv_inference_request_summary_us_count")['model="cut",version="1"']
                == "5"
            )
            assert int(
                series(text, "nv_inference_request_summary_us_sum")['model="cut",version="1"']
            ) == int(series(text, "nv_inference_request_duration_us")['model="cut",version="1"'])
            for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
                assert 'model="cut",version="1",quantile="0.5"' in series(
                    text, f"nv_inference_{phase}_summary_us"
                ), phase
            # The first-response histogram: bucket counters summed over the workers.
            first = series(text, "nv_inference_first_response_histogram_ms_bucket")
            assert int(first['model="cut",version="1",le="100"']) <= 2  # three waited 100 ms
            assert first['model="cut",version="1",le="+Inf"'] == "5"
            counts = series(text, "nv_inference_first_response_histogram_ms_count")
            assert counts['model="cut",version="1"'] == "5"
            assert counts['model="failing",version="1"'] == "0"  # successes only
            assert (
                float(
                    series(text, "nv_inference_first_response_histogram_ms_sum")[
                        'model="cut",version="1"'
                    ]
                )
                >= 300
            )
            # Two workers on one host: its CPU printed once, labelled by the host.
            host = socket.gethostname()
            cpu = series(text, "nv_cpu_utilization")
            assert list(cpu) == [f'host="{host}"'] and 0 <= float(cpu[f'host="{host}"']) <= 1
            total = series(text, "nv_cpu_memory_total_bytes")[f'host="{host}"']
            assert int(total) == _meminfo("MemTotal")
            used = int(series(text, "nv_cpu_memory_used_bytes")[f'host="{host}"'])
            assert 0 < used < int(total)
        # One sample per successful request, from either worker, in the model's list.
        assert redis.Redis.from_url(db).llen("conch.samples.cut") == 5
        # Async jobs: one that succeeds and one that fails, through either gateway.
        for u, m in ((url_a, "cut"), (url_b, "failing")):
            r = requests.post(f"http://{u}/v2/models/{m}/jobs", json=body, timeout=10)
            done = requests.get(f"http://{u}/v2/jobs/{r.json()['id']}/result?wait=30", timeout=60)
            assert done.status_code == (200 if m == "cut" else 500), done.text
        # Jobs by what happened to them (the cancelled one from before the workers).
        text = scrape(gb)
        jobs = {
            k: v
            for k, v in series(text, "conch_jobs_total").items()
            if 'kind="infer"' in k and v != "0"
        }
        assert jobs == {
            'model="held",kind="infer",state="submitted"': "1",
            'model="held",kind="infer",state="cancelled"': "1",
            'model="cut",kind="infer",state="submitted"': "1",
            'model="cut",kind="infer",state="succeeded"': "1",
            'model="failing",kind="infer",state="submitted"': "1",
            'model="failing",kind="infer",state="failed"': "1",
        }
    finally:
        for svc in (ga, gb, *workers):
            svc.stop()
        server.stop()


def _meminfo(name: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(name)


def test_metrics_address_binds_the_metrics_port_apart(tmp_path: Path, log_dir: Path) -> None:
    """--metrics-address: the metrics port listens there, not on the HTTP address."""
    repo = tmp_path / "models"
    add_model(repo / "add")
    server = start_private()
    gateway, url = start_gateway(repo, server.url, log_dir, "--metrics-address", "127.0.0.2")
    try:
        port = gateway.metrics_url.rsplit(":", 1)[1]
        reply = requests.get(f"http://127.0.0.2:{port}/metrics", timeout=10)
        assert reply.status_code == 200 and "nv_inference_count" in reply.text
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://{gateway.metrics_url}/metrics", timeout=10)
        assert requests.get(f"http://{url}/v2/health/live", timeout=10).status_code == 200
    finally:
        gateway.stop()
        server.stop()


# L0_metrics' identity_delay as a sequence model: each batch runs SEQUENCE_DELAY_S.
SEQUENCE_DELAY_S = 1.5
SEQUENCE_CONFIG = (
    IDENTITY_CONFIG.replace("max_batch_size: 0", "max_batch_size: 4")
    + ONE_INSTANCE
    + "sequence_batching { %s { max_queue_delay_microseconds: 100000, %s } }\n"
)
STRATEGIES = {
    "sequence_direct": SEQUENCE_CONFIG % ("direct", "minimum_slot_utilization: 1.0"),
    "sequence_oldest": SEQUENCE_CONFIG % ("oldest", "max_candidate_sequences: 4"),
}


@pytest.mark.parametrize("model", sorted(STRATEGIES))
def test_a_sequence_models_waiting_requests_are_pending(
    tmp_path: Path, log_dir: Path, model: str
) -> None:
    """L0_metrics' test_sequence_batch_scheduler_direct and _oldest: ten requests over four
    sequences (one each a batch, so three batches of 4, 4 and 2 run one after another);
    while the first runs six wait, then two, then none. They wait in their sequences'
    mailboxes, not in the model's queue, which the gauge counted alone (always 0); the
    head a batch runs is not waiting. Each scrape reads the gauge beside the requests
    answered so far, so the gauge is known for the time each batch ran."""
    repo = tmp_path / "models"
    python_model(repo / model, STRATEGIES[model], SLOW_MODEL.format(seconds=SEQUENCE_DELAY_S))
    server = start_private()
    worker = start_worker(repo, server.url, log_dir)
    gateway, url = start_gateway(repo, server.url, log_dir)
    metrics = f"http://{gateway.metrics_url}/metrics"

    def scrape() -> tuple[float, float]:
        text = requests.get(metrics, timeout=10).text
        done = sample(text, "nv_inference_request_success", model)
        return done, sample(text, "nv_inference_pending_request_count", model)

    try:
        wait_model_ready(url, model, 120, worker, gateway)
        assert scrape() == (0, 0)
        client = httpclient.InferenceServerClient(url, concurrency=10)
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.ones((1, 1), np.float32))
        sent = [
            client.async_infer(model, [x], sequence_id=k % 4 + 1, sequence_start=k < 4)
            for k in range(10)
        ]
        last: dict[float, float] = {}  # requests answered -> the gauge last seen then
        until = time.monotonic() + 4 * SEQUENCE_DELAY_S
        while last.get(10) != 0 and time.monotonic() < until:
            done, waiting_now = scrape()
            last[done] = waiting_now
            time.sleep(0.05)
        assert (last.get(0), last.get(4), last.get(8), last.get(10)) == (6, 2, 0, 0), last
        for s in sent:
            s.get_result()
    finally:
        gateway.stop()
        worker.stop()
        server.stop()
