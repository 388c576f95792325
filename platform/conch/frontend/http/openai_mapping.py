"""OpenAI's request and response bodies against a model's tensors, with no HTTP in it.

Two kinds of model are served through OpenAI's routes (``openai_routes``), each known by
its tensors rather than by a flag:

- **An embedding model** (``EmbeddingModel``, for ``/v1/embeddings``): not decoupled,
  one required BYTES input whose rows are one text each, and one floating-point output
  whose rows are one vector each. The shipped ``text_embedding`` is one. The texts of a
  request go as rows of one infer request, or of several when they are more than the
  model's ``max_batch_size``.
- **A text model** (``TextModel``, for ``/v1/completions``): Triton's convention for
  language models (its vLLM and TensorRT-LLM backends, and its OpenAI frontend), a
  BYTES input ``text_input`` and a BYTES output ``text_output``. The request's sampling
  fields go to the optional inputs of the same convention when the model has them
  (``max_tokens``, ``temperature``, ``stop_words``, ``stream``...), or as the JSON of a
  ``sampling_parameters`` input (vLLM's); a field the model has no input for is not sent.

Token counts follow the same convention: a model with the outputs ``num_input_tokens``
(and ``num_output_tokens``) reports them, and the answer's ``usage`` carries them. conch
counts no tokens itself: an embedding model without them reports 0 prompt tokens, and a
completion's ``usage`` is left out.

A completion's ``finish_reason`` says why its text ended, as OpenAI's does: ``length``
when ``max_tokens`` cut it, else ``stop``. The model's own word comes first (vLLM's
``finish_reason`` output, asked for with ``return_finish_reason``); else a model that
takes ``max_tokens`` and reports ``num_output_tokens`` was cut when it wrote that many.
A model that says neither is taken to have stopped.

Every refusal is an ``OpenAIError``: its status, and OpenAI's ``param`` and ``code``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conch.core import tensors
from conch.core.errors import ConchError
from conch.core.inference import InferRequest, InputTensor, RequestedOutput
from conch.core.repository import ModelEntry
from conch.frontend.dataplane import InferOutcome
from conch.frontend.http.generate import input_tensor

# The most texts one embeddings request may carry, and stop strings one completion: OpenAI's
# own bounds, so that a client written for OpenAI fits.
MAX_EMBEDDING_INPUTS = 2048
MAX_STOP_WORDS = 4
MAX_TOKENS = 2**31 - 1  # what an INT32 max_tokens input holds

TEXT_INPUT, TEXT_OUTPUT = "text_input", "text_output"
INPUT_TOKENS, OUTPUT_TOKENS = "num_input_tokens", "num_output_tokens"
FINISH_REASON = "finish_reason"  # vLLM's output: why its text ended
STOP, LENGTH = "stop", "length"  # OpenAI's finish reasons that conch can tell apart
_TOKEN_OUTPUTS = (INPUT_TOKENS, OUTPUT_TOKENS)
_FLOATS = ("FP16", "BF16", "FP32", "FP64")
ENCODINGS = ("float", "base64")


class OpenAIError(ConchError):
    """A refusal as OpenAI words it: its status, the body field at fault (``param``) and a
    short ``code`` (OpenAI's where it has one)."""

    def __init__(
        self, message: str, status: int = 400, *, param: str | None = None, code: str = ""
    ) -> None:
        super().__init__(message, status)
        self.param = param
        self.openai_code = code or ("invalid_value" if param else "invalid_request")


def error_document(exc: ConchError) -> dict[str, Any]:
    """``{"error": {...}}`` in OpenAI's form, for any conch error."""
    if exc.status == 401:
        kind = "authentication_error"
    elif exc.status == 403:
        kind = "permission_error"
    elif exc.status < 500:
        kind = "invalid_request_error"
    else:
        kind = "server_error"
    param = exc.param if isinstance(exc, OpenAIError) else None
    code = exc.openai_code if isinstance(exc, OpenAIError) else exc.code.lower()
    return {"error": {"message": exc.message, "type": kind, "param": param, "code": code}}


def unknown_model(name: str, why: str) -> OpenAIError:
    return OpenAIError(
        f"The model '{name}' does not exist or cannot serve requests: {why}",
        404,
        param="model",
        code="model_not_found",
    )


def not_for(name: str, route: str, why: str) -> OpenAIError:
    return OpenAIError(
        f"model '{name}' cannot serve {route}: {why}", param="model", code="model_not_supported"
    )


# -- reading the body ------------------------------------------------------------------
def model_field(doc: dict[str, Any]) -> str:
    name = doc.get("model")
    if name is None:
        raise OpenAIError("you must provide a model parameter", param="model", code="missing")
    if not isinstance(name, str) or not name:
        raise OpenAIError("'model' must be a non-empty string", param="model")
    return name


def _number(doc: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if type(value) not in (int, float) or not low <= value <= high:
        raise OpenAIError(f"'{key}' must be a number from {low} to {high}", param=key)
    return float(value)


def _integer(doc: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        raise OpenAIError(f"'{key}' must be an integer from {low} to {high}", param=key)
    return value


def _boolean(doc: dict[str, Any], key: str) -> bool:
    value = doc.get(key, False)
    if value is None:
        return False
    if type(value) is not bool:
        raise OpenAIError(f"'{key}' must be a boolean", param=key)
    return value


def _strings(value: Any, key: str, *, most: int) -> list[str]:
    """A string, or a list of strings, as a non-empty list of non-empty strings."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        if (
            isinstance(texts, list)
            and texts
            and all(type(t) is int or isinstance(t, list) for t in texts)
        ):
            raise OpenAIError(
                f"'{key}' as token ids is not supported: conch's models take text", param=key
            )
        raise OpenAIError(f"'{key}' must be a string or a list of strings", param=key)
    if not texts:
        raise OpenAIError(f"'{key}' must not be empty", param=key)
    if len(texts) > most:
        raise OpenAIError(f"'{key}' holds {len(texts)} items; at most {most} are taken", param=key)
    if any(not t for t in texts):
        raise OpenAIError(f"'{key}' must not hold an empty string", param=key)
    return texts


# -- the models ------------------------------------------------------------------------
def _optional(entry: ModelEntry) -> set[str]:
    assert entry.config is not None
    return {i.name for i in entry.config.input if i.optional}


def _rows_of_one(shape: Sequence[int]) -> bool:
    """A tensor whose first dimension is its rows, one element each."""
    return bool(shape) and shape[0] == -1 and all(d in (1, -1) for d in shape[1:])


@dataclass(frozen=True)
class EmbeddingModel:
    """An embedding model's tensors: its text input, its vector output, and how many
    texts one request may carry (``rows``, 0 for no bound of its own)."""

    name: str
    text: str
    text_shape: tuple[int, ...]
    vector: str
    width: int  # the vector's length; 0 where the config leaves it variable
    counts_tokens: bool
    rows: int

    @classmethod
    def of(cls, entry: ModelEntry, version: int, decoupled: bool) -> EmbeddingModel:
        """``entry`` read as an embedding model, or the 400 saying why it is none."""

        def refuse(why: str) -> OpenAIError:
            return not_for(entry.name, "embeddings", why)

        if decoupled:
            raise refuse("it is decoupled")
        meta = entry.metadata(version)
        optional = _optional(entry)
        required = [i for i in meta["inputs"] if i["name"] not in optional]
        if len(required) != 1 or required[0]["datatype"] != "BYTES":
            raise refuse("it does not take one BYTES input, a text per row")
        if not _rows_of_one(required[0]["shape"]):
            raise refuse(f"its input '{required[0]['name']}' does not take one text per row")
        vectors = [
            o
            for o in meta["outputs"]
            if o["datatype"] in _FLOATS and o["name"] not in _TOKEN_OUTPUTS
        ]
        if len(vectors) != 1 or not vectors[0]["shape"] or vectors[0]["shape"][0] != -1:
            raise refuse("it does not answer one floating-point vector per row")
        assert entry.config is not None
        dims = vectors[0]["shape"][1:]
        return cls(
            name=entry.name,
            text=required[0]["name"],
            text_shape=tuple(required[0]["shape"]),
            vector=vectors[0]["name"],
            width=0 if any(d < 0 for d in dims) else tensors.element_count(dims),
            counts_tokens=any(o["name"] == INPUT_TOKENS for o in meta["outputs"]),
            rows=entry.config.max_batch_size,
        )

    def chunks(self, texts: list[str]) -> list[list[str]]:
        step = self.rows or len(texts)
        return [texts[i : i + step] for i in range(0, len(texts), step)]

    def request(self, texts: list[str]) -> InferRequest:
        dims = (len(texts), *([1] * (len(self.text_shape) - 1)))
        raw = tensors.json_to_raw("BYTES", dims, texts, self.text)
        wanted = [RequestedOutput(self.vector, binary=True)]
        if self.counts_tokens:
            wanted.append(RequestedOutput(INPUT_TOKENS, binary=True))
        return InferRequest(
            id="",
            inputs=[InputTensor(self.text, "BYTES", dims, raw)],
            outputs=wanted,
            binary_data_output=True,
            parameters={},
        )

    def vectors(self, outcome: InferOutcome, count: int) -> tuple[np.ndarray, int]:
        """The answer's vectors (one float32 row per text) and its prompt tokens (0 when
        the model does not count them)."""
        by_name = {o.name: o for o in outcome.outputs}
        out = by_name.get(self.vector)
        if out is None:
            raise ConchError(f"model '{self.name}' answered without its output '{self.vector}'")
        arr = tensors.to_numpy(out.datatype, out.shape, out.raw, out.name)
        if out.datatype == "BF16":
            arr = (arr.astype("<u4") << 16).view("<f4")
        rows = np.asarray(arr, dtype="<f4").reshape(count, -1)
        return rows, _token_sum(by_name.get(INPUT_TOKENS))


def _token_sum(out: Any) -> int:
    if out is None or out.datatype in ("BYTES", *_FLOATS, "BOOL"):
        return 0
    return int(tensors.to_numpy(out.datatype, out.shape, out.raw, out.name).sum())


def embedding_format(doc: dict[str, Any]) -> str:
    fmt = doc.get("encoding_format")
    if fmt is None:
        return "float"  # OpenAI's default (its Python client asks for base64 itself)
    if fmt not in ENCODINGS:
        raise OpenAIError("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    return fmt


def embedding_texts(doc: dict[str, Any]) -> list[str]:
    if "input" not in doc:
        raise OpenAIError("you must provide an input", param="input", code="missing")
    return _strings(doc["input"], "input", most=MAX_EMBEDDING_INPUTS)


def check_dimensions(doc: dict[str, Any], width: int) -> None:
    """A ``dimensions`` other than the model's own ``width`` is refused (0: not known
    yet, so any is taken for now): conch does not shorten a vector."""
    asked = _integer(doc, "dimensions", 1, 1 << 20)
    if asked is not None and width and asked != width:
        raise OpenAIError(
            f"'dimensions' must be this model's own ({width}): conch does not shorten vectors",
            param="dimensions",
        )


def embedding_item(index: int, vector: np.ndarray, fmt: str) -> dict[str, Any]:
    """One text's vector as OpenAI writes it: floats, or base64 of little-endian float32."""
    row = np.ascontiguousarray(vector, dtype="<f4")
    data: Any = base64.b64encode(row.tobytes()).decode() if fmt == "base64" else row.tolist()
    return {"object": "embedding", "index": index, "embedding": data}


# -- completions -------------------------------------------------------------------------
@dataclass
class Completion:
    """A completions request's fields as read: the prompt, and those the model may take."""

    prompt: str
    stream: bool
    echo: bool
    include_usage: bool
    sampling: dict[str, Any] = field(default_factory=dict)  # OpenAI's names, as given


_SAMPLING_NUMBERS = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
}


def completion_fields(doc: dict[str, Any]) -> Completion:
    """The body of ``/v1/completions``. What conch honours for no model (several
    choices, log probabilities, a suffix, a logit bias) is a 400, not ignored."""
    if "prompt" not in doc:
        raise OpenAIError("you must provide a prompt", param="prompt", code="missing")
    prompts = _strings(doc["prompt"], "prompt", most=1)
    stream = _boolean(doc, "stream")
    options = doc.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise OpenAIError(
            "'stream_options' is taken only as an object with 'stream' true", param="stream_options"
        )
    include_usage = _boolean(options or {}, "include_usage")
    for key, refused in (("n", 1), ("best_of", 1)):
        if _integer(doc, key, 1, 128) not in (None, refused):
            raise OpenAIError(
                f"'{key}' above 1 is not supported: one choice per request", param=key
            )
    if _integer(doc, "logprobs", 0, 5):
        raise OpenAIError("'logprobs' is not supported", param="logprobs")
    if doc.get("suffix") is not None:
        raise OpenAIError("'suffix' is not supported", param="suffix")
    if doc.get("logit_bias"):
        raise OpenAIError("'logit_bias' is not supported", param="logit_bias")
    sampling: dict[str, Any] = {}
    for key, (low, high) in _SAMPLING_NUMBERS.items():
        value = _number(doc, key, low, high)
        if value is not None:
            sampling[key] = value
    for key, high in (("max_tokens", MAX_TOKENS), ("seed", 2**63 - 1)):
        value = _integer(doc, key, 0 if key == "seed" else 1, high)
        if value is not None:
            sampling[key] = value
    if doc.get("stop") is not None:
        sampling["stop"] = _strings(doc["stop"], "stop", most=MAX_STOP_WORDS)
    return Completion(prompts[0], stream, _boolean(doc, "echo"), include_usage, sampling)


# OpenAI's field -> the input Triton's convention names for it.
_SAMPLING_INPUTS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "seed": "seed",
    "stop": "stop_words",
}
ECHO_INPUT = "exclude_input_in_output"
SAMPLING_JSON = "sampling_parameters"  # vLLM's: every sampling field as one JSON text
DEFAULT_MAX_TOKENS = 16  # OpenAI's default, sent to a model that takes max_tokens


@dataclass(frozen=True)
class TextModel:
    """A model of Triton's text convention: its inputs by name (metadata), and whether
    it reports its token counts."""

    name: str
    inputs: dict[str, dict[str, Any]]
    counts_tokens: bool

    @classmethod
    def of(cls, entry: ModelEntry, version: int) -> TextModel:
        meta = entry.metadata(version)
        inputs = {i["name"]: i for i in meta["inputs"]}
        outputs = {o["name"]: o for o in meta["outputs"]}
        text_in, text_out = inputs.get(TEXT_INPUT), outputs.get(TEXT_OUTPUT)
        if text_in is None or text_in["datatype"] != "BYTES":
            raise not_for(entry.name, "completions", f"it has no BYTES input '{TEXT_INPUT}'")
        if text_out is None or text_out["datatype"] != "BYTES":
            raise not_for(entry.name, "completions", f"it has no BYTES output '{TEXT_OUTPUT}'")
        known = {TEXT_INPUT, ECHO_INPUT, SAMPLING_JSON, "stream", *_SAMPLING_INPUTS.values()}
        known |= {"return_num_input_tokens", "return_num_output_tokens", "return_finish_reason"}
        unknown = sorted(set(inputs) - known - _optional(entry))
        if unknown:
            raise not_for(
                entry.name, "completions", f"it requires inputs conch cannot fill: {unknown}"
            )
        return cls(entry.name, inputs, INPUT_TOKENS in outputs)

    def request(self, fields: Completion) -> InferRequest:
        """The infer request for ``fields``: the prompt, and each field the model takes."""
        values: dict[str, Any] = {TEXT_INPUT: fields.prompt, "stream": fields.stream}
        sampling = dict(fields.sampling)
        if "max_tokens" in self.inputs or SAMPLING_JSON in self.inputs:
            sampling.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        for key, value in sampling.items():
            values[_SAMPLING_INPUTS[key]] = value
        if SAMPLING_JSON in self.inputs:
            values[SAMPLING_JSON] = json.dumps(sampling)
        values[ECHO_INPUT] = not fields.echo
        values["return_num_input_tokens"] = values["return_num_output_tokens"] = True
        values["return_finish_reason"] = True
        built = [
            input_tensor(name, self.inputs[name]["datatype"], self.inputs[name]["shape"], value)
            for name, value in values.items()
            if name in self.inputs
        ]
        return InferRequest(
            id="", inputs=built, outputs=None, binary_data_output=True, parameters={}
        )

    def token_limit(self, fields: Completion) -> int | None:
        """The most tokens the model is told to write (``request`` sends it), None when
        it takes no ``max_tokens``."""
        if "max_tokens" in self.inputs or SAMPLING_JSON in self.inputs:
            return int(fields.sampling.get("max_tokens", DEFAULT_MAX_TOKENS))
        return None

    def echoes(self, fields: Completion) -> bool:
        """Whether conch puts the prompt ahead of the text itself (the model cannot)."""
        return fields.echo and ECHO_INPUT not in self.inputs


def response_text(outcome: InferOutcome) -> str:
    """A response's ``text_output``, its elements joined ("" for a response without)."""
    for out in outcome.outputs:
        if out.name == TEXT_OUTPUT:
            return "".join(tensors.raw_to_json(out.datatype, out.shape, out.raw, out.name))
    return ""


@dataclass
class Usage:
    """Token counts as responses report them: the prompt's once, the text's added up;
    and the model's own word on why its text ended, if it says (its last)."""

    prompt: int | None = None
    completion: int = 0
    counted: bool = False  # a response reported the text's tokens
    said: str = ""

    def add(self, outcome: InferOutcome) -> None:
        by_name = {o.name: o for o in outcome.outputs}
        if INPUT_TOKENS in by_name and self.prompt is None:
            self.prompt = _token_sum(by_name[INPUT_TOKENS])
        self.counted = self.counted or OUTPUT_TOKENS in by_name
        self.completion += _token_sum(by_name.get(OUTPUT_TOKENS))
        said = by_name.get(FINISH_REASON)
        if said is not None and said.datatype == "BYTES":
            words = tensors.raw_to_json(said.datatype, said.shape, said.raw, said.name)
            self.said = next((w for w in words if w), self.said)

    def finish_reason(self, limit: int | None) -> str:
        """Why the text ended (the module docstring): ``limit`` is the ``max_tokens`` the
        model was told, None when it takes none."""
        if self.said:
            return LENGTH if self.said == LENGTH else STOP
        if limit is not None and self.counted and self.completion >= limit:
            return LENGTH
        return STOP

    def document(self) -> dict[str, int] | None:
        if self.prompt is None:
            return None
        total = self.prompt + self.completion
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": total,
        }


def completion_document(
    call_id: str,
    created: int,
    model: str,
    text: str | None,
    finish: str | None,
    usage: dict[str, int] | None,
) -> dict[str, Any]:
    """A ``text_completion`` object: the whole answer, or one streamed chunk of it (a
    ``text`` of None is the usage chunk, with no choice). ``finish``: the choice's
    ``finish_reason`` on the last chunk, None on the others."""
    choices: list[dict[str, Any]] = []
    if text is not None:
        choices.append({"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
    doc: dict[str, Any] = {
        "id": call_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        doc["usage"] = usage
    return doc
