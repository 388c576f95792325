"""The gateway's view of the models: configs from the repository, readiness from workers."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from conch.core import ensemble_graph
from conch.core.errors import InvalidArgument
from conch.core.model_config import output_types
from conch.core.repository import Completer, ModelEntry
from conch.settings import Settings
from conch.wire import control_bus, worker_reports


class Catalog:
    def __init__(
        self, settings: Settings, client: redis.Redis, *, complete: Completer | None = None
    ) -> None:
        self.settings = settings
        self.client = client
        self.repository = control_bus.open_repository(settings, client, complete=complete)
        self.entries: dict[str, ModelEntry] = self.repository.scan()
        self._loaded: set[str] = set()
        self.problems: dict[str, str] = {}  # models serving an older, good read
        self._subscriber: control_bus.Subscriber | None = None
        self._states: dict[str, dict[str, Any]] = {}
        self._states_at = 0.0
        self._lock = threading.Lock()
        self._output_types: dict[str, dict[str, str]] = {}

    def refresh(self) -> None:
        """Re-read the repository: configs and versions changed, models came or went.

        A model that served and now reads as broken keeps its last good entry (its
        workers keep the old versions too); the reason shows in the index.
        """
        fresh = self.repository.scan()
        problems: dict[str, str] = {}
        for name, entry in fresh.items():
            old = self.entries.get(name)
            if entry.error and old is not None and not old.error:
                fresh[name], problems[name] = old, entry.error
        self.entries, self.problems = fresh, problems
        self._output_types = {}
        self._states_at = 0.0

    def follow(self) -> None:
        """Keep this process's view current (poll and explicit modes); idempotent."""
        if self.settings.model_control_mode == "none" or self._subscriber is not None:
            return
        self._subscriber = control_bus.Subscriber(
            self.client,
            lambda _channel, _payload: self.refresh(),
            lambda changed: (
                self.refresh() if changed or self.settings.model_control_mode == "poll" else None
            ),
            tick_s=self.settings.repository_poll_secs,
        )
        self._subscriber.start()

    def is_loaded(self, name: str) -> bool:
        """Explicit mode: loaded at start (--load-model) or through the API."""
        if self.settings.model_control_mode != "explicit":
            return True
        wanted = set(self.settings.load_models)
        if "*" in wanted or name in wanted:
            return True
        self.states()
        return name in self._loaded

    def entry(self, name: str) -> ModelEntry:
        entry = self.entries.get(name)  # only safe names are ever entries
        if entry is None:
            raise InvalidArgument(f"Request for unknown model: '{name}' is not found")
        return entry

    def serving(self, name: str) -> ModelEntry:
        """An entry that can take requests; a broken one answers with its reason."""
        entry = self.entry(name)
        if not self.is_loaded(name):
            raise InvalidArgument(
                f"Request for unknown model: '{name}' has no available versions (unloaded)"
            )
        if entry.error or entry.config is None:
            raise InvalidArgument(
                f"Request for unknown model: '{name}' is not available: {entry.error}"
            )
        return entry

    def output_types(self, entry: ModelEntry) -> dict[str, str]:
        """Wire datatypes of a model's outputs, as its config declares them."""
        types = self._output_types.get(entry.name)
        if types is None:
            types = output_types(entry.config)
            self._output_types[entry.name] = types
        return types

    def states(self, max_age: float = 1.0) -> dict[str, dict[str, Any]]:
        """Worker-reported model states, at most ``max_age`` seconds old."""
        now = time.monotonic()
        if now - self._states_at > max_age:
            with self._lock:
                if now - self._states_at > max_age:
                    self._states = worker_reports.model_states(worker_reports.snapshot(self.client))
                    if self.settings.model_control_mode == "explicit":
                        self._loaded = control_bus.loaded_models(self.client)
                    self._states_at = time.monotonic()
        return self._states

    def version_ready(self, name: str, version: int) -> bool:
        entry = self.entries.get(name)
        if (
            entry is not None
            and entry.backend == ensemble_graph.ENSEMBLE
            and entry.config is not None
        ):
            return self._steps_ready(entry) is None

        def ready(states: dict[str, dict[str, Any]]) -> bool:
            return (
                states.get(name, {}).get("versions", {}).get(str(version)) == worker_reports.READY
            )

        # A "not ready" from the cache is checked again: a worker may have just come up.
        return ready(self.states()) or ready(self.states(max_age=0.05))

    def _steps_ready(self, entry: ModelEntry) -> str | None:
        """Why an ensemble is not ready (a step model that is not), or None."""
        for step in ensemble_graph.steps(entry.config):
            target = self.entries.get(step.model)
            if target is None or target.config is None:
                return f"step model '{step.model}' is unavailable"
            version = target.latest() if step.version == -1 else step.version
            if not self.version_ready(step.model, version):
                return f"step model '{step.model}' version {version} is not ready"
        return None

    def unavailable_reason(self, name: str) -> str | None:
        """Why no worker can serve ``name``: set when live workers tried and all failed.

        A model no live worker has reported on is not unavailable: its requests wait in
        the queue for a worker to come (scale from zero).
        """
        st = self.states().get(name)
        if not st or not st.get("reason"):
            return None
        if any(state == worker_reports.READY for state in st["versions"].values()):
            return None
        return st["reason"]

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        states = self.states()
        out: list[dict[str, Any]] = []
        for name, entry in sorted(self.entries.items()):
            if not self.is_loaded(name):
                if not ready_only:
                    out.append({"name": name, "state": "UNAVAILABLE", "reason": "unloaded"})
                continue
            st = states.get(name, {})
            if name in self.problems and not ready_only:
                out.append({"name": name, "state": "UNAVAILABLE", "reason": self.problems[name]})
            versions = entry.versions if entry.config is not None and not entry.error else []
            if not versions:
                if not ready_only:
                    out.append(
                        {
                            "name": name,
                            "state": "UNAVAILABLE",
                            "reason": entry.error or st.get("reason") or "",
                        }
                    )
                continue
            for v in versions:
                if entry.backend == ensemble_graph.ENSEMBLE:  # ready when every step model is
                    why = self._steps_ready(entry)
                    if not (ready_only and why):
                        row = {
                            "name": name,
                            "version": str(v),
                            "state": "UNAVAILABLE" if why else "READY",
                        }
                        out.append({**row, "reason": why} if why else row)
                    continue
                state = st.get("versions", {}).get(str(v), "UNAVAILABLE")
                if ready_only and state != worker_reports.READY:
                    continue
                row = {"name": name, "version": str(v), "state": state}
                if state != worker_reports.READY:
                    row["reason"] = st.get("reason") or "no live worker has loaded this version"
                out.append(row)
        return out
