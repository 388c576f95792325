"""A long document split into passages that ``text_embedding`` embeds whole.

The document is tokenized once with the tokenizer of ``text_embedding`` (its first step's
``tokenizer.json``), without the special tokens, without the cut at the model's longest
input and without padding. A passage is then a run of whole words, counted in the
tokenizer's tokens (word pieces), at most ``size`` tokens long:

- Passages start and end on word boundaries (the tokenizer's words: punctuation marks and
  CJK characters are words of their own), so a passage's text, tokenized alone, gives the
  same tokens it had in the document and is never cut by the embedding model. A word longer
  than ``size`` tokens (a long URL, say) is the one exception: it is cut into pieces of
  ``size`` tokens.
- Each passage after the first starts at the earliest word that keeps at most ``overlap``
  of the previous passage's tokens, and always after the previous passage's first word, so
  consecutive passages share up to ``overlap`` tokens and the split always moves on.
- A passage's ``start`` and ``end`` are character offsets (Python ``str`` indices, end
  excluded) into the document; its text is ``document[start:end]``. The characters outside
  every passage are the ones the tokenizer drops: whitespace and control characters.
- A document with no tokens (empty, or whitespace only) has no passages.

Kept apart from ``model.py`` so the tests split documents with the very same code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tokenizers import Tokenizer

FILE = "tokenizer.json"
# The embedding model reads [CLS], the passage, [SEP]: two tokens of its longest input.
SPECIAL_TOKENS = 2
# Shorter passages say too little to embed well, and cost a model call each.
MIN_SIZE = 16


@dataclass(frozen=True)
class Passage:
    """One passage: its place in the document and its text."""

    index: int
    start: int  # character offset of its first character
    end: int  # character offset just past its last character
    text: str
    tokens: int


@dataclass(frozen=True)
class Splitter:
    """The tokenizer (no cut, no padding) and the longest passage it allows."""

    tokenizer: Tokenizer
    max_size: int

    def bounds(self, size: int, overlap: int) -> str | None:
        """Why ``size`` and ``overlap`` cannot split a document, or None when they can."""
        if not MIN_SIZE <= size <= self.max_size:
            return f"PASSAGE_TOKENS must be from {MIN_SIZE} to {self.max_size}, got {size}"
        if not 0 <= overlap <= size // 2:
            return (
                f"OVERLAP_TOKENS must be from 0 to half of PASSAGE_TOKENS ({size // 2}), "
                f"got {overlap}"
            )
        return None

    def split(self, document: str, size: int, overlap: int) -> list[Passage]:
        """``document``'s passages in order (see the module's docstring)."""
        problem = self.bounds(size, overlap)
        if problem is not None:
            raise ValueError(problem)
        encoding = self.tokenizer.encode(document, add_special_tokens=False)
        offsets = encoding.offsets
        units = _units(encoding.word_ids, size)
        out: list[Passage] = []
        first = 0
        while first < len(units):
            last = _window_end(units, first, size)
            start, end = offsets[units[first][0]][0], offsets[units[last - 1][1] - 1][1]
            tokens = units[last - 1][1] - units[first][0]
            out.append(Passage(len(out), start, end, document[start:end], tokens))
            if last == len(units):
                break
            first = _next_first(units, first, last, overlap)
        return out


def load(folder: str) -> Splitter:
    """The splitter for the tokenizer written in ``folder`` (``text_embedding_tokenizer``'s
    version folder), which says how long the embedding model's input may be."""
    path = os.path.join(folder, FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} is missing: it is built, not committed; run `make functions` "
            "(functions/build_text_embedding.py)"
        )
    tokenizer = Tokenizer.from_file(path)
    longest = (tokenizer.truncation or {}).get("max_length")
    if not longest:
        raise ValueError(f"{path} sets no cut: cannot tell how long a passage may be")
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return Splitter(tokenizer, longest - SPECIAL_TOKENS)


def _units(word_ids: list[int | None], size: int) -> list[tuple[int, int]]:
    """Token ranges ``[first, end)`` a passage is made of: each word's tokens, a word
    longer than ``size`` tokens cut into pieces of ``size``."""
    words: list[list[int]] = []
    previous = object()
    for i, word in enumerate(word_ids):
        if word is None or word != previous or not words:
            words.append([i, i + 1])
        else:
            words[-1][1] = i + 1
        previous = word
    units = []
    for first, end in words:
        units.extend((s, min(s + size, end)) for s in range(first, end, size))
    return units


def _window_end(units: list[tuple[int, int]], first: int, size: int) -> int:
    """The end (exclusive) of the longest run of units from ``first`` within ``size``
    tokens; at least one unit, which is never longer than ``size``."""
    last = first + 1
    while last < len(units) and units[last][1] - units[first][0] <= size:
        last += 1
    return last


def _next_first(units: list[tuple[int, int]], first: int, last: int, overlap: int) -> int:
    """Where the passage after ``units[first:last]`` starts: the earliest unit that keeps
    at most ``overlap`` of its tokens, and never ``first`` itself."""
    end = units[last - 1][1]
    start = last
    while start - 1 > first and end - units[start - 1][0] <= overlap:
        start -= 1
    return start
