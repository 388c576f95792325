"""The shipped ``text_embedding_passages`` model in process: how a document is split
(``1/passages.py``), and what ``execute`` streams for it, with conch's ``pb_utils`` and the
embedding call replaced by a stand-in (the real one is checked through a worker in
``tests/integration/backends/test_text_embedding_passages.py``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from conch.backends.python.backend import install_utils
from conch.core.model_config import config_to_json, parse_config

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "functions" / "text_embedding_passages"
TOKENIZER = ROOT / "functions" / "text_embedding_tokenizer" / "1"

pytestmark = pytest.mark.skipif(
    not (TOKENIZER / "tokenizer.json").exists(),
    reason="text_embedding_tokenizer/1/tokenizer.json is a build output: run `make functions`",
)

SENTENCES = [
    "Passage {i} opens the {i}th section of this report.",
    "It names Grüße, Mädchen and Übung, and 東京は日本の首都です。",
    "A URL such as https://example.com/path_{i}?q=a,b counts as many words!",
    "Numbers like 3.14159 and 2,718 are split apart; so is punctuation (here).",
]
DOCUMENT = "\n\n".join(" ".join(s.format(i=i) for s in SENTENCES[: 1 + i % 4]) for i in range(40))


def _sibling(name: str):
    """``1/<name>.py`` imported from its file, under a name of its own."""
    unique = f"text_embedding_passages_{name}"
    spec = importlib.util.spec_from_file_location(unique, MODEL / "1" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


passages = _sibling("passages")


@pytest.fixture(scope="module")
def splitter():
    return passages.load(str(TOKENIZER))


def _tokens(splitter, text: str) -> list[int]:
    return splitter.tokenizer.encode(text, add_special_tokens=False).ids


def test_the_longest_passage_is_the_embedding_models_input_less_cls_and_sep(splitter) -> None:
    assert splitter.max_size == 254
    assert splitter.tokenizer.truncation is None and splitter.tokenizer.padding is None


@pytest.mark.parametrize(("size", "overlap"), [(16, 0), (16, 8), (32, 8), (128, 32), (254, 0)])
def test_passages_cover_the_document_in_order_within_size_and_overlap(
    splitter, size: int, overlap: int
) -> None:
    parts = splitter.split(DOCUMENT, size, overlap)
    assert [p.index for p in parts] == list(range(len(parts)))
    doc_tokens = splitter.tokenizer.encode(DOCUMENT, add_special_tokens=False)
    assert parts[0].start == doc_tokens.offsets[0][0]
    assert parts[-1].end == doc_tokens.offsets[-1][1]
    for part in parts:
        assert part.text == DOCUMENT[part.start : part.end]
        # Alone, a passage tokenizes as it did in the document: never cut by the model.
        assert len(_tokens(splitter, part.text)) == part.tokens <= size
    for before, after in itertools.pairwise(parts):
        assert before.start < after.start and before.end < after.end
        if after.start < before.end:  # shared: at most `overlap` tokens of both
            assert overlap > 0
            assert len(_tokens(splitter, DOCUMENT[after.start : before.end])) <= overlap
        else:  # nothing left out between them but what the tokenizer drops
            assert DOCUMENT[before.end : after.start].strip() == ""
    # Every token of the document is in some passage, in order.
    covered = sum(p.tokens for p in parts)
    assert covered >= len(doc_tokens.ids)
    if overlap == 0:
        assert covered == len(doc_tokens.ids)


def test_passages_use_the_overlap_they_are_given(splitter) -> None:
    parts = splitter.split(DOCUMENT, 64, 16)
    shared = [
        len(_tokens(splitter, DOCUMENT[b.start : a.end]))
        for a, b in itertools.pairwise(parts)
        if b.start < a.end
    ]
    assert len(shared) == len(parts) - 1 and all(0 < n <= 16 for n in shared)
    assert max(shared) >= 12  # whole words: close to what was asked, never more


def test_passages_start_and_end_on_word_boundaries(splitter) -> None:
    """The tokenizer's words: a passage never starts or ends inside one."""
    encoding = splitter.tokenizer.encode(DOCUMENT, add_special_tokens=False)
    spans: dict[int, list[int]] = {}
    for word, (start, end) in zip(encoding.word_ids, encoding.offsets, strict=True):
        spans.setdefault(word, [start, end])[1] = end
    starts, ends = {s for s, _ in spans.values()}, {e for _, e in spans.values()}
    for part in splitter.split(DOCUMENT, 20, 5):
        assert part.start in starts and part.end in ends, part


def test_a_word_longer_than_a_passage_is_cut_into_pieces(splitter) -> None:
    word = "".join(f"unbelievable{i}" for i in range(4))  # one word, many word pieces
    long = _tokens(splitter, word)
    assert len(long) > 16
    parts = splitter.split(f"A {word} b", 16, 0)
    assert sum(p.tokens for p in parts) == len(long) + 2
    assert all(p.tokens <= 16 for p in parts)


@pytest.mark.parametrize("document", ["", "   \n\t  "])
def test_a_document_with_no_text_has_no_passages(splitter, document: str) -> None:
    assert splitter.split(document, 32, 8) == []


@pytest.mark.parametrize(
    ("size", "overlap", "message"),
    [
        (15, 0, "PASSAGE_TOKENS must be from 16 to 254, got 15"),
        (255, 0, "PASSAGE_TOKENS must be from 16 to 254, got 255"),
        (-1, 0, "PASSAGE_TOKENS must be from 16 to 254, got -1"),
        (32, 17, "OVERLAP_TOKENS must be from 0 to half of PASSAGE_TOKENS (16), got 17"),
        (32, -1, "OVERLAP_TOKENS must be from 0 to half of PASSAGE_TOKENS (16), got -1"),
    ],
)
def test_sizes_out_of_bounds_are_refused(splitter, size: int, overlap: int, message) -> None:
    assert splitter.bounds(size, overlap) == message
    with pytest.raises(ValueError, match=r"TOKENS must be from"):
        splitter.split(DOCUMENT, size, overlap)


def test_the_config_is_a_decoupled_python_model_with_the_documented_tensors() -> None:
    text = (MODEL / "config.pbtxt").read_text()
    config = config_to_json(parse_config(text, model=MODEL.name, source="config.pbtxt"))
    assert config["backend"] == "python" and config["model_transaction_policy"]["decoupled"]
    assert [(i["name"], i["data_type"], i.get("optional", False)) for i in config["input"]] == [
        ("TEXT", "TYPE_STRING", False),
        ("PASSAGE_TOKENS", "TYPE_INT32", True),
        ("OVERLAP_TOKENS", "TYPE_INT32", True),
    ]
    names = [o["name"] for o in config["output"]]
    assert names == ["PASSAGE", "INDEX", "COUNT", "START", "END", "EMBEDDING"]


# -- execute, in process --------------------------------------------------------------------


class Streamed:
    """What one request's sender delivered: (response, final) pairs."""

    def __init__(self, pb) -> None:
        self.got: list = []
        self.cancel_after: int | None = None
        self.sender = pb.InferenceResponseSender(
            self._deliver, decoupled=True, about="test", cancelled=self._cancelled
        )

    def _deliver(self, response, final: bool) -> bool:
        self.got.append((response, final))
        return final

    def _cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.got) >= self.cancel_after


@pytest.fixture(scope="module")
def pb():
    install_utils()
    import triton_python_backend_utils

    return triton_python_backend_utils


@pytest.fixture(scope="module")
def model_module(pb):
    """``1/model.py`` imported as a worker imports it: its folder on ``sys.path``."""
    sys.path.insert(0, str(MODEL / "1"))
    try:
        return _sibling("model")
    finally:
        sys.path.remove(str(MODEL / "1"))
        sys.modules.pop("passages", None)  # as the worker drops a model's siblings


@pytest.fixture()
def model(pb, model_module, monkeypatch):
    """The model, loaded as a worker loads it, its embedding call a stand-in that
    records which passages it was asked for and answers ``[len(text), 0, ...]``."""
    instance = model_module.TritonPythonModel()
    instance.initialize({"model_repository": str(MODEL), "model_config": "{}"})
    instance.asked = []

    async def embed(text: str):
        instance.asked.append(text)
        await asyncio.sleep(0)
        if text == "FAIL":
            return pb.InferenceResponse(error=pb.TritonError("the encoder broke"))
        vector = np.zeros(384, np.float32)
        vector[0] = len(text)
        return pb.InferenceResponse([pb.Tensor("EMBEDDING", vector[None, :])])

    monkeypatch.setattr(instance, "_embed", embed)
    return instance


def _request(pb, document, size=None, overlap=None, *, text_type=np.object_):
    inputs = [pb.Tensor("TEXT", np.array([document], text_type))]
    for name, value in (("PASSAGE_TOKENS", size), ("OVERLAP_TOKENS", overlap)):
        if value is not None:
            inputs.append(pb.Tensor(name, np.array([value], np.int32)))
    request = pb.InferenceRequest(model_name="text_embedding_passages", inputs=inputs)
    streamed = Streamed(pb)
    request._sender = streamed.sender  # as the python backend gives it
    return request, streamed


def _run(model, *requests) -> None:
    assert asyncio.run(model.execute(list(requests))) is None


def _outputs(response) -> dict:
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


def test_execute_streams_one_response_per_passage_the_last_one_final(pb, model, splitter):
    request, streamed = _request(pb, DOCUMENT.encode(), 32, 8)
    _run(model, request)
    parts = splitter.split(DOCUMENT, 32, 8)
    assert [final for _, final in streamed.got] == [False] * (len(parts) - 1) + [True]
    for part, (response, _) in zip(parts, streamed.got, strict=True):
        out = _outputs(response)
        assert out["PASSAGE"].tolist() == [part.text.encode()]
        assert out["INDEX"].tolist() == [part.index] and out["COUNT"].tolist() == [len(parts)]
        assert (out["START"].tolist(), out["END"].tolist()) == ([part.start], [part.end])
        assert out["EMBEDDING"].shape == (384,) and out["EMBEDDING"][0] == len(part.text)
    assert model.asked == [p.text for p in parts]


def test_the_defaults_are_128_tokens_and_a_quarter_of_overlap(pb, model, splitter) -> None:
    request, streamed = _request(pb, DOCUMENT.encode())
    _run(model, request)
    parts = splitter.split(DOCUMENT, 128, 32)
    assert [_outputs(r)["END"][0] for r, _ in streamed.got] == [p.end for p in parts]
    request, streamed = _request(pb, DOCUMENT.encode(), 64)
    _run(model, request)
    assert len(streamed.got) == len(splitter.split(DOCUMENT, 64, 16))


@pytest.mark.parametrize("document", [b"", b"  \n "])
def test_a_document_with_no_text_gets_the_empty_final_response(pb, model, document) -> None:
    request, streamed = _request(pb, document)
    _run(model, request)
    assert streamed.got == [(None, True)] and model.asked == []


@pytest.mark.parametrize(
    ("document", "size", "overlap", "message"),
    [
        (b"\xff\xfe not utf-8", None, None, "TEXT must be UTF-8"),
        (b"text", 8, None, "PASSAGE_TOKENS must be from 16 to 254, got 8"),
        (b"text", 300, None, "PASSAGE_TOKENS must be from 16 to 254, got 300"),
        (b"text", 32, 20, "OVERLAP_TOKENS must be from 0 to half of PASSAGE_TOKENS (16), got 20"),
    ],
)
def test_bad_input_is_one_invalid_arg_error_before_any_passage(
    pb, model, document, size, overlap, message
) -> None:
    request, streamed = _request(pb, document, size, overlap)
    _run(model, request)
    [(response, final)] = streamed.got
    assert final and response.has_error() and model.asked == []
    assert response.error().code() == pb.TritonError.INVALID_ARG
    assert response.error().message().startswith(message)


def test_an_embedding_call_that_fails_ends_the_stream_with_its_error(pb, model) -> None:
    model.splitter = _three_passages(model.splitter)  # "one", "FAIL", "three"
    request, streamed = _request(pb, b"any document", 16)
    _run(model, request)
    assert [final for _, final in streamed.got] == [False, True]
    assert not streamed.got[0][0].has_error()
    assert streamed.got[1][0].error().message() == "the encoder broke"


def _three_passages(splitter):
    """A splitter that cuts any document into "one", "FAIL" and "three"."""

    class Three:
        def bounds(self, size, overlap):
            return splitter.bounds(size, overlap)

        def split(self, document, size, overlap):
            texts = ["one", "FAIL", "three"]
            return [passages.Passage(i, 0, 1, text, 1) for i, text in enumerate(texts)]

    return Three()


def test_a_cancelled_request_stops_at_the_next_passage_with_cancelled(
    pb, model, model_module
) -> None:
    request, streamed = _request(pb, DOCUMENT.encode(), 16, 0)
    streamed.cancel_after = 2
    _run(model, request)
    assert [final for _, final in streamed.got] == [False, False, True]
    error = streamed.got[-1][0].error()
    assert error.code() == pb.TritonError.CANCELLED
    # Two sent, and no more asked for than the look-ahead keeps in flight.
    assert len(model.asked) <= 2 + model_module.LOOKAHEAD


def test_requests_of_one_execute_each_get_their_own_stream(pb, model, splitter) -> None:
    (a, got_a), (b, got_b) = _request(pb, b"short one", 16), _request(pb, DOCUMENT.encode(), 64)
    _run(model, a, b)
    assert [f for _, f in got_a.got] == [True]
    assert [f for _, f in got_b.got][-1] and len(got_b.got) == len(splitter.split(DOCUMENT, 64, 16))


def test_the_tokenizer_is_found_beside_the_model(model_module, tmp_path: Path) -> None:
    assert model_module.tokenizer_folder(str(MODEL)) == str(TOKENIZER)
    (tmp_path / "text_embedding_passages").mkdir()
    with pytest.raises(Exception, match="text_embedding_tokenizer must be in this repository"):
        model_module.tokenizer_folder(str(tmp_path / "text_embedding_passages"))


def test_the_model_is_written_for_tritons_python_backend_alone() -> None:
    for name in ("model.py", "passages.py"):
        source = (MODEL / "1" / name).read_text()
        assert "import conch" not in source and "from conch" not in source
