"""The data plane's model repository extension: the index, and explicit load and unload.

``DataPlane`` hands these calls here. Load and unload are ``model_control``'s, which a
Python model's ``pb_utils.load_model`` shares; what is the data plane's own is the
check on uploaded files, which only a client's call can carry, and the model view's
fresh worker states that a load or unload waits on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from conch.core.errors import Forbidden
from conch.frontend import model_control
from conch.frontend.model_view import ModelView
from conch.settings import Settings

_CONTROL_STATES_MAX_AGE_S = 0.05  # how stale worker states may be while a load waits


@dataclass(eq=False)
class RepositoryApi:
    """The repository calls of one data plane (see the module docstring)."""

    settings: Settings
    view: ModelView
    _client: redis.Redis

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.view.index(ready_only)

    def load(self, model: str, *, config: str | None = None, files: dict[str, bytes]) -> None:
        """Explicit model control: load ``model`` everywhere (``model_control.load``).

        ``files`` (``file:`` parameters) are code and weights a worker will run, from
        whoever can reach the API: refused unless ``--allow-model-upload`` is on. (A
        Python model's ``pb_utils.load_model`` does not come through here: that code
        is the repository's, trusted already.)
        """
        if files and not self.settings.allow_model_upload:
            raise Forbidden(
                f"failed to load '{model}': model file uploads ('file:' parameters) are "
                "disabled; start conch with --allow-model-upload to allow them"
            )
        model_control.load(
            self._client,
            self.settings,
            model,
            config=config,
            files=files,
            states=self._fresh_states,
            refresh=self.view.refresh,
        )

    def unload(self, model: str, *, unload_dependents: bool = False) -> None:
        model_control.unload(
            self._client,
            self.settings,
            model,
            unload_dependents=unload_dependents,
            states=self._fresh_states,
            refresh=self.view.refresh,
        )

    def _fresh_states(self) -> dict[str, dict[str, Any]]:
        return self.view.states(max_age=_CONTROL_STATES_MAX_AGE_S)


__all__ = ["RepositoryApi"]
