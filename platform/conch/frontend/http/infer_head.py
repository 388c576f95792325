"""The head of an infer call in its plain form, read without gunicorn's parser.

Almost every infer call a client sends has one shape: ``POST /v2/models/<m>/infer``,
HTTP/1.1 or 1.0, a ``Content-Length`` and a handful of ordinary headers. ``parse``
reads exactly that shape and nothing else: anything unusual (a chunked or expected
body, a folded or malformed header line, a second length, a percent-encoded or query
path, an upgrade) is not an error here but ``None``, and the gateway hands the bytes to
gunicorn's own parser, which answers the odd and the malformed as it always has. So a
request is either read the simple way or the strict way, never half one and half the
other. Profiled: gunicorn's per-request header handling (config lookups, header
policies, address parsing for proxies) was a fifth of the gateway's CPU per call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conch.frontend.http.fast_path import INFER_PATH, InferCall, path_model

MAX_HEAD_BYTES = 16 * 1024  # longer heads go to gunicorn, whose own limits then apply
MAX_HEADERS = 64
# Every header line well formed, at once: an RFC 9110 field-name, a colon, and a value of
# visible characters, spaces and tabs (no other control character), each line ending CRLF.
_HEADER_BLOCK = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*")
# Headers whose presence means a body or connection handling the simple path lacks.
_DEFER = frozenset(("transfer-encoding", "expect", "upgrade", "http2-settings", "te"))


@dataclass(slots=True)  # not frozen: made once a call, where frozen costs several times more
class InferHead:
    call: InferCall  # the path's model and version, for ``fast_path.serve_infer``
    http: tuple[int, int]
    headers: dict[str, str]  # lower-case names
    length: int
    close: bool  # the client asked to close after this response

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def model(self) -> str:
        return path_model(self.call)

    @property
    def version(self) -> str:
        """The URL's version segment, "" for none."""
        return self.call.group(2) or ""


def parse(buf: bytes, end: int, max_head: int = MAX_HEAD_BYTES) -> InferHead | None:
    """The infer call whose head is ``buf[:end]`` (``end`` at its blank line), or None
    when it is anything else, or anything but the plain form, or longer than
    ``max_head``."""
    if end > min(max_head, MAX_HEAD_BYTES):
        return None
    line_end = buf.find(b"\r\n", 0, end)
    if line_end < 0:
        return None  # no header at all, so no Content-Length
    request_line = buf[:line_end].split(b" ")
    if len(request_line) != 3 or request_line[0] != b"POST":
        return None
    target, proto = request_line[1], request_line[2]
    if proto == b"HTTP/1.1":
        http = (1, 1)
    elif proto == b"HTTP/1.0":
        http = (1, 0)
    else:
        return None
    if not target.isascii() or b"%" in target or b"?" in target or b"#" in target:
        return None
    match = INFER_PATH.fullmatch(target.decode("ascii"))
    if match is None:
        return None
    block = buf[line_end + 2 : end + 2]  # every header line with its CRLF
    if _HEADER_BLOCK.fullmatch(block) is None:
        return None  # also a folded continuation line: it starts with a space
    # Decoded once: the names are ASCII tokens (checked above), the values latin-1.
    lines = block.decode("latin-1").split("\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        return None
    headers: dict[str, str] = {}
    length: str | None = None
    for line in lines[:-1]:
        name, _, value = line.partition(":")
        key = name.lower()
        if key in _DEFER:
            return None
        text = value.strip(" \t")
        if key == "content-length":
            # ASCII digits only: str.isdigit also takes "²", which int() refuses.
            if length is not None or not (text.isascii() and text.isdigit()) or len(text) > 18:
                return None
            length = text
        headers.setdefault(key, text)
    if length is None:
        return None
    connection = headers.get("connection")
    if connection is None:
        close = http == (1, 0)
    else:
        tokens = {t.strip().lower() for t in connection.split(",")}
        close = "close" in tokens if http == (1, 1) else "keep-alive" not in tokens
    return InferHead(match, http, headers, int(length), close)
