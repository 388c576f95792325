"""HTTP framing of Triton's infer bodies: the JSON documents plus what only HTTP adds.

The documents themselves (``conch.frontend.v2_json``) are shared with the batch-job
lines, which run in worker processes and must not import this package. What is HTTP's
own lives here:

- the binary tensor extension: input tensors as raw bytes after the JSON, whose length
  the ``Inference-Header-Content-Length`` header gives, and outputs sent the same way;
  and its one-input form, a *raw binary request* (that header 0: the whole body is the
  one input's bytes, described by the model's config; ``raw_request``);
- ``Content-Encoding`` of the request (gzip, deflate), bounded against zip bombs;
- ``Accept-Encoding``: the response compressed when the client accepts it.
- an infer call's inputs and outputs in shared-memory regions (``decode_request``'s
  ``shm``, ``conch.frontend.shared_memory``): an output written to its region is answered
  with its name, datatype and shape only, as Triton answers it.

``decode_request`` turns a body and two headers into an ``InferRequest`` with tensors in
raw (Triton binary) form; ``encode_response`` turns raw output tensors back into a body
that tritonclient, the C++ client and perf_analyzer read. Binary tensors are sliced out
of the body and appended to the response as they are: never re-encoded.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import TYPE_CHECKING, Any

from conch.core.datatypes import ITEMSIZE
from conch.core.errors import InvalidArgument
from conch.core.inference import InferRequest, InputTensor, OutputTensor
from conch.core.model_config import wire_type
from conch.frontend import shared_memory, v2_json
from conch.frontend.dataplane import CollectedOutcome, InferOutcome

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

HEADER_LENGTH = "Inference-Header-Content-Length"


# --------------------------------------------------------------------------- request

_RAISE_IT = "Use --http-max-input-size to increase the limit."


def too_large(length: int, limit: int, header_length: str | None = None) -> InvalidArgument:
    """A body of ``length`` bytes over ``--http-max-input-size`` (``limit``), in Triton's
    words for what it holds, which ``header_length`` (``Inference-Header-Content-Length``,
    None when absent) tells: a raw binary request's one input ("0"), else a JSON document
    (the whole body, or its JSON part when that alone is over). A body whose JSON part is
    within the limit and whose binary tensors are not is refused too, in conch's words:
    Triton counts those per input."""
    if header_length == "0":
        return InvalidArgument(
            f"Raw input has a byte_size ({length} bytes) that exceeds the maximum allowed "
            f"value of {limit} bytes. {_RAISE_IT}"
        )
    json_length = length if not header_length else _int_or_zero(header_length)
    if json_length > limit:
        return InvalidArgument(
            f"request JSON size of {json_length} bytes exceeds the maximum allowed input size "
            f"of {limit} bytes. {_RAISE_IT}"
        )
    return InvalidArgument(
        f"request body of {length} bytes exceeds the maximum allowed input size of {limit} "
        f"bytes. {_RAISE_IT}"
    )


def _int_or_zero(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _decompress(
    body: bytes | memoryview, encoding: str | None, max_body_bytes: int
) -> bytes | memoryview:
    """Inflate a gzip/deflate body, never producing more than ``max_body_bytes``.

    Decompression is bounded with ``max_length`` so a small "zip bomb" costs at most
    ``max_body_bytes`` of memory before it is refused.
    """
    enc = (encoding or "").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif enc == "deflate":
        wbits = zlib.MAX_WBITS  # HTTP "deflate" is the zlib format
    else:
        raise InvalidArgument(f"unsupported Content-Encoding '{encoding}'; use gzip or deflate")
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, max_body_bytes + 1)
    except zlib.error as e:
        raise InvalidArgument(f"failed to decompress {enc} request body: {e}") from None
    if len(out) > max_body_bytes:
        raise InvalidArgument(
            f"Decompressed data size exceeds the maximum allowed value of {max_body_bytes} "
            f"bytes. {_RAISE_IT}"
        )
    if not d.eof:
        raise InvalidArgument(f"failed to decompress {enc} request body: data is truncated")
    if d.unused_data:
        raise InvalidArgument(
            f"failed to decompress {enc} request body: {len(d.unused_data)} bytes follow "
            f"the compressed stream"
        )
    return out


def decode_request(
    body: bytes | memoryview,
    header_length: str | None,
    content_encoding: str | None,
    *,
    max_body_bytes: int,
    config: ModelConfig | None = None,
    model_name: str = "",
    shm: v2_json.SharedMemoryPort | None = None,
) -> InferRequest:
    """Parse an infer request body into raw-tensor form, validating its structure.

    ``header_length`` is the ``Inference-Header-Content-Length`` header as received; it
    counts bytes of the *decompressed* body, as the clients compute it. As Triton reads
    it, a JSON part of 0 bytes (the header 0, or no header and an empty body) is a raw
    binary request: ``raw_request`` on the model's ``config`` (named ``model_name``).
    """
    if len(body) > max_body_bytes:
        raise too_large(len(body), max_body_bytes, header_length)
    body = _decompress(body, content_encoding, max_body_bytes)
    size = len(body)

    if header_length is None or header_length == "":
        json_len = size
    else:
        try:
            json_len = int(header_length)
        except ValueError:
            raise InvalidArgument(
                f"invalid {HEADER_LENGTH} header '{header_length}': expected an integer"
            ) from None
        if json_len < 0 or json_len > size:
            raise InvalidArgument(
                f"{HEADER_LENGTH} {json_len} is out of range for a body of {size} bytes"
            )
    if json_len == 0:
        if config is None:  # a caller with no model to describe the tensor
            raise InvalidArgument(f"raw binary requests ({HEADER_LENGTH}: 0) need a model")
        return raw_request(body, config, model_name or config.name)

    view = memoryview(body)
    offset = json_len

    def binary(name: str, nbytes: int) -> memoryview:
        nonlocal offset
        end = offset + nbytes
        if end > size:
            raise InvalidArgument(
                f"unexpected size for input '{name}': binary_data_size is {nbytes} but "
                f"only {size - offset} bytes of binary data remain"
            )
        raw = view[offset:end]  # the body's bytes, as they are: packed into the message
        offset = end
        return raw

    request = v2_json.decode_request(bytes(view[:json_len]), binary, shm)
    if offset != size:
        raise InvalidArgument(
            f"unexpected additional input data: {size - offset} bytes after the last input"
        )
    return request


def raw_request(data: bytes | memoryview, config: ModelConfig, model_name: str) -> InferRequest:
    """A raw binary request: ``data`` is the whole of the model's one input.

    Triton's rules (its core's request normalization): the model has exactly one input,
    whose name and datatype the config gives; its shape is the config's dims, behind a
    batch dimension of 1 when the model batches; at most one dim is variable (-1), and
    it takes what ``data``'s size leaves for it. A BYTES input must be one element (no
    variable dim), and ``data`` is that element (its 4-byte length is put before it).
    No id, no parameters; every output of the model is answered, in binary form.
    """
    if len(config.input) != 1:
        raise InvalidArgument(
            f"Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(config.input)} inputs in '{model_name}' model configuration"
        )
    spec = config.input[0]
    name = spec.name
    datatype = wire_type(spec.data_type)
    shape = [1] if config.max_batch_size != 0 else []
    variable = -1
    fixed = 1  # elements of the fixed dims
    for dim in spec.dims:
        if dim == -1:
            if variable != -1:
                raise InvalidArgument(
                    f"The shape of the raw input '{name}' can not be deduced because there "
                    f"are more than one variable-sized dimension"
                )
            variable = len(shape)
        else:
            fixed *= int(dim)
        shape.append(int(dim))
    if datatype == "BYTES":
        if variable != -1 or fixed != 1:
            raise InvalidArgument(
                f"For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )
        return _raw_only(InputTensor(name, datatype, tuple(shape), _U32.pack(len(data)) + data))
    itemsize = ITEMSIZE[datatype]
    if variable != -1:
        per_step = fixed * itemsize
        shape[variable] = len(data) // per_step if per_step else 0
    expected = fixed * itemsize * (shape[variable] if variable != -1 else 1)
    if len(data) != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}' for model '{model_name}'. "
            f"Expected {expected}, got {len(data)}"
        )
    return _raw_only(InputTensor(name, datatype, tuple(shape), data))


_U32 = struct.Struct("<I")  # a BYTES element's length, as Triton's raw bytes carry it


def _raw_only(tensor: InputTensor) -> InferRequest:
    """The request a raw body makes: its one input, every output, all binary."""
    return InferRequest(
        id="", inputs=[tensor], outputs=None, binary_data_output=True, parameters={}
    )


# -------------------------------------------------------------------------- response


def _pick_encoding(accept_encoding: str | None) -> str | None:
    """gzip or deflate if the client accepts either (gzip preferred), else None."""
    if not accept_encoding:
        return None
    accepted: set[str] = set()
    for item in accept_encoding.split(","):
        token, _, params = item.strip().partition(";")
        q = 1.0
        for p in params.split(";"):
            key, _, val = p.strip().partition("=")
            if key.strip() == "q":
                try:
                    q = float(val)
                except ValueError:
                    q = 0.0
        if q > 0:
            accepted.add(token.strip().lower())
    for enc in ("gzip", "deflate"):
        if enc in accepted:
            return enc
    return None


def _compress(data: bytes, encoding: str) -> bytes:
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    c = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return c.compress(data) + c.flush()


def encode_response(
    *,
    model_name: str,
    model_version: str,
    request_id: str,
    outputs: list[OutputTensor],
    request: InferRequest,
    labels: dict[str, list[str]] | None = None,
    batched: bool = False,
    accept_encoding: str | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Build the response body and headers for ``outputs`` as ``request`` asked for them
    (``v2_json.select_outputs``): binary outputs are appended to the JSON as they are."""
    entries: list[dict[str, Any]] = []
    raws: list[bytes] = []
    any_binary = False
    selected = v2_json.select_outputs(
        outputs, request, model_name=model_name, labels=labels, batched=batched
    )
    slots = shared_memory.output_slots(request.outputs)  # outputs written to regions
    for out, binary in selected:
        slot = slots.get(out.name)
        if slot is not None:  # the bytes go into the region: the entry has no data
            slot.write(out.raw)  # and no parameters, as Triton's (its C++ client reads
            entry = v2_json.output_header(out)  # any output parameters as binary data)
        elif binary:
            any_binary = True
            entry = v2_json.output_header(out)
            entry["parameters"] = {"binary_data_size": len(out.raw)}
            if out.raw:
                raws.append(out.raw)
        else:
            entry = v2_json.output_data(out)
        entries.append(entry)
    header = v2_json.response_document(model_name, model_version, request_id, entries)

    headers: dict[str, str] = {}
    if any_binary:
        body = b"".join([header, *raws])  # each output's bytes copied once, as they came
        headers["Content-Type"] = "application/octet-stream"
        # The length of the uncompressed JSON, as Triton sends it even when compressing.
        headers[HEADER_LENGTH] = str(len(header))
    else:
        body = header
        headers["Content-Type"] = "application/json"
    return _compressed(body, headers, accept_encoding)


def _compressed(
    body: bytes, headers: dict[str, str], accept_encoding: str | None
) -> tuple[bytes, dict[str, str]]:
    """``body`` compressed as the client accepts, if it does."""
    encoding = _pick_encoding(accept_encoding)
    if encoding is not None:
        body = _compress(body, encoding)
        headers["Content-Encoding"] = encoding
    return body, headers


def encode_outcome(
    outcome: InferOutcome, accept_encoding: str | None
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers that answer an infer call (or an async job's result)."""
    return encode_response(
        model_name=outcome.model,
        model_version=str(outcome.version),
        request_id=outcome.request.id,
        outputs=outcome.outputs,
        request=outcome.request,
        labels=outcome.labels,
        batched=outcome.batched,
        accept_encoding=accept_encoding,
    )


def encode_collected(
    collected: CollectedOutcome, accept_encoding: str | None
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers of a decoupled model's async job result: every response
    (``v2_json.responses_document``)."""
    responses = [
        v2_json.json_outputs(
            o.outputs, o.request, model_name=o.model, labels=o.labels, batched=o.batched
        )
        for o in collected.responses
    ]
    body = v2_json.responses_document(
        collected.model, str(collected.version), collected.request_id, responses
    )
    return _compressed(body, {"Content-Type": "application/json"}, accept_encoding)


def error_body(message: str) -> bytes:
    """Triton's error body, which every client reads on any non-200 status."""
    return json.dumps({"error": message}).encode()
