"""The control plane: repository events and model load/unload, over Redis pub/sub.

repo_sync publishes a repository event when a model or version appears, changes or
disappears; the model control API publishes load and unload commands. Workers and
gateways each run one ``Subscriber`` and re-read what changed. Pub/sub loses what is sent
while a listener is away, so state also lives in keys: the set of models loaded through
the API (explicit mode) and a repository generation counter, which a subscriber checks
on every tick to catch up on anything it missed. The names are in ``conch.wire.keys``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from conch.core.repository import Completer, ModelRepository
from conch.core.repository_keys import VERSION_FILE, RefusedKey, classify
from conch.settings import Settings
from conch.wire.keys import (
    CONTROL_COMMANDS,
    LOAD_IDS,
    LOADED_MODELS,
    OVERRIDE_FILES_PREFIX,
    OVERRIDE_PREFIX,
    REPOSITORY_EVENTS,
    REPOSITORY_GENERATION,
)

log = logging.getLogger(__name__)

# The channels a subscriber's on_message is called with (callers compare against these).
EVENTS = REPOSITORY_EVENTS
COMMANDS = CONTROL_COMMANDS


def command(client: redis.Redis, action: str, model: str, **fields: Any) -> None:
    """Record the wanted state, then tell every worker and gateway."""
    pipe = client.pipeline(transaction=True)
    if action == "load":
        pipe.sadd(LOADED_MODELS, model)
        if fields.get("id"):
            pipe.hset(LOAD_IDS, model, str(fields["id"]))
    elif action == "unload":
        pipe.srem(LOADED_MODELS, model)
        pipe.hdel(LOAD_IDS, model)
    pipe.incr(REPOSITORY_GENERATION)
    pipe.publish(
        CONTROL_COMMANDS,
        json.dumps({"action": action, "model": model, "at": time.time(), **fields}),
    )
    pipe.execute()


def last_load_id(client: redis.Redis, model: str) -> str:
    """The id of the latest load command for ``model``, for a worker that missed it."""
    raw = client.hget(LOAD_IDS, model)
    return raw.decode() if isinstance(raw, bytes) else (raw or "")


def loaded_models(client: redis.Redis) -> set[str]:
    return {m.decode() if isinstance(m, bytes) else m for m in client.smembers(LOADED_MODELS)}


def set_override(
    client: redis.Redis, model: str, config_json: str | None, files: dict[str, bytes] | None = None
) -> None:
    """A load request's config (JSON) and ``file:`` contents, for every worker to read."""
    pipe = client.pipeline(transaction=True)
    pipe.delete(OVERRIDE_PREFIX + model, OVERRIDE_FILES_PREFIX + model)
    if config_json is not None:
        pipe.set(OVERRIDE_PREFIX + model, config_json)
    if files:
        pipe.hset(OVERRIDE_FILES_PREFIX + model, mapping=files)
    pipe.execute()


def check_file_path(model: str, rel: str) -> str:
    """``<version>/<path>`` of a ``file:`` override (leading slashes dropped, as Triton
    joins the path under the model's folder), refused if it could leave its folder."""
    rel = rel.lstrip("/")
    try:
        place = classify(f"{model}/{rel}")
    except RefusedKey as exc:
        raise ValueError(f"file:{rel} {exc.reason}") from None
    if place.kind != VERSION_FILE:
        raise ValueError(
            f"file:{rel} must name a file inside a numeric version folder, as <version>/<path>"
        )
    return rel


def override_dir(client: redis.Redis, model: str) -> Path | None:
    """The model folder a load's ``file:`` overrides describe, written out locally once
    per content (a folder named by its hash, so readers never see it half written)."""
    files = client.hgetall(OVERRIDE_FILES_PREFIX + model)
    if not files:
        return None
    items = sorted((k.decode() if isinstance(k, bytes) else k, v) for k, v in files.items())
    digest = hashlib.sha256()
    for rel, data in items:
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    root = Path(tempfile.gettempdir()) / "conch-overrides"
    final = root / f"{model}-{digest.hexdigest()[:16]}"
    if final.is_dir():
        return final
    staging = Path(tempfile.mkdtemp(prefix=f".{model}-", dir=_mkdir(root)))
    for rel, data in items:
        target = staging / check_file_path(model, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    try:
        staging.rename(final)
    except OSError:  # another process wrote the same content first
        shutil.rmtree(staging, ignore_errors=True)
    return final


def override_models(client: redis.Redis) -> set[str]:
    """Models that exist only through a load request's ``file:`` overrides."""
    return {
        k.decode().removeprefix(OVERRIDE_FILES_PREFIX)
        if isinstance(k, bytes)
        else k.removeprefix(OVERRIDE_FILES_PREFIX)
        for k in client.scan_iter(match=OVERRIDE_FILES_PREFIX + "*", count=1000)
    }


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def get_override(client: redis.Redis, model: str) -> str | None:
    v = client.get(OVERRIDE_PREFIX + model)
    return v.decode() if isinstance(v, bytes) else v


class Subscriber(threading.Thread):
    """Calls ``on_message(channel, payload)`` for each event or command, and
    ``on_tick(generation_changed)`` every ``tick_s`` seconds; reconnects on its own.

    It listens to the repository's ``channels`` and watches its ``generation`` key unless
    told others (the log settings, ``conch.wire.log_control``, have their own)."""

    def __init__(
        self,
        client: redis.Redis,
        on_message: Callable[[str, dict[str, Any]], None],
        on_tick: Callable[[bool], None] | None = None,
        tick_s: float = 5.0,
        *,
        channels: tuple[str, ...] = (REPOSITORY_EVENTS, CONTROL_COMMANDS),
        generation: str = REPOSITORY_GENERATION,
    ) -> None:
        super().__init__(name="conch-control", daemon=True)
        self.client = client
        self.on_message = on_message
        self.on_tick = on_tick
        self.tick_s = tick_s
        self.channels = channels
        self.generation_key = generation
        self.stopping = threading.Event()
        self._generation: bytes | None = None

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._listen()
            except redis.RedisError as exc:
                log.warning("control subscriber lost Redis (%s); retrying", exc)
                self.stopping.wait(1.0)

    def _listen(self) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(*self.channels)
        self._generation = self.client.get(self.generation_key)
        # Catch up at once on what was sent before this subscription: a command published
        # while the process started (or while it reconnected) is not delivered again.
        if self.on_tick is not None:
            self._call(self.on_tick, True)
        next_tick = time.monotonic() + self.tick_s
        try:
            while not self.stopping.is_set():
                msg = pubsub.get_message(timeout=min(1.0, self.tick_s))
                if msg is not None and msg.get("type") == "message":
                    channel = (
                        msg["channel"].decode()
                        if isinstance(msg["channel"], bytes)
                        else msg["channel"]
                    )
                    try:
                        payload = json.loads(msg["data"])
                    except ValueError:
                        log.warning("ignoring an unreadable control message on %s", channel)
                        continue
                    if isinstance(payload, dict):
                        self._call(self.on_message, channel, payload)
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + self.tick_s
                    generation = self.client.get(self.generation_key)
                    changed, self._generation = generation != self._generation, generation
                    if self.on_tick is not None:
                        self._call(self.on_tick, changed)
        finally:
            pubsub.close()

    @staticmethod
    def _call(fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # a bad event must not stop the listener
            log.exception("control handler failed")


def open_repository(
    settings: Settings, client: redis.Redis, *, complete: Completer | None = None
) -> ModelRepository:
    """The model repository as this deployment sees it: the files on disk, plus, in explicit
    mode, the config and ``file:`` overrides that load requests stored in Redis.

    Every reader (the gateway's model view, a worker's host, BLS, batch jobs, model
    control) opens it here, so a model loaded with an override reads the same everywhere.
    ``complete`` is the backends' auto-complete, which the composition roots pass
    (``conch.backends.completion.complete``); see ``ModelRepository`` for a reader without.
    """
    explicit = settings.model_control_mode.explicit
    return ModelRepository(
        settings.repository_folders,
        complete=complete,
        auto_complete=settings.auto_complete,
        default_max_batch_size=settings.backend_config.max_batch_sizes,
        config_override=(lambda name: get_override(client, name)) if explicit else None,
        folder_override=(lambda name: override_dir(client, name)) if explicit else None,
        extra_models=(lambda: override_models(client)) if explicit else None,
    )
