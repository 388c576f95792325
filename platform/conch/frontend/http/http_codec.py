"""HTTP framing of Triton's infer bodies: the JSON documents plus what only HTTP adds.

The documents themselves (``conch.frontend.v2_json``) are shared with the batch-job
lines, which run in worker processes and must not import this package. What is HTTP's
own lives here:

- the binary tensor extension: input tensors as raw bytes after the JSON, whose length
  the ``Inference-Header-Content-Length`` header gives, and outputs sent the same way;
- ``Content-Encoding`` of the request (gzip, deflate), bounded against zip bombs;
- ``Accept-Encoding``: the response compressed when the client accepts it.

``decode_request`` turns a body and two headers into an ``InferRequest`` with tensors in
raw (Triton binary) form; ``encode_response`` turns raw output tensors back into a body
that tritonclient, the C++ client and perf_analyzer read. Binary tensors are sliced out
of the body and appended to the response as they are: never re-encoded.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from conch.core.errors import InvalidArgument
from conch.core.inference import InferRequest, OutputTensor
from conch.frontend import v2_json
from conch.frontend.dataplane import InferOutcome

HEADER_LENGTH = "Inference-Header-Content-Length"


# --------------------------------------------------------------------------- request


def _decompress(body: bytes, encoding: str | None, max_body_bytes: int) -> bytes:
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
            f"decompressed request body exceeds the maximum of {max_body_bytes} bytes"
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
    body: bytes,
    header_length: str | None,
    content_encoding: str | None,
    *,
    max_body_bytes: int,
) -> InferRequest:
    """Parse an infer request body into raw-tensor form, validating its structure.

    ``header_length`` is the ``Inference-Header-Content-Length`` header as received; it
    counts bytes of the *decompressed* body, as the clients compute it.
    """
    if len(body) > max_body_bytes:
        raise InvalidArgument(
            f"request body of {len(body)} bytes exceeds the maximum of {max_body_bytes} bytes"
        )
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
            raise InvalidArgument(f"raw binary requests ({HEADER_LENGTH}: 0) are not supported")

    view = memoryview(body)
    offset = json_len

    def binary(name: str, nbytes: int) -> bytes:
        nonlocal offset
        end = offset + nbytes
        if end > size:
            raise InvalidArgument(
                f"unexpected size for input '{name}': binary_data_size is {nbytes} but "
                f"only {size - offset} bytes of binary data remain"
            )
        raw = bytes(view[offset:end])
        offset = end
        return raw

    request = v2_json.decode_request(bytes(view[:json_len]), binary)
    if offset != size:
        raise InvalidArgument(
            f"unexpected additional input data: {size - offset} bytes after the last input"
        )
    return request


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
    for out, binary in selected:
        if binary:
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
        body = header + b"".join(raws)
        headers["Content-Type"] = "application/octet-stream"
        # The length of the uncompressed JSON, as Triton sends it even when compressing.
        headers[HEADER_LENGTH] = str(len(header))
    else:
        body = header
        headers["Content-Type"] = "application/json"

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


def error_body(message: str) -> bytes:
    """Triton's error body, which every client reads on any non-200 status."""
    return json.dumps({"error": message}).encode()
