"""Stateful models through the real path: Triton's sequence batcher on conch's queues.

Sequence models built here (an ONNX and a TorchScript running sum kept in Triton's
implicit state, with START/READY/CORRID controls; a Python running sum kept by the model
itself by correlation id) are served by real workers behind a real gateway, driven with
the stock tritonclient: interleaved sequences get what each gets alone; different
sequences batch together; Triton's errors; idle timeouts; a worker killed mid-sequence.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.wire import sequences
from conch.wire.work_owed import work_owed

from harness import (
    fresh_db,
    run_perf_analyzer,
    serving,
    start_worker,
    wait_model_ready,
    wait_until,
)
from models import (
    ensemble,
    ensemble_step,
    seq_onnx_accumulator,
    seq_python_accumulator,
    seq_torch_accumulator,
)

MODELS = ("seq_onnx", "seq_oldest", "seq_torch", "seq_python", "seq_idle", "seq_pa")
# Served by the failover test's own workers, which it stops and kills.
MOVING = ("seq_moving", "seq_pinned")
# Served by its own worker, which the test pauses.
REUSED = "seq_reused"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sequences") / "models"
    seq_onnx_accumulator(root / "seq_onnx", "direct", max_batch_size=8)
    seq_onnx_accumulator(
        root / "seq_oldest",
        "oldest",
        max_batch_size=8,
        max_candidate_sequences=8,
        max_queue_delay_us=2000,
    )
    seq_torch_accumulator(root / "seq_torch", "direct", max_batch_size=8)
    seq_python_accumulator(root / "seq_python", "direct", max_batch_size=8)
    seq_onnx_accumulator(root / "seq_idle", "direct", max_batch_size=4, idle_us=500_000)
    # OUTPUT alone, so perf_analyzer can check every answer against its validation data.
    seq_onnx_accumulator(root / "seq_pa", "direct", max_batch_size=8, echo_corrid=False)
    seq_onnx_accumulator(root / REUSED, "direct", max_batch_size=4)
    # Idle for a minute before they time out: long enough to outlive their workers.
    seq_onnx_accumulator(root / "seq_moving", "direct", max_batch_size=4, idle_us=60_000_000)
    seq_onnx_accumulator(root / "seq_pinned", "direct", max_batch_size=4, idle_us=60_000_000)
    ensemble(
        root,
        "ens_seq",
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]',
        [ensemble_step("seq_onnx", {"INPUT": "X"}, {"OUTPUT": "Y"})],
    )
    pinned = root / "seq_pinned" / "config.pbtxt"
    pinned.write_text(
        pinned.read_text()
        + 'parameters { key: "sequence_state_in_redis" value: { string_value: "false" } }\n'
    )
    return root


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 14)


@pytest.fixture(scope="module")
def stack(repo: Path, db: str, log_dir: Path) -> Iterator[tuple[str, str]]:
    """(the gateway's URL, its metrics port's)."""
    with serving(repo, db, log_dir, MODELS, threads=64) as (url, _, gateway):
        yield url, gateway.metrics_url


def _tensor_name(model: str, base: str) -> str:
    return f"{base}__0" if model == "seq_torch" else base


def step(
    client: httpclient.InferenceServerClient,
    model: str,
    seq_id: int | str,
    value: int,
    *,
    start: bool = False,
    end: bool = False,
) -> int:
    x = httpclient.InferInput(_tensor_name(model, "INPUT"), [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[value]], np.int32))
    out = client.infer(model, [x], sequence_id=seq_id, sequence_start=start, sequence_end=end)
    return int(out.as_numpy(_tensor_name(model, "OUTPUT"))[0, 0])


def run_sequence(url: str, model: str, seq_id: int | str, values: list[int]) -> list[int]:
    client = httpclient.InferenceServerClient(url)
    last = len(values) - 1
    return [
        step(client, model, seq_id, v, start=i == 0, end=i == last) for i, v in enumerate(values)
    ]


def expected(values: list[int]) -> list[int]:
    return list(np.cumsum(values))


@pytest.mark.parametrize("model", ["seq_onnx", "seq_oldest", "seq_torch", "seq_python"])
def test_interleaved_sequences_get_what_each_gets_alone(stack, model: str) -> None:
    url, _ = stack
    rng = np.random.default_rng(17)
    work = {1000 + k: [int(v) for v in rng.integers(-50, 50, size=12)] for k in range(12)}
    if model == "seq_python":  # string correlation ids too
        work.update({f"s-{k}": [int(v) for v in rng.integers(0, 9, size=6)] for k in range(4)})
    with ThreadPoolExecutor(len(work)) as pool:
        got = dict(
            zip(work, pool.map(lambda kv: run_sequence(url, model, *kv), work.items()), strict=True)
        )
    for seq_id, values in work.items():
        assert got[seq_id] == expected(values), seq_id
    alone = run_sequence(url, model, 77, work[1000])
    assert alone == got[1000]


@pytest.mark.parametrize("model", ["seq_onnx", "seq_oldest"])
def test_different_sequences_batch_together(stack, model: str) -> None:
    url, _ = stack
    client = httpclient.InferenceServerClient(url)
    before = client.get_inference_statistics(model)["model_stats"][0]
    work = {2000 + k: list(range(1, 21)) for k in range(8)}
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda kv: run_sequence(url, model, *kv), work.items()))
    assert got == [expected(list(range(1, 21)))] * 8
    after = client.get_inference_statistics(model)["model_stats"][0]
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 160
    assert executions < requests * 0.8, (requests, executions)  # rows shared executions


def test_a_sequence_models_errors_are_tritons(stack) -> None:
    url, _ = stack
    client = httpclient.InferenceServerClient(url)
    x = httpclient.InferInput("INPUT", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[1]], np.int32))
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        client.infer("seq_onnx", [x])
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("seq_onnx", [x], sequence_id=424242)
    two = httpclient.InferInput("INPUT", [2, 1], "INT32")
    two.set_data_from_numpy(np.array([[1], [2]], np.int32))
    with pytest.raises(InferenceServerException, match="batch-size 1"):
        client.infer("seq_onnx", [two], sequence_id=5, sequence_start=True)
    # An ended sequence is gone: continuing it is refused the same way.
    assert run_sequence(url, "seq_onnx", 31, [1, 2, 3]) == [1, 3, 6]
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(client, "seq_onnx", 31, 4)


def test_an_idle_sequence_times_out_with_tritons_error(stack, db: str) -> None:
    url, _ = stack
    client = httpclient.InferenceServerClient(url)
    assert step(client, "seq_idle", 9, 5, start=True) == 5
    assert step(client, "seq_idle", 9, 5) == 10
    r = redis.Redis.from_url(db)
    wait_until(
        lambda: not r.exists(sequences.record_key("seq_idle", sequences.token(9))),
        10,
        "the idle sequence to be ended",
    )
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(client, "seq_idle", 9, 5)
    assert step(client, "seq_idle", 9, 1, start=True) == 1  # a new START starts afresh


def test_live_sequences_count_in_the_work_owed(stack, db: str) -> None:
    url, _ = stack
    client = httpclient.InferenceServerClient(url)
    r = redis.Redis.from_url(db)
    base = work_owed(r, ["seq_onnx"])["seq_onnx"].sequences
    step(client, "seq_onnx", 555, 1, start=True)
    step(client, "seq_onnx", 556, 1, start=True)
    assert work_owed(r, ["seq_onnx"])["seq_onnx"].sequences == base + 2
    step(client, "seq_onnx", 555, 1, end=True)
    step(client, "seq_onnx", 556, 1, end=True)
    assert work_owed(r, ["seq_onnx"])["seq_onnx"].sequences == base


def test_sequences_move_when_their_worker_stops_or_dies(
    repo: Path, stack, db: str, log_dir
) -> None:
    """A SIGTERMed worker hands its sequences over without failing any; one SIGKILLed
    mid-sequence leaves them to another worker once its heartbeat expires; either way the
    sequence goes on from its state. A model whose state stays out of Redis fails its
    sequence's next request on the new worker, with the reason."""
    url, _ = stack
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    r = redis.Redis.from_url(db)

    def holder(model: str, seq_id: int) -> str:
        raw = r.hget(sequences.record_key(model, sequences.token(seq_id)), "worker")
        return raw.decode() if raw else ""

    def serving_worker() -> object:
        worker = start_worker(repo, db, log_dir, "--models", ",".join(MOVING))
        wait_until(
            lambda: any(str(worker.pid) in w.decode() for w in r.smembers("conch.workers")),
            60,
            "a worker to serve the moving models",
            worker,
        )
        return worker

    first = serving_worker()
    second = third = None
    try:
        wait_model_ready(url, "seq_moving", 60, first)
        assert step(client, "seq_moving", 7001, 10, start=True) == 10
        assert step(client, "seq_pinned", 7002, 10, start=True) == 10
        assert str(first.pid) in holder("seq_moving", 7001)
        second = serving_worker()
        first.stop()  # SIGTERM: its sequences are offered back as it stops
        started = time.monotonic()
        assert step(client, "seq_moving", 7001, 5) == 15
        assert time.monotonic() - started < 10
        assert str(second.pid) in holder("seq_moving", 7001)
        with pytest.raises(InferenceServerException, match="lost its state"):
            step(client, "seq_pinned", 7002, 5)
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            step(client, "seq_pinned", 7002, 5)  # the failed sequence is over
        third = serving_worker()
        second.send(signal.SIGKILL)
        assert step(client, "seq_moving", 7001, 7) == 22  # 10 + 5 + 7, on the third worker
        assert str(third.pid) in holder("seq_moving", 7001)
        assert step(client, "seq_moving", 7001, 1, end=True) == 23
    finally:
        for worker in (first, second, third):
            if worker is not None:
                worker.stop()


def test_a_grpc_stream_keeps_each_sequence_in_order(repo: Path, stack, db: str, log_dir) -> None:
    """Requests of several sequences sent down one stream without waiting: each sequence
    still runs in the order it was sent (the stream runs the others alongside)."""
    import queue

    import tritonclient.grpc as grpcclient

    from harness import start_grpc, wait_grpc_model_ready

    server, grpc_url = start_grpc(repo, db, log_dir)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        wait_grpc_model_ready(grpc_url, "seq_onnx", 60, server)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        rng = np.random.default_rng(3)
        work = {3000 + k: [int(v) for v in rng.integers(-9, 9, size=10)] for k in range(6)}
        for i in range(10):  # step i of every sequence, then step i + 1
            for seq_id, values in work.items():
                x = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                x.set_data_from_numpy(np.array([[values[i]]], np.int32))
                client.async_stream_infer(
                    "seq_onnx",
                    [x],
                    request_id=f"{seq_id}-{i}",
                    sequence_id=seq_id,
                    sequence_start=i == 0,
                    sequence_end=i == 9,
                )
        got: dict[str, int] = {}
        for _ in range(60):
            result, error = answers.get(timeout=60)
            assert error is None, error
            got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0, 0])
        for seq_id, values in work.items():
            assert [got[f"{seq_id}-{i}"] for i in range(10)] == expected(values), seq_id
    finally:
        client.stop_stream()
        client.close()
        server.stop()


def test_live_sequences_are_a_metric(stack) -> None:
    import re

    import requests

    url = stack[0]
    client = httpclient.InferenceServerClient(url)
    step(client, "seq_python", 4242, 1, start=True)
    text = requests.get(f"http://{stack[1]}/metrics").text
    live = re.search(r'^conch_sequences_live\{model="seq_python"\} (\d+)$', text, re.M)
    assert live is not None and int(live.group(1)) >= 1, text
    step(client, "seq_python", 4242, 1, end=True)


def test_a_sequence_model_as_an_ensemble_step_is_refused_with_the_reason(stack) -> None:
    client = httpclient.InferenceServerClient(stack[0])
    x = httpclient.InferInput("X", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[1]], np.int32))
    with pytest.raises(InferenceServerException, match="sequence model") as err:
        client.infer("ens_seq", [x], sequence_id=1, sequence_start=True)
    assert err.value.status() == "501"


@pytest.fixture(scope="module")
def grpc_url(repo: Path, db: str, log_dir: Path, stack) -> Iterator[str]:
    """A gRPC server beside the module's gateway (its worker serves the models)."""
    from harness import start_grpc, wait_grpc_model_ready

    server, url = start_grpc(repo, db, log_dir)
    try:
        wait_grpc_model_ready(url, "seq_pa", 60, server)
        yield url
    finally:
        server.stop()


# perf_analyzer's data streams: one running sum each, and the sum after every step as the
# validation data it checks each answer against. Sequences run 16 to 24 steps (length 20,
# 20% variation), so none runs past its stream's 24 steps.
PA_STREAMS, PA_STEPS = 6, 24


def _perf_analyzer_data(dest: Path) -> Path:
    rng = np.random.default_rng(1717)
    streams = [
        [int(v) for v in rng.integers(-1000, 1000, size=PA_STEPS)] for _ in range(PA_STREAMS)
    ]
    dest.write_text(
        json.dumps(
            {
                "data": [[{"INPUT": [v]} for v in values] for values in streams],
                "validation_data": [
                    [{"OUTPUT": [int(t)]} for t in expected(values)] for values in streams
                ],
            }
        )
    )
    return dest


@pytest.mark.parametrize(
    ("protocol", "ids", "extra"),
    [
        ("http", "1:41", ()),
        ("grpc", "41:81", ()),
        ("grpc", "81:121", ("--streaming",)),
    ],
    ids=["http", "grpc", "grpc-streaming"],
)
def test_perf_analyzer_drives_a_sequence_model(
    stack, grpc_url: str, db: str, tmp_path: Path, protocol: str, ids: str, extra: tuple[str, ...]
) -> None:
    """Issue 17's done-when: ``perf_analyzer --sequence-length --sequence-id-range`` against
    a sequence model, over HTTP, gRPC and a gRPC stream. perf_analyzer checks every answer
    against the running sums of its data (a wrong one, e.g. a step run out of order or on
    another sequence's state, fails it); the model's statistics count the requests, none
    failed, rows of different sequences shared executions, and no sequence is left live."""
    url = stack[0]
    client = httpclient.InferenceServerClient(url)
    before = client.get_inference_statistics("seq_pa")["model_stats"][0]
    out, throughputs = run_perf_analyzer(
        "-m", "seq_pa",
        "-u", grpc_url if protocol == "grpc" else url,
        "-i", protocol,
        "--concurrency-range", "8",
        "--sequence-length", "20",
        "--sequence-length-variation", "20",
        "--sequence-id-range", ids,
        "--input-data", str(_perf_analyzer_data(tmp_path / "sequences.json")),
        *extra,
    )  # fmt: skip
    assert f"read data for {PA_STREAMS} stream" in out, out[-3000:]
    assert len(throughputs) == 1 and throughputs[0] > 0, out[-3000:]
    sequences_run = [int(n) for n in re.findall(r"Sequence count: (\d+)", out)]
    assert sequences_run and all(n > 0 for n in sequences_run), out[-3000:]
    after = client.get_inference_statistics("seq_pa")["model_stats"][0]
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    client_requests = sum(int(n) for n in re.findall(r"Request count: (\d+)", out))
    assert requests >= max(client_requests, 16 * sum(sequences_run)), (requests, out[-3000:])
    assert executions < requests, (requests, executions)  # 8 sequences, rows batched
    fail = after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
    assert fail == 0
    # perf_analyzer ends every sequence it started (END on the last request sent).
    r = redis.Redis.from_url(db)
    wait_until(
        lambda: work_owed(r, ["seq_pa"])["seq_pa"].sequences == 0, 10, "no live sequence left"
    )


def test_a_sequence_id_started_again_before_its_end_ran(repo: Path, stack, db: str, log_dir):
    """perf_analyzer reuses a sequence id at once: a new START can wait in the mailbox
    behind the END of the id's last sequence. The slot goes on with the new sequence (it
    used to let go of the id while the record still named the slot, so the START waited
    forever); a request without START queued between them is refused as Triton does."""
    url = stack[0]
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    r = redis.Redis.from_url(db)
    mail = sequences.mail_key(REUSED, sequences.token(8001))
    worker = start_worker(repo, db, log_dir, "--models", REUSED)
    try:
        wait_model_ready(url, REUSED, 60, worker)
        assert step(client, REUSED, 8001, 5, start=True) == 5
        worker.send(signal.SIGSTOP)  # both requests wait in the mailbox, END first
        with ThreadPoolExecutor(3) as pool:

            def own_client(value: int, **flags: bool) -> int:  # a client is one thread's
                return step(httpclient.InferenceServerClient(url), REUSED, 8001, value, **flags)

            ended = pool.submit(own_client, 1, end=True)
            wait_until(lambda: r.llen(mail) == 1, 10, "the END in the mailbox")
            late = pool.submit(own_client, 9)  # no START: the ended sequence does not go on
            wait_until(lambda: r.llen(mail) == 2, 10, "a continuing request behind it")
            again = pool.submit(own_client, 7, start=True)
            wait_until(lambda: r.llen(mail) == 3, 10, "the new START behind them")
            worker.send(signal.SIGCONT)
            assert ended.result(timeout=30) == 6
            with pytest.raises(InferenceServerException, match="must specify the START flag"):
                late.result(timeout=30)
            assert again.result(timeout=30) == 7  # a new sum, from the initial state
        assert step(client, REUSED, 8001, 3, end=True) == 10
    finally:
        worker.send(signal.SIGCONT)
        worker.stop()
