"""OpenAI's routes through a real gateway, worker and Redis, driven by OpenAI's own
Python client (``base_url`` the gateway's ``/v1``), as a user's code would.

The repository: functions/' ``text_embedding`` (its three steps beside it), and three
test models:

- ``words`` (decoupled, Triton's text convention): its text is ``max_tokens`` words,
  ``w0 w1 ...``, cut before a stop word; streamed (``stream`` true) one response per
  word (0.3 s apart for a prompt starting "slow"), else one response with them all. It reports ``num_input_tokens`` (the prompt's
  words) and ``num_output_tokens``. A prompt ``fail`` sends one word, then an error.
- ``echoless`` (not decoupled, only ``text_input``/``text_output``): the prompt upper-cased.
- ``counter`` (decoupled, ``IN``/``OUT`` integers): no text model at all.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import requests
import tritonclient.http as httpclient

from harness import (
    ROOT,
    Service,
    connect,
    fresh_db,
    start_gateway,
    start_worker,
    wait_model_ready,
    wait_until,
    waiting,
)

FUNCTIONS = ROOT / "functions"
EMBEDDING = ("text_embedding_tokenizer", "text_embedding_encoder", "text_embedding_pooling")

WORDS = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


def _input(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            prompt = _input(request, "text_input", [b""])[0].decode()
            count = int(_input(request, "max_tokens", [16])[0])
            stream = bool(_input(request, "stream", [False])[0])
            stops = {s.decode() for s in _input(request, "stop_words", [])}
            words = []
            for i in range(count):
                if f"w{i}" in stops:
                    break
                words.append(("" if i == 0 else " ") + f"w{i}")
            used = np.array([len(prompt.split())], np.int32)

            def response(text, n):
                return pb_utils.InferenceResponse([
                    pb_utils.Tensor("text_output", np.array([text.encode()], np.object_)),
                    pb_utils.Tensor("num_input_tokens", used),
                    pb_utils.Tensor("num_output_tokens", np.array([n], np.int32)),
                ])

            if prompt == "fail":
                sender.send(response("w0", 1))
                error = pb_utils.TritonError("the model failed on purpose")
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            if stream:
                for word in words:
                    if prompt.startswith("slow"):
                        time.sleep(0.3)
                    sender.send(response(word, 1))
            else:
                sender.send(response("".join(words), len(words)))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
WORDS_CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
        { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
        { name: "stop_words" data_type: TYPE_STRING dims: [ -1 ] optional: true },
        { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
        { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
ECHOLESS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            upper = np.array([[t.decode().upper().encode() for t in row] for row in text], np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", upper)]))
        return out
"""
ECHOLESS_CONFIG = """backend: "python"
max_batch_size: 4
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
COUNTER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
COUNTER_CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
TEST_MODELS = {
    "words": (WORDS, WORDS_CONFIG),
    "echoless": (ECHOLESS, ECHOLESS_CONFIG),
    "counter": (COUNTER, COUNTER_CONFIG),
}
MODELS = (*EMBEDDING, "text_embedding", *TEST_MODELS)
TEXTS = [
    "A man is eating food.",
    "Das ist ein deutscher Satz mit Umlauten: Grüße.",
    "東京は日本の首都です。",
    "emoji 🙂 and punctuation?!",
]


@pytest.fixture(scope="module")
def served(tmp_path_factory, redis_url: str, log_dir: Path) -> Iterator[tuple[str, str]]:
    """The gateway's address and its Redis database."""
    repo = tmp_path_factory.mktemp("openai") / "models"
    repo.mkdir()
    for name in (*EMBEDDING, "text_embedding"):
        (repo / name).symlink_to(FUNCTIONS / name, target_is_directory=True)
    for name, (source, config) in TEST_MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(source)
        (repo / name / "config.pbtxt").write_text(config)
    db = fresh_db(redis_url, 14)
    worker: Service = start_worker(repo, db, log_dir, "--models", ",".join(MODELS))
    gateway, url = start_gateway(repo, db, log_dir)
    try:
        for model in MODELS:
            wait_model_ready(url, model, 120, worker, gateway)
        yield url, db
    finally:
        gateway.stop()
        worker.stop()


@pytest.fixture()
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{served[0]}/v1", api_key="x", max_retries=0)


def _v2_embeddings(url: str, texts: list[str]) -> np.ndarray:
    triton = httpclient.InferenceServerClient(url)
    text = httpclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    text.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    return triton.infer("text_embedding", [text]).as_numpy("EMBEDDING")


# -- models --------------------------------------------------------------------------------
def test_models_lists_every_ready_model(client: openai.OpenAI) -> None:
    listed = {m.id: m for m in client.models.list()}
    assert set(listed) == set(MODELS)
    card = client.models.retrieve("text_embedding")
    assert card.id == "text_embedding" and card.object == "model" and card.owned_by == "conch"
    assert card.created > 0 and card == listed["text_embedding"]
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("nope")
    assert err.value.body["code"] == "model_not_found"


# -- embeddings ------------------------------------------------------------------------------
def test_embeddings_are_text_embeddings_answers_over_v2(served, client: openai.OpenAI) -> None:
    """The client's default (it asks for base64 and decodes it), floats, and one string:
    each the same vectors as v2 infer gives, in the order given."""
    want = _v2_embeddings(served[0], TEXTS)
    default = client.embeddings.create(model="text_embedding", input=TEXTS)
    floats = client.embeddings.create(model="text_embedding", input=TEXTS, encoding_format="float")
    for answer in (default, floats):
        assert answer.model == "text_embedding" and answer.object == "list"
        assert [d.index for d in answer.data] == list(range(len(TEXTS)))
        got = np.array([d.embedding for d in answer.data], dtype=np.float32)
        np.testing.assert_allclose(got, want, atol=1e-5)
        # text_embedding reports no token counts: conch counts none itself.
        assert answer.usage.prompt_tokens == 0 and answer.usage.total_tokens == 0
    one = client.embeddings.create(model="text_embedding", input=TEXTS[2], dimensions=384)
    assert len(one.data) == 1
    np.testing.assert_allclose(np.array(one.data[0].embedding), want[2], atol=1e-5)


def test_base64_is_little_endian_float32(served) -> None:
    url = served[0]
    body = {"model": "text_embedding", "input": TEXTS[:2], "encoding_format": "base64"}
    answer = requests.post(f"http://{url}/v1/embeddings", json=body, timeout=60).json()
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in answer["data"]])
    np.testing.assert_allclose(got, _v2_embeddings(url, TEXTS[:2]), atol=1e-5)


def test_more_texts_than_a_batch_go_as_several_requests(served, client: openai.OpenAI) -> None:
    texts = [f"sentence number {i}" for i in range(150)]  # text_embedding batches 64
    answer = client.embeddings.create(model="text_embedding", input=texts, encoding_format="float")
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    np.testing.assert_allclose(
        got[[0, 70, 149]], _v2_embeddings(served[0], [texts[i] for i in (0, 70, 149)]), atol=1e-5
    )


def _counts(url: str, model: str) -> tuple[int, int]:
    stats = requests.get(f"http://{url}/v2/models/{model}/stats", timeout=10).json()
    inference = stats["model_stats"][0]["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


BAD_EMBEDDINGS = [
    ({"input": ["x"]}, 400, "model"),
    ({"model": "text_embedding"}, 400, "input"),
    ({"model": "text_embedding", "input": []}, 400, "input"),
    ({"model": "text_embedding", "input": ""}, 400, "input"),
    ({"model": "text_embedding", "input": ["a", ""]}, 400, "input"),
    ({"model": "text_embedding", "input": 7}, 400, "input"),
    ({"model": "text_embedding", "input": [1, 2, 3]}, 400, "input"),  # token ids
    ({"model": "text_embedding", "input": ["a"] * 2049}, 400, "input"),
    ({"model": "text_embedding", "input": "a", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"model": "text_embedding", "input": "a", "dimensions": 12}, 400, "dimensions"),
    ({"model": 3, "input": "a"}, 400, "model"),
    ({"model": "nope", "input": "a"}, 404, "model"),
    ({"model": "words", "input": "a"}, 400, "model"),  # decoupled: no embedding model
    ({"model": "counter", "input": "a"}, 400, "model"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_EMBEDDINGS)
def test_a_bad_embeddings_request_is_refused_in_openais_form(served, body, status, param) -> None:
    url = served[0]
    before = _counts(url, "text_embedding")
    r = requests.post(f"http://{url}/v1/embeddings", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["code"]
    assert error["type"] == "invalid_request_error"
    assert _counts(url, "text_embedding") == before  # nothing ran


def test_a_body_that_is_no_json_object_is_a_400(served) -> None:
    url = served[0]
    for data in (b"{", b"[1]", b'"x"'):
        r = requests.post(f"http://{url}/v1/embeddings", data=data, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


# -- completions -----------------------------------------------------------------------------
def test_a_completion_unstreamed(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="words", prompt="one two three", max_tokens=4)
    assert answer.object == "text_completion" and answer.model == "words"
    assert [c.text for c in answer.choices] == ["w0 w1 w2 w3"]
    assert answer.choices[0].finish_reason == "length"  # max_tokens cut it
    stopped = client.completions.create(model="words", prompt="x", max_tokens=4, stop=["w2"])
    assert stopped.choices[0].text == "w0 w1" and stopped.choices[0].finish_reason == "stop"
    usage = answer.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (3, 4, 7)


def test_a_completion_streamed_one_chunk_per_response(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="words",
            prompt="hello there",
            max_tokens=5,
            stop=["w3"],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert texts == ["w0", " w1", " w2", ""]  # the model's empty final response ends it
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, None, None, "stop"]
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 2
    assert chunks[-1].usage.completion_tokens == 3


def test_a_stream_cut_by_max_tokens_finishes_for_length(client: openai.OpenAI) -> None:
    """OpenAI's ``length``: the model wrote the ``max_tokens`` it was told (it reports
    each response's ``num_output_tokens``), here without the client asking for usage;
    with OpenAI's default of 16 too."""
    for asked, words in (({"max_tokens": 3}, 3), ({}, 16)):
        chunks = list(client.completions.create(model="words", prompt="p", stream=True, **asked))
        reasons = [c.choices[0].finish_reason for c in chunks]
        assert reasons == [None] * words + ["length"], reasons


def test_the_sse_stream_ends_with_done(served) -> None:
    body = {"model": "words", "prompt": "x", "max_tokens": 2, "stream": True}
    r = requests.post(f"http://{served[0]}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)


def test_a_model_that_is_not_decoupled_and_echo(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="echoless", prompt="abc ")
    assert answer.choices[0].text == "ABC " and answer.usage is None
    echoed = client.completions.create(model="echoless", prompt="abc ", echo=True)
    assert echoed.choices[0].text == "abc ABC "
    streamed = list(client.completions.create(model="echoless", prompt="q", stream=True))
    assert [c.choices[0].text for c in streamed] == ["Q"]
    assert streamed[0].choices[0].finish_reason == "stop"


def test_an_error_after_the_first_chunk_raises_in_the_client(client: openai.OpenAI) -> None:
    stream = client.completions.create(model="words", prompt="fail", stream=True)
    got = []
    with pytest.raises(openai.APIError, match="failed on purpose"):
        for chunk in stream:
            got.append(chunk.choices[0].text)
    assert got == ["w0"]
    with pytest.raises(openai.APIStatusError, match="failed on purpose") as err:
        client.completions.create(model="words", prompt="fail")
    assert err.value.status_code == 500


def test_a_client_that_goes_away_withdraws_its_queued_completion(served) -> None:
    url, db = served
    before = _counts(url, "words")
    # The model's one instance is kept busy by a slow stream...
    body = {"model": "words", "prompt": "slow", "max_tokens": 8, "stream": True}
    busy = requests.post(f"http://{url}/v1/completions", json=body, stream=True, timeout=30)
    try:
        lines = (line for line in busy.iter_lines() if line)
        assert b'"text":"w0"' in next(lines)
        # ... while a second completion waits in the queue, its client then gone.
        second = json.dumps({**body, "prompt": "also slow"}).encode()
        sock = connect(url)
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(second)).encode()
            + b"\r\n\r\n"
            + second
        )
        wait_until(lambda: waiting(db, "words") == 1, 5, "the second completion queued")
        sock.close()
        wait_until(lambda: waiting(db, "words") == 0, 15, "the completion withdrawn")
        rest = [line for line in lines]
        assert rest[-1] == b"data: [DONE]" and len(rest) == 1 + 7 + 1  # w1..w7, the end, DONE
    finally:
        busy.close()
    wait_until(lambda: _counts(url, "words")[0] > before[0], 5, "the first counted")
    success, fail = _counts(url, "words")
    assert (success - before[0], fail - before[1]) == (1, 1)  # the withdrawn one: cancelled


BAD_COMPLETIONS = [
    ({"prompt": "x"}, 400, "model"),
    ({"model": "words"}, 400, "prompt"),
    ({"model": "words", "prompt": ""}, 400, "prompt"),
    ({"model": "words", "prompt": ["a", "b"]}, 400, "prompt"),
    ({"model": "words", "prompt": [1, 2]}, 400, "prompt"),
    ({"model": "words", "prompt": "x", "max_tokens": "9"}, 400, "max_tokens"),
    ({"model": "words", "prompt": "x", "max_tokens": 2**31}, 400, "max_tokens"),
    ({"model": "words", "prompt": "x", "temperature": 9}, 400, "temperature"),
    ({"model": "words", "prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"model": "words", "prompt": "x", "stop": ["a"] * 5}, 400, "stop"),
    ({"model": "words", "prompt": "x", "n": 2}, 400, "n"),
    ({"model": "words", "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    (
        {"model": "words", "prompt": "x", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    ({"model": "nope", "prompt": "x"}, 404, "model"),
    ({"model": "counter", "prompt": "x"}, 400, "model"),
    ({"model": "text_embedding", "prompt": "x"}, 400, "model"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_COMPLETIONS)
def test_a_bad_completions_request_is_refused_in_openais_form(served, body, status, param) -> None:
    url, db = served
    before = _counts(url, "words")
    streamed = {**body, "stream": True}
    bodies = [body] if "stream" in body or "stream_options" in body else [body, streamed]
    for sent in bodies:
        r = requests.post(f"http://{url}/v1/completions", json=sent, timeout=30)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["message"] and error["code"], error
    assert _counts(url, "words") == before
    assert waiting(db, "words") == 0  # nothing waits in its queue either


def test_the_client_sees_openais_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="text_input"):
        client.completions.create(model="counter", prompt="x")
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="text_embedding", input=[])


def test_restricted_inference_and_metadata(served, tmp_path: Path, log_dir: Path) -> None:
    """A second gateway restricting both groups: its OpenAI routes want their headers."""
    _, db = served
    flags = (
        "--http-restricted-api",
        "inference:infer-key=s3cret",
        "--http-restricted-api",
        "metadata:meta-key=m",
    )
    models = tmp_path / "models"
    models.mkdir()
    for name in ("words",):
        (models / name / "1").mkdir(parents=True)
        (models / name / "1" / "model.py").write_text(WORDS)
        (models / name / "config.pbtxt").write_text(WORDS_CONFIG)
    gateway, second = start_gateway(models, db, log_dir, *flags)
    try:
        wait_model_ready(second, "words", 60, gateway)
        base = f"http://{second}/v1"
        plain = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        with pytest.raises(openai.PermissionDeniedError, match="infer-key"):
            plain.completions.create(model="words", prompt="x")
        with pytest.raises(openai.PermissionDeniedError, match="meta-key"):
            plain.models.list()
        allowed = openai.OpenAI(
            base_url=base,
            api_key="x",
            max_retries=0,
            default_headers={"infer-key": "s3cret", "meta-key": "m"},
        )
        assert (
            allowed.completions.create(model="words", prompt="x", max_tokens=1).choices[0].text
            == "w0"
        )
        assert "words" in {m.id for m in allowed.models.list()}
    finally:
        gateway.stop()
