"""Ensembles through the real path: the sentiment pipeline, parallel branches, batching
with direct traffic, load-time validation, and error and deadline propagation."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.wire import worker_reports

from harness import (
    ROOT,
    run_perf_analyzer,
    start_gateway,
    start_worker,
    wait_model_ready,
    wait_until,
)
from models import add_model, ensemble, ensemble_step

PIPELINE = ("preprocessing", "classifier", "postprocessing", "sentiment")
SERVED = (
    "preprocessing",
    "classifier",
    "postprocessing",
    "slow_a",
    "slow_b",
    "add_window",
    "add",
    "flat_inc",
    "add_labelled",
    "add_probe",
    "optional_sum",
)


INCREMENT = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(%s)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]
            )
            for r in requests
        ]
"""


def increment(path: Path, *, seconds: float, max_batch_size: int = 8) -> None:
    """Y = X + 1 on FP32 [4], after ``seconds``: a Python model."""
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.py").write_text(INCREMENT % seconds)
    (path / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )


# Y = X (+ Z when the request has it): Z is optional.
OPTIONAL_SUM = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            y = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            z = pb_utils.get_input_tensor_by_name(r, "Z")
            if z is not None:
                y = y + z.as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
"""
XZ = (
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }, '
    '{ name: "Z" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]'
)
Y4 = 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]'


def optional_sum(path: Path) -> None:
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.py").write_text(OPTIONAL_SUM)
    (path / "config.pbtxt").write_text(f'backend: "python"\nmax_batch_size: 8\n{XZ}\n{Y4}\n')


LABELS = ["north", "east", "south", "west"]


def add_labelled(path: Path) -> None:
    """``add`` whose output names its four classes (label_filename)."""
    add_model(path)
    config = path / "config.pbtxt"
    plain = 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    assert plain in config.read_text()
    labelled = plain.replace("dims: [ 4 ]", 'dims: [ 4 ] label_filename: "labels.txt"')
    config.write_text(config.read_text().replace(plain, labelled))
    (path / "labels.txt").write_text("\n".join(LABELS) + "\n")


X4 = 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]'
IN4 = 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]'
AB = 'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]'
OUT = 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ensemble") / "models"
    root.mkdir()
    for name in PIPELINE:
        shutil.copytree(ROOT / "functions" / name, root / name)
    for name in ("slow_a", "slow_b"):  # they wait, not compute: parallelism needs no spare core
        increment(root / name, seconds=0.5)
    add_model(root / "add_window", max_batch_size=16, delay_us=400_000)
    add_model(root / "add")
    add_model(root / "add_unserved")
    add_model(root / "add_probe")
    increment(root / "flat_inc", seconds=0, max_batch_size=0)  # no batch dimension
    add_labelled(root / "add_labelled")
    optional_sum(root / "optional_sum")
    ensemble(
        root,
        "ens_optional",
        XZ + "\n" + Y4,
        [ensemble_step("optional_sum", {"X": "X", "Z": "Z"}, {"Y": "Y"})],
    )
    # A non-batching step between batching ones, in a batching and a non-batching ensemble.
    mixed = [
        ensemble_step("flat_inc", {"X": "IN"}, {"Y": "t"}),
        ensemble_step("add", {"A": "t", "B": "t"}, {"OUT": "OUT"}),
    ]
    ensemble(root, "ens_mixed", IN4 + "\n" + OUT, mixed)
    ensemble(root, "ens_flat", IN4 + "\n" + OUT, mixed, max_batch_size=0)
    ensemble(
        root,
        "ens_labelled",
        AB + "\n" + OUT,
        [ensemble_step("add_labelled", {"A": "A", "B": "B"}, {"OUT": "OUT"})],
    )
    ensemble(
        root,
        "ens_pruned",
        AB + '\noutput [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "PROBED" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        [
            ensemble_step("add", {"A": "A", "B": "B"}, {"OUT": "SUM"}),
            ensemble_step("add_probe", {"A": "A", "B": "B"}, {"OUT": "PROBED"}),
        ],
    )
    ensemble(
        root,
        "ens_parallel",
        X4 + '\noutput [ { name: "YA" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "YB" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        [
            ensemble_step("slow_a", {"X": "X"}, {"Y": "YA"}),
            ensemble_step("slow_b", {"X": "X"}, {"Y": "YB"}),
        ],
    )
    ensemble(
        root,
        "ens_add",
        AB + "\n" + OUT,
        [ensemble_step("add_window", {"A": "A", "B": "B"}, {"OUT": "OUT"})],
    )
    ensemble(
        root,
        "ens_unserved",
        AB + "\n" + OUT,
        [ensemble_step("add_unserved", {"A": "A", "B": "B"}, {"OUT": "OUT"})],
    )
    # Broken at load time, each in its own way.
    ensemble(
        root, "bad_unknown", AB + "\n" + OUT, [ensemble_step("nope", {"A": "A"}, {"OUT": "OUT"})]
    )
    ensemble(
        root, "bad_unmapped", AB + "\n" + OUT, [ensemble_step("add", {"A": "A"}, {"OUT": "OUT"})]
    )
    ensemble(
        root,
        "bad_twice",
        AB + "\n" + OUT,
        [
            ensemble_step("add", {"A": "A", "B": "B"}, {"OUT": "OUT"}),
            ensemble_step("add", {"A": "B", "B": "A"}, {"OUT": "OUT"}),
        ],
    )
    ensemble(
        root,
        "bad_nothing",
        AB + "\n" + OUT,
        [ensemble_step("add", {"A": "A", "B": "ghost"}, {"OUT": "OUT"})],
    )
    ensemble(
        root,
        "bad_cycle",
        AB + "\n" + OUT,
        [
            ensemble_step("add", {"A": "A", "B": "t2"}, {"OUT": "t1"}),
            ensemble_step("add", {"A": "t1", "B": "B"}, {"OUT": "t2"}),
            ensemble_step("add", {"A": "t1", "B": "t2"}, {"OUT": "OUT"}),
        ],
    )
    ensemble(
        root,
        "bad_dtype",
        'input [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n' + OUT,
        [ensemble_step("add", {"A": "A", "B": "B"}, {"OUT": "OUT"})],
    )
    ensemble(
        root,
        "bad_shape",
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 5 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n' + OUT,
        [ensemble_step("add", {"A": "A", "B": "B"}, {"OUT": "OUT"})],
    )
    return root


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    url = redis_url.rsplit("/", 1)[0] + "/6"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="module")
def url(repo: Path, db: str, log_dir: Path) -> Iterator[str]:
    worker = start_worker(repo, db, log_dir, "--models", ",".join(SERVED))
    gateway, url = start_gateway(repo, db, log_dir, workers=2, threads=32)
    try:
        for m in (
            "sentiment",
            "ens_parallel",
            "ens_add",
            "ens_mixed",
            "ens_labelled",
            "ens_pruned",
        ):
            wait_model_ready(url, m, 90, worker, gateway)
        yield url
    finally:
        gateway.stop()
        worker.stop()


def client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url, network_timeout=60)


def text_input(texts: list[bytes]) -> httpclient.InferInput:
    i = httpclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    i.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
    return i


def fp32(name: str, a: np.ndarray) -> httpclient.InferInput:
    i = httpclient.InferInput(name, list(a.shape), "FP32")
    i.set_data_from_numpy(a)
    return i


TEXTS = [
    b"I love this great movie",
    b"the food was terrible and the service awful",
    b"it is a book",
    "caf\u00e9 was not bad".encode(),
]


def test_sentiment_equals_the_three_models_called_in_turn(url: str) -> None:
    c = client(url)
    direct_pre = c.infer("preprocessing", [text_input(TEXTS)])
    ids, mask = direct_pre.as_numpy("INPUT_IDS"), direct_pre.as_numpy("ATTENTION_MASK")
    logits = c.infer("classifier", _ids_inputs(ids, mask)).as_numpy("LOGITS")
    post = c.infer("postprocessing", [fp32("LOGITS", logits)])
    whole = c.infer("sentiment", [text_input(TEXTS)])
    assert whole.as_numpy("LABEL").tolist() == post.as_numpy("LABEL").tolist()
    np.testing.assert_array_equal(whole.as_numpy("SCORE"), post.as_numpy("SCORE"))
    labels = [x.decode() if isinstance(x, bytes) else x for x in whole.as_numpy("LABEL").ravel()]
    assert labels[:3] == ["positive", "negative", "neutral"]


def _ids_inputs(ids: np.ndarray, mask: np.ndarray) -> list[httpclient.InferInput]:
    out = []
    for name, a in (("INPUT_IDS", ids), ("ATTENTION_MASK", mask)):
        i = httpclient.InferInput(name, list(a.shape), "INT64")
        i.set_data_from_numpy(a)
        out.append(i)
    return out


def test_ensemble_metadata_and_config(url: str) -> None:
    c = client(url)
    meta = c.get_model_metadata("sentiment")
    assert meta["platform"] == "ensemble" and meta["inputs"][0]["datatype"] == "BYTES"
    cfg = c.get_model_config("sentiment")
    assert [s["model_name"] for s in cfg["ensemble_scheduling"]["step"]] == [
        "preprocessing",
        "classifier",
        "postprocessing",
    ]
    assert all(isinstance(s["model_version"], int) for s in cfg["ensemble_scheduling"]["step"])
    assert "instance_group" not in cfg or not cfg["instance_group"]
    assert cfg["model_transaction_policy"] == {"decoupled": False}  # as Triton completes it
    assert c.is_model_ready("sentiment")


def test_independent_steps_run_in_parallel(url: str) -> None:
    c = client(url)
    x = np.ones((1, 4), np.float32)
    started = time.monotonic()
    c.infer("slow_a", [fp32("X", x)])
    one = time.monotonic() - started  # one branch on its own
    started = time.monotonic()
    r = c.infer("ens_parallel", [fp32("X", x)])
    both = time.monotonic() - started
    np.testing.assert_array_equal(r.as_numpy("YA"), x + 1)
    np.testing.assert_array_equal(r.as_numpy("YB"), x + 1)
    assert one >= 0.5
    assert both < 1.5 * one, (
        f"two branches took {both:.2f} s against {one:.2f} s for one: not in parallel"
    )


def counters(db: str, model: str) -> dict[str, int]:
    total = {"executions": 0, "requests": 0}
    for report in worker_reports.snapshot(redis.Redis.from_url(db)):
        for k in total:
            total[k] += report.get("stats", {}).get(model, {}).get(k, 0)
    return total


def test_steps_batch_with_direct_traffic(url: str, db: str) -> None:
    before = counters(db, "add_window")
    a = np.full((1, 4), 2.0, np.float32)
    barrier = threading.Barrier(2)

    def direct() -> np.ndarray:
        barrier.wait()
        return client(url).infer("add_window", [fp32("A", a), fp32("B", a)]).as_numpy("OUT")

    def through_ensemble() -> np.ndarray:
        barrier.wait()
        return client(url).infer("ens_add", [fp32("A", a), fp32("B", a)]).as_numpy("OUT")

    with ThreadPoolExecutor(2) as pool:
        results = [f.result() for f in (pool.submit(direct), pool.submit(through_ensemble))]
    for r in results:
        np.testing.assert_array_equal(r, a + a)
    # The 400 ms queue window gathered both requests into one execution.
    wait_until(
        lambda: counters(db, "add_window")["requests"] >= before["requests"] + 2, 10, "counters"
    )
    after = counters(db, "add_window")
    assert after["requests"] - before["requests"] == 2
    assert after["executions"] - before["executions"] == 1


def test_batching_and_non_batching_steps_mix_as_in_triton(url: str) -> None:
    c = client(url)
    x = np.arange(4, dtype=np.float32)
    # A batch of one loses its batch dimension into flat_inc and gets it back into add.
    got = c.infer("ens_mixed", [fp32("IN", x.reshape(1, 4))]).as_numpy("OUT")
    np.testing.assert_array_equal(got, (2 * (x + 1)).reshape(1, 4))
    # A non-batching ensemble: add's batch of one is stripped from the ensemble's output.
    got = c.infer("ens_flat", [fp32("IN", x)]).as_numpy("OUT")
    np.testing.assert_array_equal(got, 2 * (x + 1))
    # A batch of two cannot go through a model that takes one [4]: its own check says so.
    with pytest.raises(InferenceServerException) as exc:
        c.infer("ens_mixed", [fp32("IN", np.stack([x, x]))])
    assert exc.value.status() == "400" and "flat_inc" in str(exc.value)


def test_classification_through_an_ensemble_uses_the_step_models_labels(url: str) -> None:
    c = client(url)
    a = np.array([[0.0, 3.0, 1.0, 2.0]], np.float32)
    wanted = [httpclient.InferRequestedOutput("OUT", class_count=2)]
    classes = []
    for model in ("add_labelled", "ens_labelled"):
        result = c.infer(model, [fp32("A", a), fp32("B", a)], outputs=wanted)
        classes.append([v.decode() for v in result.as_numpy("OUT").ravel()])
    assert classes[1] == ["6.000000:1:east", "4.000000:3:west"]
    assert classes[0] == classes[1]  # as the step model itself answers


def test_an_optional_input_left_out_is_left_out_of_its_step(url: str) -> None:
    """As in Triton: the step gets the request without it (its input is optional too)."""
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    c = client(url)
    only_x = c.infer("ens_optional", [fp32("X", x)]).as_numpy("Y")
    np.testing.assert_array_equal(only_x, x)
    both = c.infer("ens_optional", [fp32("X", x), fp32("Z", x * 10)]).as_numpy("Y")
    np.testing.assert_array_equal(both, x * 11)


def statistic(url: str, model: str) -> int:
    stats = client(url).get_inference_statistics(model)["model_stats"]
    return sum(s["inference_count"] for s in stats)


def test_only_the_steps_the_requested_outputs_need_run(url: str) -> None:
    # Statistics are written with each step's reply, so they are final once the
    # ensemble has answered.
    c = client(url)
    a = np.ones((1, 4), np.float32)
    before = statistic(url, "add_probe")
    only_sum = [httpclient.InferRequestedOutput("SUM")]
    result = c.infer("ens_pruned", [fp32("A", a), fp32("B", a)], outputs=only_sum)
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + a)
    assert result.as_numpy("PROBED") is None
    assert statistic(url, "add_probe") == before  # PROBED's step never ran
    result = c.infer("ens_pruned", [fp32("A", a), fp32("B", a)])  # no list: every output
    np.testing.assert_array_equal(result.as_numpy("PROBED"), a + a)
    assert statistic(url, "add_probe") == before + 1


@pytest.mark.parametrize(
    ("model", "fragment"),
    [
        ("bad_unknown", "model 'nope', which is not in the repository"),
        ("bad_unmapped", "input 'B' of model 'add' is not mapped"),
        ("bad_twice", "tensor 'OUT' is produced twice"),
        ("bad_nothing", "tensor 'ghost'"),
        ("bad_cycle", "cycle"),
        ("bad_dtype", "INT32"),
        ("bad_shape", "[-1, 5]"),
    ],
)
def test_load_time_validation(url: str, model: str, fragment: str) -> None:
    rows = {m["name"]: m for m in client(url).get_model_repository_index()}
    assert rows[model]["state"] == "UNAVAILABLE"
    assert fragment in rows[model]["reason"], rows[model]["reason"]
    with pytest.raises(InferenceServerException, match="not available"):
        a = np.ones((1, 4), np.float32)
        client(url).infer(model, [fp32("A", a), fp32("B", a)])


def test_a_failing_step_fails_the_request_with_its_error_and_model(url: str) -> None:
    with pytest.raises(InferenceServerException) as exc:
        client(url).infer("sentiment", [text_input([b"\xff\xfe not utf-8"])])
    assert exc.value.status() == "400"
    assert "preprocessing" in str(exc.value) and "UTF-8" in str(exc.value)


def test_the_outer_deadline_bounds_every_step(url: str) -> None:
    a = np.ones((1, 4), np.float32)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as exc:  # no worker serves add_unserved
        client(url).infer("ens_unserved", [fp32("A", a), fp32("B", a)], timeout=300_000)
    assert time.monotonic() - started < 3
    assert exc.value.status() == "503"
    assert "add_unserved" in str(exc.value) and "timeout" in str(exc.value).lower()


def test_perf_analyzer_runs_the_sentiment_ensemble(url: str, tmp_path: Path) -> None:
    data = tmp_path / "text.json"
    data.write_text('{"data": [{"TEXT": ["a great film"]}, {"TEXT": ["awful service"]}]}')
    out, throughputs = run_perf_analyzer(
        "-m",
        "sentiment",
        "-u",
        url,
        "-i",
        "http",
        "--concurrency-range",
        "2",
        "--input-data",
        str(data),
    )
    assert throughputs and throughputs[0] > 0, out[-3000:]
    # With statistics advertised, perf_analyzer reads the ensemble's and its steps' stats.
    assert "Server: " in out and "Composing models:" in out, out[-3000:]


def test_an_async_job_on_an_ensemble_runs_its_graph_on_a_worker(url: str, db: str) -> None:
    """The job answers what infer answers; its steps wait at the async step; the ensemble
    counts it; a failing step fails the job with the step's error."""
    from integration.jobs.test_jobs import result, submit, wait_done

    a, b = np.ones((2, 4), np.float32), np.full((2, 4), 2.0, np.float32)
    before = statistic(url, "ens_add")
    job = submit(url, "ens_add", [fp32("A", a), fp32("B", b)])
    assert wait_done(url, job)["status"] == "SUCCESS"
    np.testing.assert_array_equal(result(url, job).as_numpy("OUT"), a + b)
    assert statistic(url, "ens_add") == before + 2
    bad = submit(url, "sentiment", [text_input([b"\xff\xfe not utf-8"])])
    status = wait_done(url, bad)
    assert status["status"] == "FAILURE"
    assert "preprocessing" in status["error"] and "UTF-8" in status["error"], status


def test_a_cancelled_async_job_on_an_ensemble_never_runs(url: str) -> None:
    """Jobs beyond what the worker's drivers run at once (--job-concurrency, 4) wait on
    conch.jobs; one cancelled there never sends a step."""
    from integration.jobs.test_jobs import submit, wait_done

    x = np.zeros((1, 4), np.float32)
    before = statistic(url, "slow_a")
    jobs = [submit(url, "ens_parallel", [fp32("X", x)]) for _ in range(9)]
    r = requests.delete(f"http://{url}/v2/jobs/{jobs[-1]}")
    assert r.status_code == 200 and r.json()["status"] == "REVOKED", r.text
    for job in jobs[:-1]:
        assert wait_done(url, job, timeout=30)["status"] == "SUCCESS"
    time.sleep(0.5)
    assert statistic(url, "slow_a") == before + 8  # the cancelled job sent no step
    assert requests.get(f"http://{url}/v2/jobs/{jobs[-1]}").json()["status"] == "REVOKED"
