"""BLS calls to a decoupled model through the real path: a Python model (``caller``) calls
``counter``, a decoupled Python model, with ``exec(decoupled=True)`` and
``async_exec(decoupled=True)``; a real worker serves both and a real gateway takes the
client's request (stock tritonclient.http).

``caller`` reports in its INFO output (JSON) every response it read, in order, with when
it read it; ``counter`` writes a file under the repository's ``marks`` folder when it sees
``is_cancelled()``, naming how many responses it had sent by then.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from harness import fresh_db, serving, wait_until

COUNTER_CONFIG = """
name: "counter"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "marks" value: { string_value: "%s" } }
"""

# IN = n: responses OUT = 0..n-1, then the final flag alone; n >= 1000: n - 1000 of them,
# a quarter of a second apart, stopping at is_cancelled(). -1: one response, then an
# error with the final flag. -2: one response carrying the final flag.
COUNTER_MODEL = """
import json
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def response(k):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([k], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marks = Path(config["parameters"]["marks"]["string_value"])

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.run, args=(request, sender, n), daemon=True).start()
        return None

    def run(self, request, sender, n):
        if n == -1:
            sender.send(response(1))
            error = pb_utils.TritonError("counter refuses -1", pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        if n == -2:
            sender.send(response(7), flags=FINAL)
            return
        pause = 0.0
        if n >= 1000:
            n, pause = n - 1000, 0.25
        for k in range(n):
            if sender.is_cancelled():
                (self.marks / request.request_id()).write_text(str(k))
                sender.send(flags=FINAL)
                return
            sender.send(response(k))
            time.sleep(pause)
        sender.send(flags=FINAL)
"""

DOUBLE_CONFIG = """
name: "double"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

DOUBLE_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)]
            )
            for r in requests
        ]
"""

CALLER_CONFIG = """
name: "caller"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

# Parameters: target (counter), id (the BLS request id), bls_timeout (µs), keep (responses
# read before breaking out), mode:
#   exec    iterate exec(decoupled=True) to the end
#   async   two async_exec(decoupled=True) calls at once, then iterate both
#   break   stop after `keep` responses (the iterator is dropped)
#   cancel  read one response, cancel(), then read what follows
#   plain   exec() without decoupled
CALLER_MODEL = """
import asyncio
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def describe(response, start):
    seen = {"at": time.monotonic() - start, "out": None, "error": None}
    if response.has_error():
        seen["error"] = [response.error().code(), response.error().message()]
    elif response.output_tensors():
        seen["out"] = int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
    return seen


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            p = json.loads(request.parameters())
            n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            info = await self.one(p, n)
            text = np.array([json.dumps(info).encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", text)]))
        return responses

    def call(self, p, n):
        return pb_utils.InferenceRequest(
            model_name=p.get("target", "counter"),
            inputs=[pb_utils.Tensor("IN", n)],
            requested_output_names=["OUT"],
            request_id=p.get("id", ""),
            timeout=int(p.get("bls_timeout", 0)),
        )

    async def one(self, p, n):
        mode = p.get("mode", "exec")
        start = time.monotonic()
        if mode == "plain":
            return {"calls": [[describe(self.call(p, n).exec(), start)]]}
        if mode == "async":
            both = await asyncio.gather(
                self.call(p, n).async_exec(decoupled=True),
                self.call(p, n).async_exec(decoupled=True),
            )
            return {"calls": [[describe(r, start) for r in responses] for responses in both]}
        got = []
        if mode == "break":
            for r in self.call(p, n).exec(decoupled=True):
                got.append(describe(r, start))
                if len(got) >= int(p["keep"]):
                    break
        elif mode == "cancel":
            responses = self.call(p, n).exec(decoupled=True)
            got.append(describe(next(responses), start))
            responses.cancel()
            got.extend(describe(r, start) for r in responses)
        else:
            got.extend(describe(r, start) for r in self.call(p, n).exec(decoupled=True))
        return {"calls": [got], "returned": time.monotonic() - start}
"""

MODELS = {
    "counter": (COUNTER_CONFIG, COUNTER_MODEL),
    "double": (DOUBLE_CONFIG, DOUBLE_MODEL),
    "caller": (CALLER_CONFIG, CALLER_MODEL),
}

INTERNAL, INVALID_ARG, UNAVAILABLE, CANCELLED = 1, 3, 4, 7  # Triton's error codes


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bls_decoupled") / "models"
    (root / "marks").mkdir(parents=True)
    for name, (config, code) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        text = config % (root / "marks") if name == "counter" else config
        (root / name / "config.pbtxt").write_text(text)
        (root / name / "1" / "model.py").write_text(code)
    return root


@pytest.fixture(scope="module")
def url(repo: Path, redis_url: str, log_dir: Path) -> Iterator[str]:
    db = fresh_db(redis_url, 12)
    with serving(repo, db, log_dir, tuple(MODELS)) as (gateway_url, _, _):
        yield gateway_url


def ask(url: str, n: int, **params: Any) -> dict[str, Any]:
    """The caller's INFO for a request with IN = ``n`` and these parameters."""
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([n], np.int32))
    result = httpclient.InferenceServerClient(url).infer("caller", [inp], parameters=params)
    return json.loads(result.as_numpy("INFO")[0])


def outs(responses: list[dict[str, Any]]) -> list[Any]:
    """Each response's OUT, "empty" for one without outputs, or its error (code, text)."""
    return [
        tuple(r["error"]) if r["error"] else ("empty" if r["out"] is None else r["out"])
        for r in responses
    ]


def cancelled_at(repo: Path, request_id: str) -> int:
    """How many responses ``counter`` had sent when it saw ``is_cancelled()``."""
    mark = repo / "marks" / request_id
    # Written by the model as it sees it: the file may exist a moment before its number.
    wait_until(
        lambda: mark.exists() and mark.read_text().strip() != "",
        15,
        f"counter to see request '{request_id}' cancelled",
    )
    return int(mark.read_text())


def test_exec_decoupled_gets_every_response_in_order_then_the_empty_final(url: str) -> None:
    [responses] = ask(url, 5)["calls"]
    assert outs(responses) == [0, 1, 2, 3, 4, "empty"]


def test_a_final_response_with_outputs_is_the_last(url: str) -> None:
    [responses] = ask(url, -2)["calls"]
    assert outs(responses) == [7]


def test_zero_responses_is_the_empty_final_alone(url: str) -> None:
    [responses] = ask(url, 0)["calls"]
    assert outs(responses) == ["empty"]


def test_async_exec_decoupled_calls_overlap_and_each_gets_every_response(url: str) -> None:
    info = ask(url, 1006, mode="async")
    assert [outs(c) for c in info["calls"]] == [[0, 1, 2, 3, 4, 5, "empty"]] * 2
    # Each call takes six pauses; made at once, both end in about that time, not twice it.
    assert max(c[-1]["at"] for c in info["calls"]) < 2 * 6 * 0.25, info


def test_responses_come_as_the_model_sends_them(url: str) -> None:
    """Each response is read while the called model is still running, not all at its end."""
    [responses] = ask(url, 1004)["calls"]
    assert outs(responses) == [0, 1, 2, 3, "empty"]
    at = [r["at"] for r in responses]
    assert at[-1] - at[0] > 2 * 0.25, at  # they came spread over the model's pauses
    assert at == sorted(at)


def test_exec_decoupled_on_a_model_that_is_not_decoupled_gets_its_one_response(url: str) -> None:
    [responses] = ask(url, 21, target="double")["calls"]
    assert outs(responses) == [42]


def test_the_called_models_error_response_is_its_last_as_it_sent_it(url: str) -> None:
    [responses] = ask(url, -1)["calls"]
    assert outs(responses) == [1, (INVALID_ARG, "counter refuses -1")]


def test_plain_exec_on_a_decoupled_model_is_refused_as_triton_refuses_it(url: str) -> None:
    [[response]] = ask(url, 3, mode="plain")["calls"]
    code, message = response["error"]
    assert code == INTERNAL
    assert "'counter' is using the decoupled transaction policy" in message
    assert "Please use 'decoupled=True' argument to the 'exec' or 'async_exec'" in message


def test_breaking_out_of_the_loop_cancels_the_call(url: str, repo: Path) -> None:
    info = ask(url, 1040, mode="break", keep=2, id="broken-off")
    [responses] = info["calls"]
    assert outs(responses) == [0, 1]
    assert info["returned"] < 40 * 0.25 / 2, info  # it did not wait for the other 38
    assert cancelled_at(repo, "broken-off") < 40  # the model saw is_cancelled() and stopped


def test_cancel_ends_the_call_with_a_cancelled_response(url: str, repo: Path) -> None:
    info = ask(url, 1040, mode="cancel", id="cancelled-early")
    [responses] = info["calls"]
    assert outs(responses)[0] == 0
    code, message = responses[-1]["error"]
    assert code == CANCELLED and "'counter'" in message, responses
    assert len(responses) == 2
    assert cancelled_at(repo, "cancelled-early") < 40


def test_the_calls_deadline_ends_its_stream(url: str, repo: Path) -> None:
    started = time.monotonic()
    [responses] = ask(url, 1040, bls_timeout=800_000, id="timed-out")["calls"]
    assert time.monotonic() - started < 40 * 0.25 / 2
    code, message = responses[-1]["error"]
    assert code == UNAVAILABLE and "Request timeout expired for model 'counter'" in message
    assert 1 <= len(responses) - 1 <= 5, responses
    assert cancelled_at(repo, "timed-out") < 40
