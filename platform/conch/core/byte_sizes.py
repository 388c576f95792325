"""Sizes in bytes as flags take them: ``1048576``, ``512M``, ``64G`` (binary units).

One reader for every size flag (``--model-memory-budget``, ``conch sync
--max-object-bytes``), so they all take the same forms.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_byte_size(text: str) -> int:
    """The bytes ``text`` says; ValueError naming the forms when it says none."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 1048576, 512M, 64G)")
    return int(m[1]) * _UNITS[m[2].upper()]


__all__ = ["parse_byte_size"]
