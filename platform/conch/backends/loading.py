"""A model version's backends loaded, warmed up and unloaded, for any process that runs one.

A worker's instance slots (``conch.worker.host``), its process instances
(``conch.worker.process_instance``) and an embedded server (``conch.embedded``) all load
models here, so a backend is built, loaded and warmed up the same way wherever it runs, and
a version that fails to load leaves nothing loaded behind it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from conch.backends import Backend, backend_class
from conch.backends.base import BlsPort, InstanceSpec
from conch.backends.warmup import run_warmup
from conch.core.repository import ModelEntry

log = logging.getLogger(__name__)


def load_backends(entry: ModelEntry, spec: InstanceSpec, bls: BlsPort | None) -> dict[int, Backend]:
    """Every version's backend for the instance ``spec``, loaded and warmed up (before
    the model is reported ready); what was loaded is unloaded again if one fails."""
    cls = backend_class(entry.backend)
    loaded: dict[int, Backend] = {}
    try:
        for version in entry.versions:
            backend = cls(dataclasses.replace(entry.spec(version), bls=bls), spec)
            backend.load()
            loaded[version] = backend
            run_warmup(backend, backend.spec)
    except Exception:
        unload(entry.name, loaded.values())
        raise
    return loaded


def unload(model: str, backends: Iterable[Backend]) -> None:
    """Unload ``backends``; a failure is logged, and the others are unloaded all the same."""
    for backend in backends:
        try:
            backend.unload()
        except Exception:
            log.exception("model '%s': unload failed", model)
