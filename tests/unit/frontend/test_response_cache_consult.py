"""``response_cache.consult``, the one lookup of the data plane's infer calls and of each
ensemble step: none for a model that does not use the cache, a hit counted as it is
found, a miss's answer kept only for the version it was looked up under. The store is
the real per-process one; the statistics tally is a stand-in that records what it adds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from conch.core.model_config import parse_config
from conch.frontend.response_cache import LocalStore, ResponseCache, consult
from conch.wire.messages import WireTensor

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
Y = WireTensor("Y", "FP32", (1, 1), b"\1\0\0\0")


class Tally:
    def __init__(self) -> None:
        self.added: list[tuple[str, int, dict[str, int]]] = []

    def add(self, model: str, version: int, counts: dict[str, int]) -> None:
        self.added.append((model, version, counts))


def cache() -> tuple[ResponseCache, Tally]:
    made = ResponseCache(LocalStore(1 << 20), None, "local")  # type: ignore[arg-type]
    made.stats = tally = Tally()  # type: ignore[assignment]
    return made, tally


def msg(raw: bytes = b"\0\0\0\0") -> Any:
    return SimpleNamespace(inputs=[WireTensor("X", "FP32", (1, 1), raw)], outputs=["Y"], params={})


def config(enabled: bool) -> Any:
    text = CONFIG + ("response_cache { enable: true }\n" if enabled else "")
    return parse_config(text, model="m", source="test")


def test_no_cache_or_a_model_that_does_not_use_it_is_not_looked_up() -> None:
    assert consult(None, config(True), "m", 1, msg()) is None
    made, tally = cache()
    assert consult(made, config(False), "m", 1, msg()) is None
    assert tally.added == []


def test_a_miss_kept_is_a_hit_next_time_counted_as_one() -> None:
    made, tally = cache()
    first = consult(made, config(True), "m", 1, msg())
    assert first is not None and first.found is None
    first.keep(1, [Y])
    assert [counts["cache_miss.count"] for *_, counts in tally.added] == [1]
    again = consult(made, config(True), "m", 1, msg())
    assert again is not None and again.found == (1, [Y])
    assert tally.added[-1][:2] == ("m", 1)
    assert tally.added[-1][2]["success.count"] == 1 and "cache_miss.count" not in tally.added[-1][2]
    other = consult(made, config(True), "m", 1, msg(b"\1\0\0\0"))  # other bytes, other key
    assert other is not None and other.found is None


def test_an_answer_of_another_version_is_not_kept_under_the_key() -> None:
    made, _ = cache()
    first = consult(made, config(True), "m", 1, msg())
    assert first is not None
    first.keep(2, [Y])  # the repository moved on while the request ran
    again = consult(made, config(True), "m", 1, msg())
    assert again is not None and again.found is None
