"""Models resident within a memory budget: loaded when work for them waits, unloaded when
least recently used (``conch worker --model-memory-budget SIZE``).

A worker with a budget loads nothing at start. It reports each model it serves as STANDBY,
which gateways read as ready, so requests are taken and wait in the model's queue. A
thread here looks at the standby models' queues every ``POLL_S``; for one whose work
waits, it frees room by unloading the resident models used least recently (their
batches finish first, and what they held goes back to the queue), then loads it. A model
larger than the whole budget is unavailable, with the reason. Requests keep their
deadlines while they wait, as any queued request does.

A model's size is what its served versions' files hold on disk, once per instance (each
instance loads its own copy): known before loading, the same on every worker, and close
to what ONNX Runtime, TorchScript and tree models take in memory. A model whose runtime
takes much more than its files (a Python model that builds its weights) should be given
a budget with room to spare.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Protocol

import redis

from conch.core.repository import ModelEntry, ModelRepository
from conch.wire.work_owed import work_owed

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often the standby models' queues are looked at


class Host(Protocol):
    """What residency asks of the worker's model host (``worker.host.ModelHost``, which
    imports this module to start one, so it is named here by what it must do)."""

    client: redis.Redis
    repository: ModelRepository

    def resident(self) -> list[str]: ...

    def standby(self) -> list[str]: ...

    def serve(self, name: str, entry: ModelEntry, *, load_id: str = "") -> None: ...

    def evict(self, name: str) -> None: ...

    def refuse(self, name: str, reason: str) -> None: ...


def footprint(entry: ModelEntry) -> int:
    """Bytes the model takes when resident: its served versions' files, per instance."""
    files = 0
    for version in entry.versions:
        folder = Path(entry.path) / str(version)
        files += sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return files * max(1, len(entry.instances()))


class Residency(threading.Thread):
    """Brings a standby model in when its work waits, within ``budget`` bytes."""

    def __init__(self, host: Host, budget: int, poll_s: float = POLL_S) -> None:
        super().__init__(name="residency", daemon=True)
        self.host = host
        self.budget = budget
        self.poll_s = poll_s
        self.sizes: dict[str, int] = {}  # resident model -> its footprint
        self.last_used: dict[str, float] = {}  # model -> when its last batch ran
        self.stopping = threading.Event()

    def used(self, model: str) -> None:
        """A batch of ``model`` ran (the drain loops' ``on_batch``)."""
        self.last_used[model] = time.monotonic()

    def resident_bytes(self) -> int:
        return sum(self.sizes.get(n, 0) for n in self.host.resident())

    def run(self) -> None:
        while not self.stopping.wait(self.poll_s):
            try:
                self.tick()
            except redis.RedisError as exc:
                log.warning("residency: the queues could not be read: %s", exc)
            except Exception:
                log.exception("residency: a pass failed")

    def tick(self) -> None:
        standby = self.host.standby()
        if not standby:
            return
        owed = work_owed(self.host.client, standby)
        for name in standby:
            if owed[name].waiting > 0 and not self.stopping.is_set():
                self.bring_in(name)

    def too_large(self, entry: ModelEntry) -> str | None:
        """Why ``entry`` can never be resident here, or None."""
        need = footprint(entry)
        if need <= self.budget:
            return None
        return (
            f"model '{entry.name}' needs {need} bytes resident (its files, per instance), "
            f"more than --model-memory-budget {self.budget}"
        )

    def bring_in(self, name: str) -> None:
        entry = self.host.repository.read_model(name)
        if entry.error or entry.config is None:
            self.host.refuse(name, entry.error or f"model '{name}' has no config")
            return
        problem = self.too_large(entry)
        if problem:
            self.host.refuse(name, problem)
            return
        need = footprint(entry)
        while self.resident_bytes() + need > self.budget:
            resident = [n for n in self.host.resident() if n != name]
            if not resident:
                break
            victim = min(resident, key=lambda n: self.last_used.get(n, 0.0))
            log.info(
                "model '%s' unloaded to make room for '%s' (--model-memory-budget %d)",
                victim,
                name,
                self.budget,
            )
            self.host.evict(victim)
            self.sizes.pop(victim, None)
        self.sizes[name] = need
        self.last_used[name] = time.monotonic()
        self.host.serve(name, entry)

    def stop(self) -> None:
        self.stopping.set()


__all__ = ["POLL_S", "Residency", "footprint"]
