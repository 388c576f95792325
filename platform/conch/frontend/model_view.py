"""What a frontend knows of the models: configs from the repository, readiness from workers.

One view for every caller that sends requests: the gateway (``http.app``) and BLS
(``bls.BlsClient``, in worker processes). Both need the same answers, and when each had
its own copy they drifted: the entry of a model (unknown, broken, or serving its last
good read), whether explicit model control has it loaded, why no worker can serve it,
and whether a version is ready (an ensemble when its steps are; a cached "not ready" is
asked again, since a worker may have just come up).

Only how configs stay fresh differs, by what the process is for:

- **Scanned** (the gateway, ``config_max_age_s=None``): every model is read at start,
  and again on ``refresh()``, which ``follow()`` calls on control events and poll ticks
  (and the load/unload routes call at once). The gateway lists models (index,
  statistics, metrics), so it must know all of them.
- **On demand** (BLS, ``config_max_age_s`` set): a model is read when a call first names
  it, and again once that read is ``config_max_age_s`` old. A worker process already
  follows the control channel for the models it serves; a second subscription and a
  whole-repository scan (completing every model's config, inspecting ONNX files) for the
  few models a Python model calls would cost more than reading those few, and a bounded
  age keeps models added or changed at run time in view.

Either way a model that served and now reads as broken keeps its last good read, as its
workers keep serving its old versions. Worker states are cached for about a second.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from conch.core import ensemble_graph
from conch.core.errors import InvalidArgument, Unavailable
from conch.core.model_config import output_types
from conch.core.read_ahead import ReadAhead
from conch.core.repository import Completer, ModelEntry, ModelRepository
from conch.core.repository_keys import is_model_name
from conch.settings import Settings
from conch.wire import control_bus, worker_reports

STATES_MAX_AGE_S = 1.0  # how stale the workers' reports may be for readiness checks
# The index's reason for a --scale-to-zero model's version that reads ready with no worker.
SCALED_TO_ZERO = "no worker yet (scale to zero): requests wait in the queue for one to start"
STANDBY_REASON = (
    "not resident (--model-memory-budget): a worker loads it when work for it waits, "
    "which waits in the queue meanwhile"
)


class _Scanned:
    """Every model of the repository, as of the last scan."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.entries: dict[str, ModelEntry] = repository.scan()
        self.problems: dict[str, str] = {}  # models serving an older, good read

    def get(self, name: str) -> ModelEntry | None:
        return self.entries.get(name)  # only safe names are ever entries

    def refresh(self) -> None:
        fresh = self.repository.scan()
        problems: dict[str, str] = {}
        for name, entry in fresh.items():
            old = self.entries.get(name)
            if entry.error and old is not None and not old.error:
                fresh[name], problems[name] = old, entry.error
        self.entries, self.problems = fresh, problems


class _OnDemand:
    """Models read when first asked for, and again once the read is ``max_age_s`` old."""

    def __init__(self, repository: ModelRepository, max_age_s: float) -> None:
        self.repository = repository
        self.max_age_s = max_age_s
        self._reads: dict[str, tuple[float, ModelEntry]] = {}  # name -> (read at, entry)
        self._lock = threading.Lock()
        self.problems: dict[str, str] = {}

    @property
    def entries(self) -> dict[str, ModelEntry]:
        """The models read so far (not the whole repository)."""
        return {name: entry for name, (_, entry) in list(self._reads.items())}

    def get(self, name: str, depth: int = 0) -> ModelEntry | None:
        now = time.monotonic()
        cached = self._reads.get(name)
        if cached is not None and now - cached[0] < self.max_age_s:
            return cached[1]
        if not is_model_name(name) or not self._exists(name):
            with self._lock:
                self._reads.pop(name, None)
            return None
        entry = self.repository.read_model(name)
        if entry.backend == ensemble_graph.ENSEMBLE and not entry.error:
            if depth > ensemble_graph.MAX_DEPTH:
                entry.error = (
                    f"ensemble '{name}': ensembles nested deeper than {ensemble_graph.MAX_DEPTH}"
                )
            else:  # checked against its step models, as a scan would
                steps = {s.model for s in ensemble_graph.steps(entry.config)} - {name}
                found = {s: self.get(s, depth + 1) for s in steps}
                ensemble_graph.link(entry, {k: v for k, v in found.items() if v})
        if entry.error and cached is not None and not cached[1].error:
            entry = cached[1]  # keep the last good read, as the workers keep serving it
        with self._lock:
            self._reads[name] = (now, entry)
        return entry

    def _exists(self, name: str) -> bool:
        """A folder in the repository, or one a load request gave (explicit mode)."""
        override = self.repository.folder_override
        if override is not None and override(name):
            return True
        return bool(self.repository.folders(name))

    def refresh(self) -> None:
        with self._lock:
            self._reads = {}


class ModelView:
    """Model entries, worker states and readiness, for one process that sends requests.

    ``repository`` defaults to ``control_bus.open_repository(settings, client)``, so a
    model loaded with a config or ``file:`` override reads as the gateway accepted it.
    """

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        repository: ModelRepository | None = None,
        *,
        config_max_age_s: float | None = None,
        complete: Completer | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.repository = repository or control_bus.open_repository(
            settings, client, complete=complete
        )
        self._source = (
            _Scanned(self.repository)
            if config_max_age_s is None
            else _OnDemand(self.repository, config_max_age_s)
        )
        self._subscriber: control_bus.Subscriber | None = None
        self._loaded: set[str] = set()  # explicit model control: loaded through the API
        self._states: ReadAhead[dict[str, dict[str, Any]]] = ReadAhead(
            self._read_states, {}, STATES_MAX_AGE_S, name="conch-worker-states"
        )
        self._output_types: dict[str, dict[str, str]] = {}

    # -- configs ---------------------------------------------------------------------

    @property
    def entries(self) -> dict[str, ModelEntry]:
        """Every model by name (scanned); the ones read so far (on demand)."""
        return self._source.entries

    @property
    def problems(self) -> dict[str, str]:
        """Models serving an older, good read, and why the newer read is broken."""
        return self._source.problems

    def refresh(self) -> None:
        """Read the repository again: configs and versions changed, models came or went."""
        self._source.refresh()
        self._output_types = {}
        self._states.invalidate()

    def follow(self) -> None:
        """Keep this view current (poll and explicit modes) from the control channel:
        refresh on every event, and on a tick that finds the repository changed (or on
        every tick, polling). Idempotent."""
        mode = self.settings.model_control_mode
        if not mode.follows_changes or self._subscriber is not None:
            return
        self._subscriber = control_bus.Subscriber(
            self.client,
            lambda _channel, _payload: self.refresh(),
            lambda changed: self.refresh() if changed or mode.polls else None,
            tick_s=self.settings.repository_poll_secs,
        )
        self._subscriber.start()

    def stop_following(self) -> None:
        """Stop following the repository (an in-process server that stops)."""
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            subscriber.stop()
            subscriber.join(2.0)  # it notices within its one-second poll

    def entry(self, name: str) -> ModelEntry:
        """The model's entry, broken or not; an unknown model is a 400."""
        entry = self._source.get(name)
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

    # -- what the workers say --------------------------------------------------------

    def states(self, max_age: float | None = None) -> dict[str, dict[str, Any]]:
        """Worker-reported model states, at most ``max_age`` seconds old (default
        ``STATES_MAX_AGE_S``, and then read again ahead of that age: ``ReadAhead``; one
        read of Redis however many threads find them stale)."""
        return self._states.get(max_age)

    def _read_states(self) -> dict[str, dict[str, Any]]:
        """The workers' reports, and with them the models loaded through the API."""
        states = worker_reports.model_states(worker_reports.snapshot(self.client))
        if self.settings.model_control_mode.explicit:
            self._loaded = control_bus.loaded_models(self.client)
        return states

    def is_loaded(self, name: str) -> bool:
        """Explicit mode: loaded at start (--load-model) or through the API."""
        if not self.settings.model_control_mode.explicit:
            return True
        wanted = set(self.settings.load_models)
        if "*" in wanted or name in wanted:
            return True
        self.states()
        return name in self._loaded

    def unavailable_reason(self, name: str) -> str | None:
        """Why no worker can serve ``name``: set when live workers tried and all failed.

        A model no live worker has reported on is not unavailable: its requests wait in
        the queue for a worker to come (scale from zero). Nor is an ensemble, which no
        worker serves: each of its steps is checked as it is sent.
        """
        entry = self._source.get(name)
        if entry is not None and entry.backend == ensemble_graph.ENSEMBLE:
            return None
        st = self.states().get(name)
        if not st or not st.get("reason"):
            return None
        if any(state == worker_reports.READY for state in st["versions"].values()):
            return None
        return st["reason"]

    def check_available(self, name: str) -> None:
        """Raise ``Unavailable`` when every live worker failed to serve ``name``."""
        reason = self.unavailable_reason(name)
        if reason:
            raise Unavailable(f"model '{name}' is unavailable: {reason}")

    def version_ready(self, name: str, version: int) -> bool:
        """A live worker reports that version READY; an ensemble is when its steps are."""
        entry = self._source.get(name)
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
        return (
            ready(self.states())
            or ready(self.states(max_age=0.05))
            or self.waits_for_worker(name, version)
        )

    def waits_for_worker(self, name: str, version: int) -> bool:
        """A version of a ``--scale-to-zero`` model that no live worker serves yet, and
        none failed: the group is at zero (no live worker reports on the model) or a
        worker is loading it (scaling up). Its requests wait in the queue, within their
        timeout, for that worker, so it reads as ready: a client that waits for
        readiness before it sends would otherwise never send what starts one. Likewise a
        version that a worker with ``--model-memory-budget`` holds on standby (not
        resident): that worker loads it when its requests wait.

        Any other model keeps Triton's meaning: ready once a live worker serves it.
        """
        st = self.states().get(name)
        if st is not None and st["versions"].get(str(version)) == worker_reports.STANDBY:
            return True  # a worker with a memory budget loads it when its work waits
        if not self.settings.scales_to_zero(name):
            return False
        return st is None or st["versions"].get(str(version)) == worker_reports.LOADING

    def not_served(self) -> str | None:
        """Why not every model that should be loaded is served, or None when all are:
        Triton's strict readiness. Should be loaded: every model of the repository, or
        in explicit mode every one loaded at start or through the API (unloaded ones
        are fine, as in Triton). Served: each of its versions READY on a live worker
        (an ensemble: its steps). A model that cannot be read never is."""
        for name, entry in sorted(self.entries.items()):
            if not self.is_loaded(name):
                continue
            if entry.error or entry.config is None:
                return f"model '{name}' is not available: {entry.error}"
            if not entry.versions:
                return f"model '{name}' has no version to serve"
            for version in entry.versions:
                if not self.version_ready(name, version):
                    return f"model '{name}' version {version} is not ready"
        return None

    def _steps_ready(self, entry: ModelEntry) -> str | None:
        """Why an ensemble is not ready (a step model that is not), or None."""
        for step in ensemble_graph.steps(entry.config):
            target = self._source.get(step.model)
            if target is None or target.config is None:
                return f"step model '{step.model}' is unavailable"
            try:
                version = target.latest() if step.version == -1 else step.version
            except Unavailable:
                return f"step model '{step.model}' is unavailable"
            if not self.version_ready(step.model, version):
                return f"step model '{step.model}' version {version} is not ready"
        return None

    # -- the repository index --------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: every model and version, with its state."""
        states = self.states()
        problems = self.problems
        out: list[dict[str, Any]] = []
        for name, entry in sorted(self.entries.items()):
            if not self.is_loaded(name):
                if not ready_only:
                    out.append({"name": name, "state": "UNAVAILABLE", "reason": "unloaded"})
                continue
            st = states.get(name, {})
            if name in problems and not ready_only:
                out.append({"name": name, "state": "UNAVAILABLE", "reason": problems[name]})
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
                waits = state != worker_reports.READY and self.waits_for_worker(name, v)
                if ready_only and state != worker_reports.READY and not waits:
                    continue
                row = {"name": name, "version": str(v), "state": state}
                if waits:
                    row["state"] = worker_reports.READY
                    row["reason"] = (
                        STANDBY_REASON if state == worker_reports.STANDBY else SCALED_TO_ZERO
                    )
                elif state != worker_reports.READY:
                    row["reason"] = st.get("reason") or "no live worker has loaded this version"
                out.append(row)
        return out


__all__ = ["SCALED_TO_ZERO", "STANDBY_REASON", "STATES_MAX_AGE_S", "ModelView"]
