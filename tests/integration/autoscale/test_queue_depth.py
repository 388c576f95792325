"""The work owed, three ways, against a hand count under load (issue 15's done-when).

A real worker serves a Python model whose executions wait for the test's word, so work
stays in flight for as long as the test looks at it: a batch executing, then messages a
worker has prefetched but not begun. Online requests at three priority levels, async
jobs and an offline batch job's lines wait behind them. At each stop, ``conch
queue-depth --json``, the gateway's ``GET /queue-depth`` and its ``/metrics`` must all
say what the test counts in Redis itself: the length of every priority sub-list, and
the entries of kombu's ``unacked`` hash whose routing key is the model's queue. The
batch jobs queue the same way (``--jobs``, ``jobs=1``, the ``conch_jobs_*`` gauges): one
job whose driver runs, one waiting behind it.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.http as httpclient

from conch.wire import broker, keys

from harness import Service, conch, fresh_db, start_gateway, start_worker, wait_model_ready
from harness import wait_until as _wait_until
from integration.jobs.test_jobs import submit, wait_done
from integration.jobs.test_offline import submit_batch
from models import add_model, gate_model, set_gate

MODEL = "gate"
DELAY_US = 20_000_000  # a batch short of 4 waits this long for more: prefetched, not run


@dataclass
class Stack:
    url: str
    metrics: str
    db: str
    allowed: Path
    started: Path
    worker: Service
    gateway: Service

    def wait_until(self, pred, timeout: float, what: str) -> None:
        _wait_until(pred, timeout, what, self.worker, self.gateway)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path, s3_endpoint: str) -> Iterator[Stack]:  # fmt: skip
    root = tmp_path_factory.mktemp("queue_depth")
    allowed, started = root / "allowed", root / "started"
    set_gate(allowed, 0)
    gate_model(root / "models" / MODEL, allowed, started, delay_us=DELAY_US)
    add_model(root / "models" / "idle")
    db = fresh_db(redis_url, 10)
    # One job driver: a second batch job waits on conch.jobs while the first runs.
    worker = start_worker(
        root / "models",
        db,
        log_dir,
        "--models",
        MODEL,
        "--job-concurrency",
        "1",
        env={"AWS_ENDPOINT_URL": s3_endpoint},
    )
    # The load below tells where each request waits, one message each: three requests
    # sent at once could otherwise go as one bundle, which a pop takes whole (none left
    # waiting). Bundles are counted in tests/integration/redis/test_bundles.py.
    gateway, url = start_gateway(
        root / "models", db, log_dir, "--request-timeout-secs", "120", "--bundle-requests=false"
    )
    try:
        wait_model_ready(url, MODEL, 90, worker, gateway)
        yield Stack(url, gateway.metrics_url, db, allowed, started, worker, gateway)
    finally:
        set_gate(allowed, 1_000_000)  # nothing left blocked when the worker stops
        gateway.stop()
        worker.stop()


def hand_count(db: str) -> tuple[dict[int, int], dict[int, int]]:
    """(waiting per priority step, in flight per priority step) of the model's requests,
    counted here: each sub-list's messages, and the unacked entries ([message, exchange,
    routing key]) for its queue by the priority their message carries, each message read
    for the requests it holds (a bundle holds several)."""
    client = redis.Redis.from_url(db)
    queue = broker.queue_name(MODEL)

    def requests(raw: bytes | str) -> int:
        return len(broker.decode(raw).payloads)

    steps = {
        step: sum(requests(raw) for raw in client.lrange(broker.priority_key(queue, step), 0, -1))
        for step in range(10)
    }
    held: dict[int, int] = {}
    for entry in client.hvals(keys.UNACKED):
        message, _, routing_key = json.loads(entry)
        if routing_key == queue:
            step = message["properties"]["priority"]
            held[step] = held.get(step, 0) + requests(json.dumps(message))
    return {s: n for s, n in steps.items() if n}, held


def jobs_hand_count(db: str) -> tuple[int, int]:
    """(waiting, in flight) of the batch jobs queue, counted here: its sub-lists' LLEN,
    and the unacked entries for conch.jobs."""
    client = redis.Redis.from_url(db)
    waiting = sum(client.llen(key) for key in broker.priority_keys(broker.JOBS_QUEUE))
    held = sum(1 for e in client.hvals(keys.UNACKED) if json.loads(e)[2] == broker.JOBS_QUEUE)
    return waiting, held


def jobs_three_ways(s: Stack) -> list[dict]:
    """The jobs entry from the CLI, the endpoint and the metrics; the totals of the first
    two hold it."""
    cli = subprocess.run(
        conch("queue-depth", "--redis-url", s.db, "--model", MODEL, "--jobs", "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    params = {"model": MODEL, "jobs": "1"}
    endpoint = requests.get(f"http://{s.metrics}/queue-depth", params=params, timeout=30)
    assert endpoint.status_code == 200, endpoint.text
    text = requests.get(f"http://{s.metrics}/metrics", timeout=30).text
    waiting, held = (
        int(re.search(rf"^{name} (\d+)$", text, re.M).group(1))
        for name in ("conch_jobs_waiting", "conch_jobs_in_flight")
    )
    seen = [json.loads(cli.stdout), endpoint.json()]
    for whole in seen:
        for k in ("owed", "waiting", "in_flight"):
            assert whole[k] == whole["models"][MODEL][k] + whole["jobs"][k], (k, whole)
    return [whole["jobs"] for whole in seen] + [
        {"owed": waiting + held, "waiting": waiting, "in_flight": held}
    ]


def assert_jobs_agree(s: Stack, waiting: int, in_flight: int) -> None:
    want = (waiting, in_flight)
    s.wait_until(lambda: jobs_hand_count(s.db) == want, 30, f"the jobs hand count to be {want}")
    seen = jobs_three_ways(s)
    assert jobs_hand_count(s.db) == want
    expected = {"owed": waiting + in_flight, "waiting": waiting, "in_flight": in_flight}
    assert seen == [expected] * 3, seen


def gauge(text: str, name: str, **labels: str) -> int:
    where = "".join(rf'(?=[^}}]*{k}="{re.escape(v)}")' for k, v in labels.items())
    m = re.search(rf"^{name}\{{{where}[^}}]*\}} (\d+)$", text, re.M)
    assert m, f"{name} {labels} not in:\n{text}"
    return int(m.group(1))


def three_ways(s: Stack) -> list[dict]:
    """The model's count from the CLI, the endpoint and the metrics, as the endpoint's
    per-model JSON (the metrics give no total: it is added up here)."""
    cli = subprocess.run(
        conch("queue-depth", "--redis-url", s.db, "--model", MODEL, "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    r = requests.get(f"http://{s.metrics}/queue-depth", params={"model": MODEL}, timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json", r.text
    text = requests.get(f"http://{s.metrics}/metrics", timeout=30).text
    by_class = {
        kind: gauge(text, "conch_queue_waiting", model=MODEL, priority_class=kind)
        for kind in ("online", "async", "offline")
    }
    held = {
        kind: gauge(text, "conch_queue_in_flight", model=MODEL, priority_class=kind)
        for kind in ("online", "async", "offline")
    }
    in_flight = sum(held.values())
    assert gauge(text, "nv_inference_pending_request_count", model=MODEL) == sum(by_class.values())
    metrics = {
        "owed": sum(by_class.values()) + in_flight,
        "waiting": sum(by_class.values()),
        "in_flight": in_flight,
        "waiting_by_class": by_class,
        "in_flight_by_class": held,
    }
    endpoint = r.json()
    assert {k: endpoint[k] for k in ("owed", "waiting", "in_flight")} == {
        k: endpoint["models"][MODEL][k] for k in ("owed", "waiting", "in_flight")
    }
    counted = [json.loads(cli.stdout)["models"][MODEL], endpoint["models"][MODEL]]
    # Where the model is resident (worker ids) is the CLI's and the endpoint's alone.
    where = [{k: c.pop(k) for k in ("resident_on", "standby_on")} for c in counted]
    assert where[0] == where[1] and where[0]["resident_on"], where
    return [*counted, metrics]


def by_class(steps: dict[int, int]) -> dict[str, int]:
    return {
        "online": sum(n for step, n in steps.items() if step < broker.ONLINE_STEPS),
        "async": steps.get(broker.PRIORITY_ASYNC, 0),
        "offline": steps.get(broker.PRIORITY_OFFLINE, 0),
    }


def assert_agree(s: Stack, steps: dict[int, int], held: dict[int, int]) -> None:
    """The hand count is what the load makes it, stays so while the three are read, and
    the three say the same."""
    want = (steps, held)
    s.wait_until(lambda: hand_count(s.db) == want, 30, f"the hand count to be {want}")
    seen = three_ways(s)
    assert hand_count(s.db) == want  # nothing moved while they were read
    waiting, in_flight = sum(steps.values()), sum(held.values())
    expected = {
        "owed": waiting + in_flight,
        "waiting": waiting,
        "in_flight": in_flight,
        "waiting_by_class": by_class(steps),
        "in_flight_by_class": by_class(held),
    }
    assert seen == [expected] * 3, seen


def infer(url: str, value: float, priority: int = 0) -> np.ndarray:
    x = np.full((1, 1), value, np.float32)
    i = httpclient.InferInput("X", [1, 1], "FP32")
    i.set_data_from_numpy(x)
    client = httpclient.InferenceServerClient(url, network_timeout=180)
    return client.infer(MODEL, [i], priority=priority).as_numpy("Y")


def test_cli_endpoint_and_metrics_agree_with_a_hand_count_under_load(stack: Stack, s3) -> None:
    s = stack
    pool = ThreadPoolExecutor(16)
    calls: dict[float, Future] = {}

    def send(values: range, priority: int = 0) -> None:
        for v in values:
            calls[float(v)] = pool.submit(infer, s.url, float(v), priority)

    try:
        # A batch of 4 at priority 1 runs, and waits for the gate: 4 in flight.
        send(range(0, 4), priority=1)
        assert_agree(s, {}, {0: 4})
        # Two more at priority 1 wait in their sub-list (step 0).
        send(range(4, 6), priority=1)
        assert_agree(s, {0: 2}, {0: 4})
        # The first batch finishes; the worker prefetched the two with its replies, and
        # holds them for more to fill a batch (its queue delay): in flight, not running.
        set_gate(s.allowed, 1)
        for v in range(4):
            np.testing.assert_array_equal(calls[float(v)].result(60), [[v]])
        assert_agree(s, {}, {0: 2})
        assert s.started.read_text() == "1"  # the two were never begun meanwhile
        # Three at the default level (2, step 1): two of them fill the held batch.
        send(range(10, 13))
        s.wait_until(lambda: s.started.read_text() == "2", 30, "the second batch to start")
        # Two at level 3, two async jobs, and an offline batch job's three lines, which its
        # driver packs into one request of three rows (line_packing): one message.
        send(range(20, 22), priority=3)
        jobs = [submit(s.url, MODEL, [_x(30 + k)]) for k in range(2)]
        bucket = f"qd-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        lines = [
            {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [40 + k]}]}
            for k in range(3)
        ]
        s3.put_object(
            Bucket=bucket,
            Key="in.jsonl",
            Body="".join(json.dumps(line) + "\n" for line in lines).encode(),
        )
        r = submit_batch(
            s.url, MODEL, {"input": f"s3://{bucket}/in.jsonl", "output": f"s3://{bucket}/out.jsonl"}
        )
        assert r.status_code == 202, r.text
        batch = r.json()["id"]
        assert_agree(
            s, {1: 1, 2: 2, broker.PRIORITY_ASYNC: 2, broker.PRIORITY_OFFLINE: 1}, {0: 2, 1: 2}
        )
        # Its driver runs (its lines wait above); a second batch job waits for a worker
        # (its worker runs one job driver: --job-concurrency 1).
        r = submit_batch(
            s.url,
            MODEL,
            {"input": f"s3://{bucket}/in.jsonl", "output": f"s3://{bucket}/out2.jsonl"},
        )
        assert r.status_code == 202, r.text
        second = r.json()["id"]
        assert_jobs_agree(s, 1, 1)
        # The human table says the same.
        table = subprocess.run(
            conch("queue-depth", "--redis-url", s.db),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.splitlines()
        assert table[0].split() == ["MODEL", "ONLINE", "ASYNC", "OFFLINE", "WAITING", "IN", "FLIGHT", "OWED"]  # fmt: skip
        assert table[1].split() == [MODEL, "3", "2", "1", "6", "4", "10"]

        # Let everything run: every request answered, and nothing left owed or leaked.
        set_gate(s.allowed, 1_000_000)
        for v, call in calls.items():
            np.testing.assert_array_equal(call.result(90), [[v]])
        for job in jobs:
            assert wait_done(s.url, job, timeout=90)["status"] == "SUCCESS"
        assert wait_done(s.url, batch, timeout=90)["status"] == "SUCCESS"
        assert wait_done(s.url, second, timeout=90)["status"] == "SUCCESS"
        assert_agree(s, {}, {})
        assert_jobs_agree(s, 0, 0)
        client = redis.Redis.from_url(s.db)
        assert client.scard(broker.in_flight_key(broker.queue_name(MODEL))) == 0
        assert client.scard(broker.in_flight_key(broker.JOBS_QUEUE)) == 0
    finally:
        set_gate(s.allowed, 1_000_000)
        pool.shutdown(wait=False, cancel_futures=True)


def _x(value: float) -> httpclient.InferInput:
    i = httpclient.InferInput("X", [1, 1], "FP32")
    i.set_data_from_numpy(np.full((1, 1), value, np.float32))
    return i


def test_the_endpoint_lists_every_model_and_refuses_what_it_cannot_count(stack: Stack) -> None:
    base = f"http://{stack.metrics}/queue-depth"
    every = requests.get(base, timeout=30).json()
    assert sorted(every["models"]) == ["gate", "idle"]
    assert every["owed"] == sum(m["owed"] for m in every["models"].values())
    both = requests.get(base, params=[("model", "idle"), ("model", MODEL)], timeout=30).json()
    assert list(both["models"]) == ["idle", MODEL]
    assert "jobs" not in both
    for off in ("0", "false"):
        assert "jobs" not in requests.get(base, params={"jobs": off}, timeout=30).json()
    with_jobs = requests.get(base, params={"jobs": "1"}, timeout=30).json()
    assert sorted(with_jobs["models"]) == ["gate", "idle"]  # every model, and the jobs
    assert set(with_jobs["jobs"]) == {"owed", "waiting", "in_flight"}
    for params, status, says in (
        ({"model": "nope"}, 404, "unknown model"),
        ({"model": "a/b"}, 400, "not a model name"),
        ({"model": ""}, 400, "not a model name"),
        ({"models": MODEL}, 400, "unknown query parameter"),
        ({"model": MODEL, "jobs": "yes"}, 400, "'jobs' must be given once, as 1 or 0"),
        ([("jobs", "1"), ("jobs", "1")], 400, "'jobs' must be given once"),
    ):
        r = requests.get(base, params=params, timeout=30)
        assert r.status_code == status and says in r.json()["error"], (params, r.text)
    assert requests.post(base, timeout=30).status_code == 405
    # The CLI counts any name it is given; a malformed one is refused.
    bad = subprocess.run(
        conch("queue-depth", "--redis-url", stack.db, "--model", "a/b"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "not a model name" in bad.stderr
