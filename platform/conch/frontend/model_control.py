"""Loading and unloading models on request: Triton's explicit model control.

One operation for both callers, the HTTP routes (``POST /v2/repository/models/<m>/load``)
and a Python model's ``pb_utils.load_model``/``unload_model``: check the request, record
its overrides, tell every worker and gateway, and wait until the model serves (or stops).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from conch.core import ensemble_graph
from conch.core.errors import InvalidArgument, Unavailable
from conch.core.model_config import json_to_config
from conch.core.repository_keys import model_name_problem
from conch.settings import Settings
from conch.wire import control_bus, worker_reports
from conch.wire.broker import new_id

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

LOAD_WAIT_S = 120.0
UNLOAD_WAIT_S = 30.0
_POLL_S = 0.05

States = Callable[[], dict[str, dict[str, Any]]]


def require_explicit(settings: Settings) -> None:
    if not settings.model_control_mode.explicit:
        raise InvalidArgument(
            "explicit model load / unload is not allowed: start conch with --model-control-mode explicit"
        )


def _fresh_states(client: redis.Redis) -> States:
    return lambda: worker_reports.model_states(worker_reports.snapshot(client))


def _serving(st: dict[str, Any]) -> bool:
    """A worker serves a version: resident, or on standby (loaded when its work waits)."""
    served = (worker_reports.READY, worker_reports.STANDBY)
    return any(v in served for v in st.get("versions", {}).values())


def _wait(read: States, model: str, seconds: float, done: Callable[[dict[str, Any]], bool]) -> bool:
    """Poll the workers' reports until ``done`` holds for ``model``; False after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done(read().get(model, {})):
            return True
        time.sleep(_POLL_S)
    return False


def load(
    client: redis.Redis,
    settings: Settings,
    model: str,
    *,
    config: str | None = None,
    files: dict[str, bytes] | None = None,
    states: States | None = None,
    refresh: Callable[[], None] | None = None,
    _depth: int = 0,
) -> None:
    """Load (or reload) ``model`` everywhere; return once a worker serves a version of it.

    ``config`` is the model config as JSON; ``files`` maps ``file:<version>/<path>`` to
    contents (Triton's keys), for a model that exists only in this request. An ensemble, which no worker
    runs, loads its step models first (as Triton loads an ensemble's composing models).
    """
    require_explicit(settings)
    problem = model_name_problem(model)
    if problem:
        raise InvalidArgument(f"failed to load '{model}': not a valid model name: {problem}")
    if _depth > ensemble_graph.MAX_DEPTH:
        raise InvalidArgument(
            f"failed to load '{model}': ensembles nest deeper than {ensemble_graph.MAX_DEPTH}"
        )
    parsed = None
    if config is not None:
        if not isinstance(config, str):
            raise InvalidArgument(
                "parameter 'config' must be a string holding the model config as JSON"
            )
        parsed = json_to_config(config, model=model)  # a clear 400 now, not a failed load later
    checked: dict[str, bytes] = {}
    for key, data in (files or {}).items():
        if not isinstance(key, str) or not key.startswith("file:"):
            raise InvalidArgument(
                f"failed to load '{model}': file keys are 'file:<version>/<path>', not {key!r}"
            )
        if not isinstance(data, bytes | bytearray):
            raise InvalidArgument(f"failed to load '{model}': {key} must be bytes")
        if config is None:
            raise InvalidArgument(
                f"failed to load '{model}': 'file:' parameters need a 'config' parameter too"
            )
        try:
            checked[control_bus.check_file_path(model, key.removeprefix("file:"))] = bytes(data)
        except ValueError as exc:
            raise InvalidArgument(f"failed to load '{model}': {exc}") from None
    if not checked and not settings.model_folder(model).is_dir():
        raise InvalidArgument(f"failed to load '{model}': it is not in the model repository")
    steps = _ensemble_steps(client, settings, model, parsed)
    for step in steps:
        load(client, settings, step, states=states, refresh=refresh, _depth=_depth + 1)
    control_bus.set_override(client, model, config, checked or None)
    if steps:  # ready once its steps are: the gateways run it
        control_bus.command(client, "load", model)
        if refresh is not None:
            refresh()
        return
    load_id = new_id()
    control_bus.command(client, "load", model, id=load_id)
    if refresh is not None:
        refresh()
    outcome: dict[str, Any] = {}

    def finished(st: dict[str, Any]) -> bool:
        if load_id in st.get("load_ids", ()) and not st.get("loading"):
            outcome.update(st)
            return True
        return False

    if not _wait(states or _fresh_states(client), model, LOAD_WAIT_S, finished):
        raise Unavailable(
            f"failed to load '{model}': no worker finished loading it within {LOAD_WAIT_S:.0f} s"
        )
    if not _serving(outcome):
        raise InvalidArgument(
            f"failed to load '{model}': {outcome.get('reason') or 'no version loaded'}"
        )


def unload(
    client: redis.Redis,
    settings: Settings,
    model: str,
    *,
    unload_dependents: bool = False,
    states: States | None = None,
    refresh: Callable[[], None] | None = None,
    _depth: int = 0,
) -> None:
    """Unload ``model`` everywhere; return once no worker serves it.

    With ``unload_dependents``, an ensemble's step models are unloaded too, as in Triton.
    """
    require_explicit(settings)
    control_bus.command(client, "unload", model)
    control_bus.set_override(client, model, None)
    if refresh is not None:
        refresh()
    gone = _wait(states or _fresh_states(client), model, UNLOAD_WAIT_S, lambda st: not _serving(st))
    if not gone:
        raise Unavailable(
            f"failed to unload '{model}': a worker still serves it after {UNLOAD_WAIT_S:.0f} s"
        )
    if unload_dependents and _depth < ensemble_graph.MAX_DEPTH:
        for step in _ensemble_steps(client, settings, model, None):
            unload(
                client,
                settings,
                step,
                unload_dependents=True,
                states=states,
                refresh=refresh,
                _depth=_depth + 1,
            )


def _ensemble_steps(
    client: redis.Redis, settings: Settings, model: str, config: ModelConfig | None
) -> list[str]:
    """The step models of ``model`` if it is an ensemble (from ``config``, else its files)."""
    if config is None:
        # Only an ensemble's steps are wanted here, and an ensemble has nothing to
        # auto-complete: read with no completer (the frontend imports no backend) and
        # auto-complete off, so other models are not completed (or reported) for nothing.
        repository = control_bus.open_repository(settings, client)
        repository.auto_complete = False
        entry = repository.read_model(model)
        if entry.backend != ensemble_graph.ENSEMBLE or entry.config is None:
            return []
        config = entry.config
    elif config.platform != ensemble_graph.ENSEMBLE:
        return []
    return list(dict.fromkeys(s.model for s in ensemble_graph.steps(config) if s.model != model))


__all__ = ["LOAD_WAIT_S", "UNLOAD_WAIT_S", "load", "require_explicit", "unload"]
