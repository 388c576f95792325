"""``conch.Server``, the in-process API, in both modes, on the shipped models.

Embedded (no Redis, no other process) and connected (a real Redis and a real worker) must
answer exactly as the HTTP gateway does, which the stock tritonclient drives here beside
them: the same outputs, datatypes and errors. Embedded mode also runs its models' dynamic
batching, ensembles and BLS in the process, and loads and unloads models explicitly.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

import conch
from conch.core.errors import ConchError, InvalidArgument, StartFailed, Unavailable
from conch.settings import Settings

from harness import ROOT, fresh_db, serving
from models import add_model, cancel_watcher_model, python_model, watched

FUNCTIONS = ROOT / "functions"
RNG = np.random.default_rng(7)


def _text(*rows: str) -> np.ndarray:
    return np.array([[r.encode()] for r in rows], dtype=np.object_)


# One request for each shipped model that answers once: its inputs by name.
SAMPLES: dict[str, dict[str, np.ndarray]] = {
    "mlp": {"INPUT0": RNG.standard_normal((3, 64)).astype(np.float32)},
    "mlp_autocomplete": {
        "x": RNG.standard_normal((2, 8)).astype(np.float32),
        "scale": np.array([[2.0], [0.5]], np.float32),
    },
    "tiny_cnn": {"INPUT__0": RNG.standard_normal((2, 1, 8, 8)).astype(np.float32)},
    "add_sub": {
        "INPUT0": RNG.standard_normal((2, 4)).astype(np.float32),
        "INPUT1": RNG.standard_normal((2, 4)).astype(np.float32),
    },
    "classifier": {
        "INPUT_IDS": RNG.integers(0, 50, (2, 32)).astype(np.int64),
        "ATTENTION_MASK": np.ones((2, 32), np.int64),
    },
    "sentiment": {"TEXT": _text("I love this", "this is not good at all")},  # an ensemble
    "text_sentiment": {"TEXT": _text("really great", "bad")},
    "text_embedding": {"TEXT": _text("queues and workers", "Grüße aus 東京")},  # an ensemble
    "breast_cancer_xgb": {"input__0": RNG.standard_normal((4, 30)).astype(np.float32)},
}
MODELS = (
    *SAMPLES,
    "preprocessing",
    "postprocessing",
    "text_embedding_tokenizer",
    "text_embedding_encoder",
    "text_embedding_pooling",
    "text_embedding_passages",
)
PASSAGES = {
    "TEXT": np.array(
        [" ".join(f"Sentence {i} is about queues, workers and tensors." for i in range(60))],
        dtype=np.object_,
    )
}


def _built(model: str) -> bool:
    """Whether a model's build output is there (``make functions`` writes them)."""
    files = {
        "breast_cancer_xgb": FUNCTIONS / "breast_cancer_xgb" / "1" / "xgboost.ubj",
        "text_embedding": FUNCTIONS / "text_embedding_encoder" / "1" / "model.onnx",
    }
    return files.get(model, FUNCTIONS).exists()


def _http(url: str, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(url)
    given = []
    for name, arr in inputs.items():
        datatype = "BYTES" if arr.dtype == np.object_ else np_to_triton_dtype(arr.dtype)
        tensor = httpclient.InferInput(name, list(arr.shape), datatype)
        tensor.set_data_from_numpy(arr, binary_data=True)
        given.append(tensor)
    result = client.infer(model, given)
    names = [o["name"] for o in client.get_model_metadata(model)["outputs"]]
    return {n: result.as_numpy(n) for n in names}


def _one(model: conch.Model, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    responses = list(model.infer(inputs))
    assert len(responses) == 1 and responses[0].final
    return responses[0].outputs


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, name
        if arr.dtype.kind == "f":  # the same model in another process: equal to the ulp
            np.testing.assert_allclose(got[name], arr, rtol=1e-6, atol=1e-7, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], arr, err_msg=name)


@pytest.fixture(scope="module")
def embedded() -> Iterator[conch.Server]:
    with conch.Server(FUNCTIONS) as server:
        yield server


@pytest.fixture(scope="module")
def fleet(redis_url: str, log_dir: Path) -> Iterator[tuple[str, str]]:
    """A worker and a gateway serving functions/: (gateway URL, Redis URL)."""
    db = fresh_db(redis_url, 9)
    with serving(FUNCTIONS, db, log_dir, MODELS) as (url, _, _):
        yield url, db


@pytest.fixture(scope="module")
def connected(fleet: tuple[str, str]) -> Iterator[conch.Server]:
    with conch.Server(FUNCTIONS, redis_url=fleet[1]).start(wait_until_ready=True) as server:
        yield server


@pytest.mark.parametrize("model", sorted(SAMPLES))
def test_both_modes_answer_as_http_does(
    model: str, embedded: conch.Server, connected: conch.Server, fleet: tuple[str, str]
) -> None:
    """Every shipped model that answers once, ensembles included: the embedded server,
    the connected one and the gateway over HTTP give the same outputs and datatypes."""
    if not _built(model):
        pytest.skip(f"{model}'s build output is missing: run make functions")
    want = _http(fleet[0], model, SAMPLES[model])
    _same(_one(embedded.model(model), SAMPLES[model]), want)
    _same(_one(connected.model(model), SAMPLES[model]), want)


def test_a_decoupled_model_streams_its_responses_in_both_modes(
    embedded: conch.Server, connected: conch.Server
) -> None:
    """text_embedding_passages (decoupled, calling text_embedding through BLS) streams
    the same passages, in order, the last one final, embedded and through the fleet."""
    if not _built("text_embedding"):
        pytest.skip("text_embedding's build output is missing: run make functions")
    here = list(embedded.model("text_embedding_passages").infer(PASSAGES))
    there = list(connected.model("text_embedding_passages").infer(PASSAGES))
    assert len(here) == len(there) > 2
    assert [r.final for r in here] == [False] * (len(here) - 1) + [True]
    for a, b in zip(here, there, strict=True):
        assert int(a.outputs["INDEX"][0]) == int(b.outputs["INDEX"][0])
        _same(a.outputs, b.outputs)


def test_a_stopped_connected_server_leaves_nothing_running(fleet: tuple[str, str]) -> None:
    """An application that stops its connected server keeps no thread of it (reply
    listener, leases, followers) polling the fleet's Redis."""
    before = set(threading.enumerate())
    with conch.Server(FUNCTIONS, redis_url=fleet[1]).start(wait_until_ready=True) as server:
        _one(server.model("mlp"), SAMPLES["mlp"])
        assert len(list(server.model("text_embedding_passages").infer(PASSAGES))) > 2
    left = [t.name for t in threading.enumerate() if t not in before]
    assert left == []


def test_models_is_the_gateways_index_by_name_and_version(
    connected: conch.Server, fleet: tuple[str, str]
) -> None:
    """``models()`` in tritonserver's form holds what the gateway's repository index says."""
    rows = httpclient.InferenceServerClient(fleet[0]).get_model_repository_index()
    want = {(r["name"], int(r.get("version") or -1)): r.get("state") for r in rows}
    index = connected.models()
    assert {key: model.state for key, model in index.items()} == want
    assert index[("mlp", 1)].state == "READY" and index[("mlp", 1)].version == 1
    ready = connected.models(exclude_not_ready=True)
    assert set(ready) == {key for key, state in want.items() if state == "READY"}


def test_errors_are_the_gateways(embedded: conch.Server, fleet: tuple[str, str]) -> None:
    """A bad request raises what the gateway answers over HTTP (its 400 and text), before
    anything runs; an unknown model likewise."""
    bad = {"INPUT0": np.ones((2, 63), np.float32)}
    with pytest.raises(InferenceServerException) as http:
        _http(fleet[0], "mlp", bad)
    with pytest.raises(InvalidArgument) as here:
        embedded.model("mlp").infer(bad)
    assert here.value.status == 400 and here.value.message in http.value.message()
    with pytest.raises(InvalidArgument, match="Request for unknown model: 'nope' is not found"):
        embedded.model("nope").infer(bad)
    with pytest.raises(InvalidArgument, match="unexpected inference input 'X'"):
        embedded.model("mlp").infer({"X": np.ones((1, 64), np.float32)})


def test_metadata_config_readiness_and_statistics(embedded: conch.Server) -> None:
    mlp = embedded.model("mlp")
    assert mlp.ready() and embedded.ready() and embedded.live()
    assert mlp.metadata()["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}]
    assert mlp.config()["max_batch_size"] == 64
    before = mlp.statistics()["model_stats"][0]
    _one(mlp, {"INPUT0": np.ones((5, 64), np.float32)})
    after = mlp.statistics()["model_stats"][0]
    assert after["inference_count"] == before["inference_count"] + 5
    assert after["inference_stats"]["success"]["count"] == (
        before["inference_stats"]["success"]["count"] + 1
    )
    assert not embedded.model("mlp", version=7).ready()


def test_async_infer(embedded: conch.Server) -> None:
    x = np.ones((1, 64), np.float32)

    async def run() -> list[conch.InferenceResponse]:
        return [r async for r in embedded.model("mlp").async_infer({"INPUT0": x})]

    got = asyncio.run(run())
    assert len(got) == 1
    _same(got[0].outputs, _one(embedded.model("mlp"), {"INPUT0": x}))


def test_embedded_batches_requests_dynamically(tmp_path: Path) -> None:
    """Six requests sent at once to a model that waits up to 200 ms for more run as fewer
    executions, batched as the model's dynamic_batching says."""
    add_model(tmp_path / "add", delay_us=200_000)
    with conch.Server(tmp_path) as server:
        model = server.model("add")
        results: list[np.ndarray] = [np.empty(0)] * 6
        go = threading.Barrier(6)

        def call(k: int) -> None:
            a = np.full((1, 4), k, np.float32)
            go.wait()
            results[k] = _one(model, {"A": a, "B": a})["OUT"]

        threads = [threading.Thread(target=call, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for k in range(6):  # each caller got its own row back
            np.testing.assert_array_equal(results[k], np.full((1, 4), 2 * k, np.float32))
        stats = model.statistics()["model_stats"][0]
        assert stats["inference_count"] == 6
        assert stats["execution_count"] < 6
        assert max(b["batch_size"] for b in stats["batch_stats"]) > 1


def test_a_cancelled_request_never_runs_and_tensors_come_as_dlpack(tmp_path: Path) -> None:
    """A request cancelled while it waits for its batch is dropped before it runs (counted
    as a failure, never executed); a torch tensor goes in and out without numpy in between."""
    import torch

    add_model(tmp_path / "add", delay_us=300_000)
    with conch.Server(tmp_path) as server:
        model = server.model("add")
        waiting = model.infer({"A": np.ones((1, 4), np.float32), "B": np.ones((1, 4), np.float32)})
        waiting.cancel()
        assert list(waiting) == []
        a = torch.arange(8, dtype=torch.float32).reshape(2, 4)
        out = next(iter(model.infer({"A": a, "B": a}))).outputs["OUT"]
        assert torch.equal(torch.from_dlpack(out), a * 2)
        stats = model.statistics()["model_stats"][0]
        assert stats["inference_stats"]["fail"]["count"] == 1
        assert stats["inference_count"] == 2 and stats["execution_count"] == 1


def test_a_request_cancelled_while_it_runs_is_cancelled_for_its_model(tmp_path: Path) -> None:
    """``ResponseIterator.cancel`` on a request a Python model is running: the model's
    request.is_cancelled() turns true. One instance: the first request runs in its
    caller's thread for 2 s, the second waits, then runs on the instance's thread, and is
    cancelled half a second in; the first is never seen as cancelled."""
    marks = tmp_path / "marks"
    cancel_watcher_model(tmp_path / "models" / "watcher", marks, instances=1)
    x = {"X": np.zeros(4, np.float32)}
    with conch.Server(tmp_path / "models") as server:
        model = server.model("watcher")
        first = threading.Thread(target=lambda: list(model.infer(x, request_id="stays")))
        first.start()
        threading.Event().wait(0.2)  # the first holds the instance
        gone = model.infer(x, request_id="gone")  # queued: returns at once
        assert watched(marks, "stays") == (False, pytest.approx(2, abs=0.3))
        threading.Event().wait(0.5)  # the second has run for about half a second
        gone.cancel()
        cancelled, took = watched(marks, "gone")
        first.join(10)
    assert cancelled and took < 1.5


SELF_CALL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            call = pb_utils.InferenceRequest(
                model_name="echo", requested_output_names=["Y"], inputs=[x]
            )
            answer = call.exec()
            if answer.has_error():
                out.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                y = pb_utils.get_output_tensor_by_name(answer, "Y")
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.as_numpy() * 2)]))
        return out
"""
ECHO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y",
                 pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
"""
IO = (
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
)


def test_explicit_control_and_bls_in_process(tmp_path: Path) -> None:
    """Explicit mode loads only what it is asked to; a Python model's BLS call runs on
    the other model in the same process; a call back into itself is refused at once."""
    python_model(tmp_path / "doubler", f'backend: "python"\nmax_batch_size: 4\n{IO}', SELF_CALL)
    python_model(tmp_path / "echo", f'backend: "python"\nmax_batch_size: 4\n{IO}', ECHO)
    add_model(tmp_path / "add")
    x = {"X": np.array([[1.5, -2.0]], np.float32)}
    with conch.Server(
        tmp_path, model_control_mode="explicit", startup_models=["doubler", "echo"]
    ) as server:
        index = server.models()
        # tritonserver's form: (name, version) -> the model, its state and why.
        assert {key: m.state for key, m in index.items()} == {
            ("add", -1): "UNAVAILABLE",
            ("doubler", 1): "READY",
            ("echo", 1): "READY",
        }
        assert index[("add", -1)].reason == "unloaded" and index[("echo", 1)].reason is None
        assert index["doubler"].version == -1 and index["doubler"].name == "doubler"
        assert repr(index[("echo", 1)]) == "{'name': 'echo', 'version': 1, 'state': 'READY'}"
        with pytest.raises(KeyError, match="Unknown Model: nope"):
            index["nope"]
        with pytest.raises(KeyError, match=r"Unknown Model: \('echo', 2\)"):
            index[("echo", 2)]
        assert list(server.models(exclude_not_ready=True)) == [("doubler", 1), ("echo", 1)]
        np.testing.assert_array_equal(_one(index[("echo", 1)], x)["Y"], x["X"])
        with pytest.raises(InvalidArgument, match="has no available versions"):
            server.model("add").infer({"A": np.ones((1, 4), np.float32)})
        np.testing.assert_array_equal(_one(server.model("doubler"), x)["Y"], x["X"] * 2)
        server.load("add")
        assert server.model("add").ready()
        server.unload("echo")
        assert not server.model("echo").ready()
        with pytest.raises(InvalidArgument, match="echo"):  # the BLS call's own error
            _one(server.model("doubler"), x)
    # A model calling itself would wait on its own busy instance: refused, not deadlocked.
    (tmp_path / "echo" / "1" / "model.py").write_text(SELF_CALL)
    with (
        conch.Server(tmp_path, model_control_mode="explicit", startup_models=["echo"]) as server,
        pytest.raises(ConchError, match="would wait on itself"),
    ):
        _one(server.model("echo"), x)


def test_stop_runs_what_is_queued_bls_calls_included(tmp_path: Path) -> None:
    """Requests queued when the server stops still run, and so do the BLS calls they make
    to a model that has nothing queued of its own."""
    python_model(tmp_path / "doubler", f'backend: "python"\nmax_batch_size: 4\n{IO}', SELF_CALL)
    python_model(tmp_path / "echo", f'backend: "python"\nmax_batch_size: 4\n{IO}', ECHO)
    server = conch.Server(tmp_path).start()
    xs = [np.full((1, 2), k, np.float32) for k in range(8)]
    queued = [server.model("doubler").infer({"X": x}) for x in xs]
    server.stop()
    for x, responses in zip(xs, queued, strict=True):
        np.testing.assert_array_equal(next(iter(responses)).outputs["Y"], x * 2)


def test_sequence_models_and_polling_are_refused_with_the_reason(tmp_path: Path) -> None:
    add_model(tmp_path / "seq", extra="sequence_batching { }")
    with pytest.raises(InvalidArgument, match="does not poll"):
        conch.Server(tmp_path, model_control_mode="poll")
    with (
        conch.Server(tmp_path) as server,
        pytest.raises(InvalidArgument, match="sequence model"),
    ):
        server.model("seq").infer({"A": np.ones((1, 4), np.float32)})
    with pytest.raises(Unavailable, match="not started"):
        server.model("seq").ready()
    # Triton's exit_on_error (tritonserver's default, not conch's): a model that fails to
    # load stops the start, in Triton's words.
    strict = conch.Server(tmp_path, settings=Settings(exit_on_error=True))
    with pytest.raises(StartFailed, match=r"failed to load all models \('seq': .*sequence"):
        strict.start()
    assert not strict.live()


ALONE = """
import json, os, sys
import numpy as np
import conch

with conch.Server(sys.argv[1]) as server:
    passages = list(server.model("text_embedding_passages").infer(
        {"TEXT": np.array(["one two three. " * 80], dtype=object)}))
    sentiment = list(server.model("sentiment").infer({"TEXT": np.array([[b"good"]], dtype=object)}))
    me = os.getpid()
    children = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            children.append(pid)
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed already
            pass
    inet = set()  # the inodes of every TCP and UDP socket (an asyncio loop's socketpair is not)
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in open(f"/proc/self/net/{table}").read().splitlines()[1:]:
            inet.add(line.split()[9])
    sockets = [link for link in links if link.startswith("socket:") and link[8:-1] in inet]
    print(json.dumps({"passages": len(passages), "final": passages[-1].final,
                      "label": [[x.decode() for x in row] for row in sentiment[0].outputs["LABEL"]],
                      "children": children, "sockets": sockets}))
"""


def test_embedded_needs_no_redis_and_no_other_process(tmp_path: Path) -> None:
    """An application that embeds conch runs an ensemble and a decoupled model calling
    another through BLS with no Redis anywhere (REDIS_URL points at nothing), starts no
    process and opens no network socket."""
    if not _built("text_embedding"):
        pytest.skip("text_embedding's build output is missing: run make functions")
    script = tmp_path / "alone.py"
    script.write_text(ALONE)
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0"}
    done = subprocess.run(
        [sys.executable, str(script), str(FUNCTIONS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["passages"] > 2 and facts["final"] is True
    assert facts["label"] == [["positive"]]
    assert facts["children"] == [] and facts["sockets"] == []
