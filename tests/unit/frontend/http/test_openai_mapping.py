"""OpenAI's bodies against a model's tensors (``openai_mapping``), with no server; and
the routes' API groups and OpenAPI fragment (``openai_routes``) against the app.

The embedding vectors are read back with the stock ``openai`` client's own parser, so
a change in what it sends or expects (it asks for base64 unless told otherwise) fails here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from openai._types import omit
from openai.lib._parsing._embeddings import parse_embedding_response, prepare_embedding_request
from openai.types import CreateEmbeddingResponse
from openapi_spec_validator import validate

from conch.backends.completion import complete
from conch.core import tensors
from conch.core.errors import BrokerUnavailable, Forbidden, InvalidArgument
from conch.core.inference import InferRequest, OutputTensor
from conch.core.repository import ModelEntry, ModelRepository
from conch.core.restricted_apis import ApiGroup
from conch.frontend.dataplane import InferOutcome
from conch.frontend.http import api_groups, openai_routes, openapi
from conch.frontend.http import openai_mapping as mapping
from conch.frontend.http.app import create_app
from conch.settings import Settings

EMBEDDER = """backend: "python"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "VEC" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
WORDS = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
        { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "stop_words" data_type: TYPE_STRING dims: [ -1 ] optional: true },
        { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
        { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
NEEDY = """backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "lora" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def _entry(tmp_path: Path, name: str, config: str) -> ModelEntry:
    (tmp_path / name / "1").mkdir(parents=True)
    (tmp_path / name / "config.pbtxt").write_text(config)
    (tmp_path / name / "1" / "model.py").write_text("class TritonPythonModel: pass\n")
    entry = ModelRepository(tmp_path, complete=complete).read_model(name)
    assert entry.error is None, entry.error
    return entry


def _param(exc: pytest.ExceptionInfo) -> str | None:
    assert isinstance(exc.value, mapping.OpenAIError)
    return exc.value.param


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("error", "kind", "code"),
    [
        (InvalidArgument("bad"), "invalid_request_error", "invalid_arg"),
        (Forbidden("restricted"), "permission_error", "unavailable"),
        (BrokerUnavailable("down"), "server_error", "unavailable"),
        (mapping.unknown_model("m", "why"), "invalid_request_error", "model_not_found"),
    ],
)
def test_every_error_is_openais_form(error, kind: str, code: str) -> None:
    doc = mapping.error_document(error)
    assert doc == {
        "error": {
            "message": error.message,
            "type": kind,
            "param": getattr(error, "param", None),
            "code": code,
        }
    }


# -- embeddings --------------------------------------------------------------------------
def test_an_embedding_model_is_known_by_its_tensors(tmp_path: Path) -> None:
    model = mapping.EmbeddingModel.of(_entry(tmp_path, "e", EMBEDDER), 1, decoupled=False)
    assert (model.text, model.vector, model.width, model.rows) == ("TEXT", "VEC", 3, 8)
    assert model.counts_tokens
    assert [len(c) for c in model.chunks([str(i) for i in range(19)])] == [8, 8, 3]
    request = model.request(["a", "bc"])
    assert request.inputs[0].shape == (2, 1)
    assert tensors.raw_to_json("BYTES", (2, 1), request.inputs[0].raw) == ["a", "bc"]
    with pytest.raises(mapping.OpenAIError, match="decoupled"):
        mapping.EmbeddingModel.of(_entry(tmp_path, "e2", EMBEDDER), 1, decoupled=True)
    with pytest.raises(mapping.OpenAIError, match="BYTES input"):
        mapping.EmbeddingModel.of(_entry(tmp_path, "w", NEEDY), 1, decoupled=False)


def test_vectors_and_their_token_count(tmp_path: Path) -> None:
    model = mapping.EmbeddingModel.of(_entry(tmp_path, "e", EMBEDDER), 1, decoupled=False)
    vectors = np.arange(6, dtype="<f4").reshape(2, 3)
    outcome = InferOutcome(
        "e",
        1,
        InferRequest("", [], None, True, {}),
        [
            OutputTensor("VEC", "FP32", (2, 3), vectors.tobytes()),
            OutputTensor("num_input_tokens", "INT32", (2, 1), np.array([4, 5], "<i4").tobytes()),
        ],
        None,
        True,
    )
    rows, tokens = model.vectors(outcome, 2)
    np.testing.assert_array_equal(rows, vectors)
    assert tokens == 9


def test_the_openai_client_asks_for_base64_and_reads_ours_back() -> None:
    """openai 3.x sends ``encoding_format: base64`` when the caller names none, and
    decodes it to floats itself: conch's base64 must be what it decodes."""
    prepared = prepare_embedding_request(None, {"model": "m", "input": "x"}, encoding_format=omit)
    assert prepared.body["encoding_format"] == "base64"
    vector = np.array([0.5, -1.25, 3e-8], dtype=np.float32)
    doc = {
        "object": "list",
        "model": "m",
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
        "data": [mapping.embedding_item(0, vector, "base64")],
    }
    parsed = parse_embedding_response(
        CreateEmbeddingResponse.construct(**doc), encoding_format=omit
    )
    assert parsed.data[0].embedding == vector.tolist()
    assert mapping.embedding_item(0, vector, "float")["embedding"] == vector.tolist()


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": [[1, 2]]}, "input"),
        ({"input": [1, 2]}, "input"),
        ({"input": {"a": 1}}, "input"),
        ({"input": ["a"] * (mapping.MAX_EMBEDDING_INPUTS + 1)}, "input"),
    ],
)
def test_embedding_inputs_are_bounded_and_typed(doc, param: str) -> None:
    with pytest.raises(mapping.OpenAIError) as err:
        mapping.embedding_texts(doc)
    assert _param(err) == param and err.value.status == 400


def test_dimensions_and_encoding() -> None:
    mapping.check_dimensions({"dimensions": 3}, 3)
    mapping.check_dimensions({"dimensions": 5}, 0)  # a width not known yet
    with pytest.raises(mapping.OpenAIError):
        mapping.check_dimensions({"dimensions": 2}, 3)
    with pytest.raises(mapping.OpenAIError):
        mapping.check_dimensions({"dimensions": True}, 3)
    assert mapping.embedding_format({}) == "float"
    with pytest.raises(mapping.OpenAIError):
        mapping.embedding_format({"encoding_format": "int8"})


# -- completions --------------------------------------------------------------------------
def test_completion_fields_read_and_map_onto_the_models_inputs(tmp_path: Path) -> None:
    model = mapping.TextModel.of(_entry(tmp_path, "w", WORDS), 1)
    fields = mapping.completion_fields(
        {
            "model": "w",
            "prompt": ["hi"],
            "temperature": 1,
            "stop": "x",
            "stream": True,
            "top_p": 0.5,
        }
    )
    assert fields.prompt == "hi" and fields.stream and not fields.echo
    request = model.request(fields)
    got = {t.name: tensors.raw_to_json(t.datatype, t.shape, t.raw) for t in request.inputs}
    assert got["text_input"] == ["hi"] and got["stream"] == [True]
    assert got["max_tokens"] == [mapping.DEFAULT_MAX_TOKENS]  # OpenAI's default, sent
    assert got["temperature"] == [1.0] and got["stop_words"] == ["x"]
    assert "top_p" not in got  # the model has no such input
    sampling = json.loads(got["sampling_parameters"][0])
    assert sampling == {"temperature": 1.0, "top_p": 0.5, "stop": ["x"], "max_tokens": 16}
    assert model.echoes(mapping.completion_fields({"prompt": "a", "echo": True}))


def test_a_model_outside_the_convention_is_refused(tmp_path: Path) -> None:
    with pytest.raises(mapping.OpenAIError, match="lora") as err:
        mapping.TextModel.of(_entry(tmp_path, "n", NEEDY), 1)
    assert _param(err) == "model" and err.value.status == 400
    with pytest.raises(mapping.OpenAIError, match="text_input"):
        mapping.TextModel.of(_entry(tmp_path, "e", EMBEDDER), 1)


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "a", "max_tokens": 1.5}, "max_tokens"),
        ({"prompt": "a", "max_tokens": True}, "max_tokens"),
        ({"prompt": "a", "top_p": 2}, "top_p"),
        ({"prompt": "a", "seed": -1}, "seed"),
        ({"prompt": "a", "stop": ["", "x"]}, "stop"),
        ({"prompt": "a", "best_of": 3}, "best_of"),
        ({"prompt": "a", "suffix": "z"}, "suffix"),
        ({"prompt": "a", "logit_bias": {"1": 2}}, "logit_bias"),
        ({"prompt": "a", "echo": "yes"}, "echo"),
        ({"prompt": "a", "stream": True, "stream_options": []}, "stream_options"),
    ],
)
def test_completion_fields_are_checked(doc, param: str) -> None:
    with pytest.raises(mapping.OpenAIError) as err:
        mapping.completion_fields(doc)
    assert _param(err) == param


def test_usage_counts_the_prompt_once_and_adds_the_text() -> None:
    def outcome(prompt: int, text: int) -> InferOutcome:
        outs = [
            OutputTensor(name, "INT32", (1,), np.array([n], "<i4").tobytes())
            for name, n in (("num_input_tokens", prompt), ("num_output_tokens", text))
        ]
        return InferOutcome("m", 1, InferRequest("", [], None, True, {}), outs, None, False)

    usage = mapping.Usage()
    assert usage.document() is None
    for n in (2, 3):
        usage.add(outcome(7, n))
    assert usage.document() == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


def _said(word: str) -> InferOutcome:
    raw = tensors.encode_bytes_elements([word.encode()])
    out = OutputTensor("finish_reason", "BYTES", (1,), raw)
    return InferOutcome("m", 1, InferRequest("", [], None, True, {}), [out], None, False)


def _wrote(n: int) -> InferOutcome:
    out = OutputTensor("num_output_tokens", "INT32", (1,), np.array([n], "<i4").tobytes())
    return InferOutcome("m", 1, InferRequest("", [], None, True, {}), [out], None, False)


@pytest.mark.parametrize(
    ("outcomes", "limit", "reason"),
    [
        ([_wrote(2), _wrote(2)], 4, "length"),  # it wrote the max_tokens it was told
        ([_wrote(3)], 4, "stop"),  # fewer: it stopped
        ([_wrote(9)], None, "stop"),  # it takes no max_tokens: nothing cut it
        ([], 4, "stop"),  # it reports no counts: conch cannot tell, and says stop
        ([_wrote(1), _said("length")], 4, "length"),  # the model's own word comes first
        ([_wrote(4), _said("stop")], 4, "stop"),
        ([_wrote(4), _said("abort")], 4, "stop"),  # vLLM's other words are OpenAI's stop
        ([_said("length"), _said("")], 4, "length"),  # an empty word says nothing
    ],
)
def test_finish_reason_is_why_the_text_ended(outcomes, limit, reason) -> None:
    usage = mapping.Usage()
    for outcome in outcomes:
        usage.add(outcome)
    assert usage.finish_reason(limit) == reason


def test_the_token_limit_is_what_the_model_is_told(tmp_path: Path) -> None:
    model = mapping.TextModel.of(_entry(tmp_path, "w", WORDS), 1)
    assert model.token_limit(mapping.completion_fields({"prompt": "a"})) == 16
    assert model.token_limit(mapping.completion_fields({"prompt": "a", "max_tokens": 5})) == 5


# -- the routes in the app ----------------------------------------------------------------
@pytest.fixture()
def app(tmp_path: Path):
    # No Redis is reached: the app only connects on a request.
    return create_app(Settings(model_repository=tmp_path, redis_url="redis://127.0.0.1:1/0"))


@pytest.mark.parametrize(
    ("method", "path", "group"),
    [
        ("GET", "/v1/models", ApiGroup.METADATA),
        ("GET", "/v1/models/m", ApiGroup.METADATA),
        ("POST", "/v1/embeddings", ApiGroup.INFERENCE),
        ("POST", "/v1/completions", ApiGroup.INFERENCE),
    ],
)
def test_the_group_of_each_route(app, method: str, path: str, group: ApiGroup) -> None:
    endpoint, _ = app.url_map.bind("localhost").match(path, method=method)
    assert api_groups.group_of(app.view_functions[endpoint]) == group


def test_the_openapi_fragment_is_valid_openapi_and_covers_the_routes(app) -> None:
    doc = openapi.document()
    fragment = openai_routes.openapi_paths(
        openapi.GENERIC_ERRORS, {"$ref": "#/components/schemas/Error"}
    )
    assert {p: doc["paths"][p] for p in fragment} == fragment  # merged into the document
    validate(copy.deepcopy(doc))
    served = {
        (rule.rule.replace("<model>", "{model}"), m.lower())
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith("/v1/")
        for m in rule.methods or ()
        if m in ("GET", "POST")
    }
    assert served == {(p, m) for p, item in fragment.items() for m in item if m != "parameters"}
