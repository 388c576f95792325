"""Triton's ``--cache-config``: which response cache a frontend keeps, parsed once.

Triton's flag is ``--cache-config <cache>,<key>=<value>``, repeatable, the keys of one
cache adding up (``--cache-config redis,host=h --cache-config redis,port=6379``). conch
takes Triton's two caches:

- ``local,size=N``: each frontend process keeps its own, at most N bytes (LRU);
- ``redis,host=H,port=P`` (and Triton's ``user``, ``password``, ``db``, ``connect_timeout``
  and ``socket_timeout``; ``pool_size`` and ``wait_timeout`` are taken and mean nothing
  to conch's client): one cache in that Redis, shared by every gateway and gRPC server
  of the cluster. Beyond Triton, ``size=N`` bounds its bytes (conch evicts, least recently
  used first, because that Redis may be the broker, whose own eviction policy must stay
  ``noeviction``); default ``DEFAULT_REDIS_SIZE``.

Protocol-neutral and free of imports, so ``conch.settings`` can use it: the HTTP gateway
and the gRPC server read the same flag the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

LOCAL, REDIS = "local", "redis"
DEFAULT_REDIS_SIZE = 256 * 1024 * 1024
# Triton's redis cache keys (its README) and conch's ``size``; each cache's required keys.
_KEYS = {
    LOCAL: ("size",),
    REDIS: (
        "host",
        "port",
        "user",
        "password",
        "db",
        "connect_timeout",
        "socket_timeout",
        "pool_size",
        "wait_timeout",
        "size",
    ),
}
_REQUIRED = {LOCAL: ("size",), REDIS: ("host", "port")}
_NUMBERS = ("size", "port", "db", "connect_timeout", "socket_timeout", "pool_size", "wait_timeout")
FORMS = "local,size=<bytes> or redis,host=<host>,port=<port>[,password=<p>][,db=<n>][,size=<bytes>]"


@dataclass(frozen=True)
class CacheConfig:
    """One response cache: its kind and its settings by Triton's key names."""

    kind: str  # LOCAL or REDIS
    settings: tuple[tuple[str, str], ...]  # (key, value), in the order given

    @property
    def values(self) -> dict[str, str]:
        return dict(self.settings)

    def number(self, key: str, default: int = 0) -> int:
        text = self.values.get(key)
        return int(text) if text is not None else default

    @property
    def size(self) -> int:
        """The bound, in bytes, on what the cache holds."""
        return self.number("size", DEFAULT_REDIS_SIZE if self.kind == REDIS else 0)

    def describe(self) -> str:
        """For the log: the settings, a password masked."""
        shown = ",".join(f"{k}={'***' if k == 'password' else v}" for k, v in self.settings)
        return f"{self.kind},{shown}"

    def to_values(self) -> list[str]:
        """The ``--cache-config`` values that reproduce it (one per key, as Triton allows)."""
        return [f"{self.kind},{k}={v}" for k, v in self.settings]

    @classmethod
    def parse(cls, items: Iterable[str]) -> CacheConfig | None:
        """``--cache-config`` values (none: no cache). Raises ValueError saying what to
        write for a malformed one, an unknown cache or key, a missing required key, or
        two caches (Triton refuses multiple cache configurations too)."""
        kind = ""
        settings: dict[str, str] = {}
        for item in items:
            name, comma, rest = item.partition(",")
            pairs = rest.split(",") if comma else []
            if not name or not pairs or not all("=" in p for p in pairs):
                raise ValueError(
                    f"--cache-config {item!r}: the form is <cache>,<key>=<value>: {FORMS}"
                )
            if name not in _KEYS:
                raise ValueError(
                    f"--cache-config {item!r}: unknown cache '{name}'; conch has Triton's "
                    f"'{LOCAL}' and '{REDIS}': {FORMS}"
                )
            if kind and name != kind:
                raise ValueError(
                    f"--cache-config {item!r}: multiple cache configurations ('{kind}' and "
                    f"'{name}'); give one cache"
                )
            kind = name
            for pair in pairs:
                key, _, value = pair.partition("=")
                if key not in _KEYS[kind]:
                    raise ValueError(
                        f"--cache-config {item!r}: '{key}' is not a setting of the {kind} cache; "
                        f"its settings are {', '.join(_KEYS[kind])}"
                    )
                if not value:
                    raise ValueError(f"--cache-config {item!r}: '{key}' has no value")
                if key in _NUMBERS and not (value.isascii() and value.isdigit()):
                    raise ValueError(
                        f"--cache-config {item!r}: '{key}' must be a whole number, got {value!r}"
                    )
                settings[key] = value
        if not kind:
            return None
        missing = [k for k in _REQUIRED[kind] if k not in settings]
        if missing:
            raise ValueError(
                f"--cache-config: the {kind} cache needs {' and '.join(missing)}: {FORMS}"
            )
        config = cls(kind, tuple(settings.items()))
        if config.size <= 0:
            raise ValueError(f"--cache-config {kind},size={config.size}: the size must be above 0")
        return config


__all__ = ["DEFAULT_REDIS_SIZE", "FORMS", "LOCAL", "REDIS", "CacheConfig"]
