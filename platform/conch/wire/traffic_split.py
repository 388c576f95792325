"""Traffic splits across a model's versions (canary, A/B), kept in Redis for every gateway.

A model's split says how its requests that name no version are shared among its
versions: a weight per version (``{"1": 90, "2": 10}``), and optionally a *shadow*: a
share of those requests (0 to 1) of which a copy also goes to one more version, whose
answers are recorded (``record_shadow``) and never returned. The model-repository API
sets, reads and clears it (``POST``/``GET``/``DELETE /v2/repository/models/<m>/traffic``,
``conch.frontend.traffic``); every gateway process applies it.

Where it lives: one hash, ``conch.traffic`` (model -> the split's JSON), so a gateway
reads every model's split in one round trip. Each process keeps what it read for
``MAX_AGE_S`` (``Splits``): a change made through one gateway holds in every other
within that time, and in the one that made it at once (``Splits.invalidate``). A shadow
copy's answer goes to a capped stream per model, ``conch.shadow.<model>``.

``parse`` checks a split as the API takes it, with Triton's 400 for what is wrong (a
weight that is negative or not a number, a version that is not one, a share outside
[0, 1]); whether its versions are ready is the caller's check, which knows the workers.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from conch.core.errors import InvalidArgument
from conch.core.read_ahead import ReadAhead
from conch.wire.keys import SHADOW_PREFIX, TRAFFIC_SPLITS

log = logging.getLogger(__name__)

MAX_AGE_S = 1.0  # how stale a gateway's copy of the splits may be
SHADOW_KEPT = 1000  # entries kept in a model's shadow stream (approximately: XADD MAXLEN ~)
VERSION_PATTERN = "[1-9][0-9]{0,17}"  # a version as a weights key (the OpenAPI document's too)
_VERSION = re.compile(VERSION_PATTERN)
_FIELDS = ("weights", "shadow")
_SHADOW_FIELDS = ("version", "share")

Number = int | float


@dataclass(frozen=True)
class Shadow:
    """A ``share`` (0 to 1) of the split's requests also sent, as a copy, to ``version``."""

    version: int
    share: float

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "share": self.share}


@dataclass(frozen=True)
class Split:
    """A model's split: a weight by version (none: requests keep going to the latest),
    and the shadow, if any."""

    weights: Mapping[int, Number] = field(default_factory=dict)
    shadow: Shadow | None = None

    @property
    def empty(self) -> bool:
        """Nothing to apply: the split is cleared."""
        return not self.weights and self.shadow is None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"weights": {str(v): w for v, w in sorted(self.weights.items())}}
        if self.shadow is not None:
            out["shadow"] = self.shadow.to_json()
        return out

    def draw(
        self, ready: Callable[[int], bool], rand: Callable[[], float] = random.random
    ) -> int | None:
        """A version by weight among the split's versions ``ready`` now; None when
        there are no weights, or none of those with a weight above 0 is ready."""
        live = [(v, w) for v, w in sorted(self.weights.items()) if w > 0 and ready(v)]
        if not live:
            return None
        point = rand() * sum(w for _, w in live)
        for version, weight in live:
            point -= weight
            if point < 0:
                return version
        return live[-1][0]  # rounding left the point on the last edge

    def shadows(self, rand: Callable[[], float] = random.random) -> int | None:
        """The shadow's version when this request's copy should go to it, else None."""
        shadow = self.shadow
        if shadow is None or shadow.share <= 0:
            return None
        return shadow.version if shadow.share >= 1 or rand() < shadow.share else None


NO_SPLIT = Split()


def _bad(model: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"invalid traffic split for model '{model}': {why}")


def _show(value: Any) -> str:
    """A value as an error names it, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse(model: str, doc: Any) -> Split:
    """A split as the API takes it (``{"weights": {...}, "shadow": {...}}``), checked;
    ``{}``, ``{"weights": {}}`` and no shadow: the split cleared (``Split.empty``)."""
    if not isinstance(doc, dict):
        raise _bad(model, "the body must be a JSON object with 'weights' and 'shadow'")
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise _bad(model, f"unknown field '{unknown[0]}' (the fields are 'weights' and 'shadow')")
    raw_weights = doc.get("weights")
    if raw_weights is None:
        raw_weights = {}
    if not isinstance(raw_weights, dict):
        raise _bad(model, "'weights' must be an object of version -> weight")
    weights: dict[int, Number] = {}
    for key, weight in raw_weights.items():
        if not _VERSION.fullmatch(key):
            raise _bad(model, f"{_show(key)} is not a version: versions are positive integers")
        if not _number(weight):
            raise _bad(model, f"the weight of version {key} must be a number, not {_show(weight)}")
        try:
            finite = math.isfinite(weight)
        except OverflowError:  # an integer too large for a float
            finite = False
        if not finite or weight < 0:
            raise _bad(
                model, f"the weight of version {key} must be a number >= 0, not {_show(weight)}"
            )
        weights[int(key)] = weight
    if weights and not any(w > 0 for w in weights.values()):
        raise _bad(model, "at least one weight must be above 0")
    return Split(weights, _shadow(model, doc.get("shadow")))


def _shadow(model: str, raw: Any) -> Shadow | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad(model, "'shadow' must be an object with 'version' and 'share'")
    unknown = sorted(set(raw) - set(_SHADOW_FIELDS))
    if unknown:
        raise _bad(model, f"unknown shadow field '{unknown[0]}' (its fields: 'version', 'share')")
    version, share = raw.get("version"), raw.get("share")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _bad(
            model, f"the shadow's 'version' must be a positive integer, not {_show(version)}"
        )
    if not _number(share) or not 0 <= share <= 1:
        raise _bad(model, f"the shadow's 'share' must be a number from 0 to 1, not {_show(share)}")
    return Shadow(version, float(share))


def _decode(model: str, raw: bytes | str) -> Split | None:
    """A stored split, or None (logged) when it cannot be read."""
    try:
        return parse(model, json.loads(raw))
    except (ValueError, InvalidArgument) as exc:
        log.warning("ignoring the stored traffic split of model '%s': %s", model, exc)
        return None


def store(client: redis.Redis, model: str, split: Split) -> None:
    """Keep ``split`` (checked) for every gateway; an empty one clears the model's."""
    if split.empty:
        client.hdel(TRAFFIC_SPLITS, model)
    else:
        client.hset(TRAFFIC_SPLITS, model, json.dumps(split.to_json(), sort_keys=True))


def clear(client: redis.Redis, model: str) -> None:
    client.hdel(TRAFFIC_SPLITS, model)


def read(client: redis.Redis, model: str) -> Split:
    """The model's split as stored now (``NO_SPLIT`` if none)."""
    raw = client.hget(TRAFFIC_SPLITS, model)
    return (_decode(model, raw) if raw else None) or NO_SPLIT


def read_all(client: redis.Redis) -> dict[str, Split]:
    """Every model's split, in one round trip."""
    out = {}
    for name, raw in client.hgetall(TRAFFIC_SPLITS).items():
        model = name.decode() if isinstance(name, bytes) else name
        split = _decode(model, raw)
        if split is not None and not split.empty:
            out[model] = split
    return out


class Splits:
    """One process's copy of every model's split, at most ``max_age_s`` old and read again
    ahead of that (``ReadAhead``), so a request never waits for it. A Redis that does not
    answer leaves the last copy in use: the request's own publish says the outage."""

    def __init__(self, client: redis.Redis, max_age_s: float = MAX_AGE_S) -> None:
        self.client = client
        self._copy: ReadAhead[dict[str, Split]] = ReadAhead(
            self._read, {}, max_age_s, name="conch-traffic-splits"
        )

    @property
    def max_age_s(self) -> float:
        return self._copy.max_age_s

    def get(self, model: str) -> Split:
        return self._copy.get().get(model, NO_SPLIT)

    def invalidate(self) -> None:
        """Read again on the next ``get`` (this process just changed a split)."""
        self._copy.invalidate()

    def _read(self) -> dict[str, Split]:
        try:
            return read_all(self.client)
        except redis.RedisError as exc:
            log.debug("traffic splits not read again (%s): the last ones hold", exc)
        except Exception as exc:  # a split never fails the request it routes
            log.warning("traffic splits not read (%r): the last ones hold", exc)
        return self._copy.current


def shadow_key(model: str) -> str:
    return SHADOW_PREFIX + model


def record_shadow(client: redis.Redis, model: str, fields: Mapping[str, str]) -> None:
    """One shadow answer on the model's stream (the newest ``SHADOW_KEPT`` are kept)."""
    client.xadd(shadow_key(model), dict(fields), maxlen=SHADOW_KEPT, approximate=True)


def shadow_records(
    client: redis.Redis, model: str, count: int = SHADOW_KEPT
) -> list[dict[str, str]]:
    """The newest ``count`` shadow answers of ``model``, oldest first, each with its
    stream entry id as ``entry``."""
    out = []
    for entry_id, fields in reversed(client.xrevrange(shadow_key(model), count=count)):
        row = {_text(k): _text(v) for k, v in fields.items()}
        row["entry"] = _text(entry_id)
        out.append(row)
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = [
    "MAX_AGE_S",
    "NO_SPLIT",
    "SHADOW_KEPT",
    "VERSION_PATTERN",
    "Shadow",
    "Split",
    "Splits",
    "clear",
    "parse",
    "read",
    "read_all",
    "record_shadow",
    "shadow_key",
    "shadow_records",
    "store",
]
