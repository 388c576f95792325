"""The data plane's logging and trace extensions: settings changed while conch runs.

``DataPlane`` hands these calls here. A change is checked whole first (a wrong value
changes nothing anywhere: a 400), then published for every process to apply
(``conch.wire.log_control``, ``conch.wire.trace_control``) and applied here with every
setting stored so far, so a change another gateway process made a moment before, which
this one's follower may not have heard yet, is not undone by it arriving late; each
frontend process follows them from its start (``frontend.composition``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from conch import server_log
from conch.core import trace_config, tracing
from conch.core.errors import InvalidArgument
from conch.frontend.model_view import ModelView
from conch.wire import log_control, trace_control


@dataclass(eq=False)
class LiveSettings:
    """The logging and trace settings calls of one data plane (see the module docstring)."""

    view: ModelView
    _client: redis.Redis

    def log_settings(self) -> dict[str, Any]:
        """Triton's logging extension: this process's log settings."""
        return server_log.current().to_json()

    def update_log_settings(self, changes: Any) -> dict[str, Any]:
        """Change the log settings of every process (``conch.wire.log_control``); the
        settings that follow here. A wrong value changes nothing anywhere (a 400)."""
        try:
            server_log.current().updated(changes)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        # The log file is each process's own: only an unchanged one gets through the check.
        shared = log_control.publish(
            self._client, {k: v for k, v in changes.items() if k != "log_file"}
        )
        return server_log.update({**shared, **changes}).to_json()

    def trace_settings(self, model: str = "") -> dict[str, Any]:
        """Triton's trace extension: the settings for ``model`` ("": for every model)."""
        if model:
            self.view.serving(model)  # 404 for a model not served
        return trace_config.to_json(tracing.sampler().configured(model))

    def update_trace_settings(self, changes: Any, model: str = "") -> dict[str, Any]:
        """Change sampling in every process (``conch.wire.trace_control``); the settings
        that follow here. A ``null`` value sends a model's setting back to the one for
        every model (that one, back to the flag's). A wrong value changes nothing."""
        self.trace_settings(model)  # the model's 404 first
        try:
            config = trace_config.updated(tracing.sampler().configured(model), changes)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if config.on and not config.mode:
            raise InvalidArgument(
                "tracing was not set up at start: give --trace-config mode=opentelemetry "
                "(and the collector's opentelemetry,url=...) to every process"
            )
        scoped = {
            f"{model}/{k}" if model else k: v
            for k, v in changes.items()
            if k not in ("trace_mode", "log_frequency")
        }
        if scoped:
            tracing.apply(trace_control.TRACING.publish(self._client, scoped))
        return self.trace_settings(model)


__all__ = ["LiveSettings"]
