"""The embedded engine: a model repository served inside the caller's process.

``Engine`` reads the repository as every conch process does (``core.repository``, with the
backends' auto-complete), loads each model's instances with the worker's own loader
(``backends.loading``: every version, warmed up) and runs them through a
``ModelScheduler`` each. Everything a client's request meets in a fleet it meets here, in
the same order and with the same errors: the model's availability, the version rule
("" and -1: the latest), ``core.validation``'s checks, the request's ``timeout``, the
dynamic batcher, and Triton's statistics. Ensembles run their graph here
(``core.ensemble_run``), each step queued on its model's scheduler; Python models call
other models through ``EmbeddedBls``, checked as a fleet's BLS checks them.

Model control follows Triton's modes: ``none`` loads every model at start; ``explicit``
loads the ``startup_models`` (``*``: all) and then what ``load`` asks for. Loading a
model again reads it from the repository again and swaps the new instances in; the old
ones finish what they have queued, then unload. An ensemble's load loads its steps.

What it does not do yet, and says so: sequence models (their state and slots live in
Redis in a fleet) are unavailable with the reason; ``poll`` mode is refused (call
``load`` to pick up a change); priority levels and the response cache do not apply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conch.backends import Backend, BackendRequest, loading
from conch.core import ensemble_graph, tensors, validation
from conch.core.ensemble_graph import ENSEMBLE, MAX_DEPTH, Step, Tensor
from conch.core.ensemble_run import InProcessSlots, StepCall, run
from conch.core.errors import ConchError, InvalidArgument, ModelLoadError, Unsupported
from conch.core.inference import InferRequest, InputTensor, OutputTensor, RequestedOutput
from conch.core.model_config import output_types
from conch.core.repository import ModelEntry, ModelRepository
from conch.embedded.bls import EmbeddedBls
from conch.embedded.counters import Counters
from conch.embedded.responses import Responses
from conch.embedded.scheduler import CLIENT, Caller, Job, ModelScheduler
from conch.wire import statistics

log = logging.getLogger(__name__)

ALL_MODELS = "*"  # Triton's --load-model=*: every model in the repository
STOP_S = 30.0  # how long a stop waits for queued requests, as --exit-timeout-secs' default


@dataclass
class Served:
    """A loaded model: its entry as read when it was loaded, its scheduler (None for an
    ensemble, which runs its graph in the caller's thread) and its statistics."""

    entry: ModelEntry
    scheduler: ModelScheduler | None
    counters: Counters
    output_types: dict[str, str]


class Engine:
    """A repository's models, served in this process (see the module docstring)."""

    def __init__(
        self,
        repository: ModelRepository,
        *,
        explicit: bool = False,
        startup_models: Sequence[str] = (),
    ) -> None:
        self.repository = repository
        self.explicit = explicit
        self.startup_models = list(startup_models)
        self.bls = EmbeddedBls(self)
        self._entries: dict[str, ModelEntry] = {}
        self._served: dict[str, Served] = {}
        self._failed: dict[str, str] = {}  # model -> why its last load failed
        self._lock = threading.RLock()  # loads and unloads, one at a time
        self._step_slots = InProcessSlots()  # ensembles' max_inflight_requests

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Load what the mode says; a model that fails to load is logged and unavailable
        with its reason, as Triton serves the others."""
        entries = self._scan()
        if not self.explicit or ALL_MODELS in self.startup_models:
            names = list(entries)
        else:
            names = self.startup_models
        for name in names:
            try:
                self.load(name)
            except ConchError as exc:
                log.error("model '%s' failed to load: %s", name, exc.message)

    def failures(self) -> dict[str, str]:
        """Each model whose last load failed, and why."""
        with self._lock:
            return dict(self._failed)

    def stop(self, timeout: float = STOP_S) -> None:
        """Run what is queued, then unload every model. Every model keeps taking requests
        until all are idle at once, so a Python model finishing its queue can still make
        its BLS calls, and an ensemble's later steps still run."""
        end = time.monotonic() + timeout
        with self._lock:
            while time.monotonic() < end and not all(
                s.scheduler is None or s.scheduler.idle for s in self._served.values()
            ):
                time.sleep(0.01)
            served, self._served = self._served, {}
        for model in served.values():
            _retire(model)

    # -- model control ----------------------------------------------------------------------
    def load(self, name: str) -> None:
        """Read ``name`` again and (re)load it; an ensemble's steps are loaded first."""
        with self._lock:
            self._load(name, self._scan(), set())

    def _load(self, name: str, entries: dict[str, ModelEntry], seen: set[str]) -> None:
        if name in seen:
            return
        seen.add(name)
        entry = entries.get(name)
        if entry is None:
            raise InvalidArgument(f"failed to load '{name}', failed to poll from model repository")
        old = self._served.get(name)
        counters = old.counters if old is not None else Counters()
        try:
            if entry.error or entry.config is None:
                raise ModelLoadError(entry.error or f"model '{name}' has no config")
            if not entry.versions:
                raise ModelLoadError(f"model '{name}' has no version to serve")
            if entry.backend == ENSEMBLE:
                for step in ensemble_graph.steps(entry.config):
                    if step.model not in self._served:
                        self._load(step.model, entries, seen)
                scheduler = None
            else:
                scheduler = self._scheduler(entry, counters)
        except ConchError as exc:
            self._failed[name] = exc.message
            raise
        self._failed.pop(name, None)
        self._served[name] = Served(entry, scheduler, counters, output_types(entry.config))
        if scheduler is not None:
            scheduler.start()
        if old is not None:
            _retire(old)
        log.info("model '%s' loaded (versions %s)", name, sorted(entry.versions))

    def _scheduler(self, entry: ModelEntry, counters: Counters) -> ModelScheduler:
        if entry.config.HasField("sequence_batching"):
            raise Unsupported(
                f"model '{entry.name}' is a sequence model: an embedded conch.Server does not "
                "run sequence models yet (their state lives in Redis); connect the server to a "
                "fleet (redis_url=...) to serve it"
            )
        slots: list[dict[int, Backend]] = []
        try:
            for spec in entry.instances():
                slots.append(loading.load_backends(entry, spec, self.bls))
        except ConchError:
            for loaded in slots:
                loading.unload(entry.name, loaded.values())
            raise
        except Exception as exc:
            for loaded in slots:
                loading.unload(entry.name, loaded.values())
            raise ModelLoadError(f"model '{entry.name}' failed to load: {exc}") from exc
        return ModelScheduler(entry, slots, counters)

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload ``name`` (and, with ``unload_dependents``, an ensemble's steps that no
        other loaded ensemble uses); its queued requests run first."""
        with self._lock:
            served = self._served.pop(name, None)
            if served is None:
                if name not in self._entries and name not in self._scan():
                    raise InvalidArgument(
                        f"failed to unload '{name}', failed to poll from model repository"
                    )
                return
            _retire(served)
            if unload_dependents and served.entry.backend == ENSEMBLE:
                still = {
                    step.model
                    for other in self._served.values()
                    if other.entry.backend == ENSEMBLE
                    for step in ensemble_graph.steps(other.entry.config)
                }
                for step in ensemble_graph.steps(served.entry.config):
                    if step.model not in still:
                        self.unload(step.model, unload_dependents=True)

    def _scan(self) -> dict[str, ModelEntry]:
        self._entries = self.repository.scan()
        return self._entries

    # -- what clients read ------------------------------------------------------------------
    def serving(self, name: str) -> Served:
        """A loaded model; an unknown, unloaded or broken one answers as the gateway does."""
        served = self._served.get(name)
        if served is not None:
            return served
        why = self._failed.get(name)
        if why is not None:
            raise InvalidArgument(f"Request for unknown model: '{name}' is not available: {why}")
        if name in self._entries:
            raise InvalidArgument(
                f"Request for unknown model: '{name}' has no available versions (unloaded)"
            )
        raise InvalidArgument(f"Request for unknown model: '{name}' is not found")

    def ready(self, name: str, version: str = "") -> bool:
        try:
            served = self.serving(name)
            served.entry.resolve_version(version)
        except ConchError:
            return False
        return all(step_ready for step_ready in self._steps_ready(served.entry))

    def _steps_ready(self, entry: ModelEntry) -> list[bool]:
        if entry.backend != ENSEMBLE:
            return []
        return [self.ready(step.model) for step in ensemble_graph.steps(entry.config)]

    def index(self) -> list[dict[str, Any]]:
        """Triton's repository index: every model, its versions' state and why."""
        out: list[dict[str, Any]] = []
        for name in sorted(self._entries):
            served = self._served.get(name)
            if served is not None:
                out += [
                    {"name": name, "version": str(v), "state": "READY", "reason": ""}
                    for v in sorted(served.entry.versions)
                ]
            elif name in self._failed:
                out.append({"name": name, "state": "UNAVAILABLE", "reason": self._failed[name]})
            else:
                out.append({"name": name, "state": "UNAVAILABLE", "reason": "unloaded"})
        return out

    def statistics(self, name: str | None = None, version: str = "") -> list[dict[str, Any]]:
        """Triton's statistics extension: every loaded model, or one (one version)."""
        if name is None:
            return [
                stat
                for model, served in sorted(self._served.items())
                for stat in served.counters.stats(model, sorted(served.entry.versions))
            ]
        served = self.serving(name)
        entry = served.entry
        versions = [entry.resolve_version(version)] if version else sorted(entry.versions)
        return served.counters.stats(name, versions)

    # -- inference --------------------------------------------------------------------------
    def infer(
        self, name: str, version: str, request: InferRequest, caller: Caller = CLIENT
    ) -> Responses:
        """Check ``request`` as the gateway does and queue it (or run an ensemble's graph);
        its answers come through the ``Responses`` returned. Every 4xx is raised here,
        before anything is queued."""
        served = self.serving(name)
        entry = served.entry
        used = entry.resolve_version(version)
        rows = validation.validate_request(request, entry.config, model_name=name)
        deadline = _deadline(request, caller)
        wanted = request.output_names(entry.config)
        if entry.backend == ENSEMBLE:
            return self._run_ensemble(served, used, request, wanted, caller, deadline)
        responses = Responses(name, used, wanted, served.output_types, deadline)
        try:
            inputs = {
                t.name: tensors.to_numpy(t.datatype, t.shape, t.raw, t.name) for t in request.inputs
            }
        except ConchError:
            raise
        except Exception as exc:
            raise InvalidArgument(f"bad input tensor: {exc}") from None
        backend_request = BackendRequest(
            inputs,
            wanted,
            request.id,
            request.custom_parameters(),
            _timeout_us(request),
            deadline,
            caller.chain,
            caller.priority,
            cancelled=responses.is_cancelled,
        )
        assert served.scheduler is not None  # every model but an ensemble has one
        served.scheduler.submit(Job(backend_request, used, rows, time.time(), responses))
        return responses

    def _run_ensemble(
        self,
        served: Served,
        version: int,
        request: InferRequest,
        wanted: list[str],
        caller: Caller,
        deadline: float,
        depth: int = 0,
    ) -> Responses:
        """An ensemble's graph, run in this thread; its one answer, counted in the
        ensemble's statistics as Triton counts one (a failure is OTHER)."""
        entry = served.entry
        if depth > MAX_DEPTH:
            raise InvalidArgument(
                f"ensemble '{entry.name}': ensembles nested deeper than {MAX_DEPTH}"
            )
        step_caller = Caller(deadline, caller.chain, caller.priority)
        params = request.custom_parameters()
        timeout_us = _timeout_us(request)
        if timeout_us:
            params["timeout"] = timeout_us

        def config_of(step: Step) -> Any:
            return self.serving(step.model).entry.config

        def start(step: Step, inputs: dict[str, Tensor], outs: list[str]) -> StepCall:
            step_request = InferRequest(
                id=request.id,
                inputs=[InputTensor(n, dt, shape, raw) for n, (dt, shape, raw) in inputs.items()],
                outputs=[RequestedOutput(o, True) for o in outs],
                binary_data_output=True,
                parameters=dict(params),
            )
            return _StepAnswer(self.infer(step.model, str(step.version), step_request, step_caller))

        inputs = {t.name: (t.datatype, tuple(t.shape), t.raw) for t in request.inputs}
        cfg = entry.config
        first = next(iter(inputs.values()), None)
        rows = first[1][0] if cfg.max_batch_size > 0 and first is not None and first[1] else 1
        execution = statistics.Execution(version, batch_size=rows)
        began = time.time()
        try:
            produced = run(
                entry, inputs, wanted, start, config_of, self._step_slots.until(deadline)
            )
        except ConchError:
            execution.failed(statistics.OTHER, int((time.time() - began) * 1e9))
            served.counters.add(execution)
            raise
        took = int((time.time() - began) * 1e9)
        execution.success, execution.rows = 1, rows
        execution.success_ns = execution.infer_ns = took
        execution.responses_ns, execution.queues_ns = [took], [0]
        served.counters.add(execution)
        outputs = [OutputTensor(n, *produced[n]) for n in wanted if n in produced]
        return Responses.answered(entry.name, version, outputs)


class _StepAnswer:
    """An ensemble step queued on its model's scheduler (``core.ensemble_run.StepCall``)."""

    def __init__(self, responses: Responses) -> None:
        self.responses = responses

    def wait(self) -> dict[str, Tensor]:
        answer = self.responses.one()
        return {t.name: (t.datatype, tuple(t.shape), t.raw) for t in answer.outputs}

    def cancel(self) -> None:
        self.responses.close()


def _timeout_us(request: InferRequest) -> int:
    timeout = request.parameters.get("timeout", 0)
    return int(timeout) if isinstance(timeout, int) and not isinstance(timeout, bool) else 0


def _deadline(request: InferRequest, caller: Caller) -> float:
    """The request's own ``timeout`` (µs) from now, bounded by its caller's deadline."""
    timeout_us = _timeout_us(request)
    own = time.time() + timeout_us / 1e6 if timeout_us > 0 else 0.0
    if caller.deadline and (not own or caller.deadline < own):
        return caller.deadline
    return own


def _retire(served: Served) -> None:
    """Stop a model's scheduler (its queue runs first) and unload its instances."""
    scheduler = served.scheduler
    if scheduler is None:
        return
    scheduler.stop()
    for slot in scheduler.slots:
        loading.unload(served.entry.name, slot.values())


__all__ = ["ALL_MODELS", "Engine", "Served"]
