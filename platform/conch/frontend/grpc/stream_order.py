"""A stream's requests of one sequence run one after another, in the order read.

``ModelStreamInfer`` runs a stream's requests concurrently, each answered as it finishes.
Requests of one sequence must reach its mailbox in the order the client sent them (Triton
runs a sequence in arrival order), so they are chained: the next starts when the one
before it has been answered. Other requests, and other sequences, do not wait.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any


def sequence_of(request: Any) -> tuple[str, Any] | None:
    """The sequence a ``ModelInferRequest`` belongs to (its model and id), or None."""
    if "sequence_id" not in request.parameters:
        return None
    param = request.parameters["sequence_id"]
    value = getattr(param, param.WhichOneof("parameter_choice") or "int64_param")
    if value in (0, ""):
        return None
    return request.model_name, value


class SequenceLanes:
    """Runs ``run(request)`` on ``pool``: at once, or after the earlier requests of the
    same sequence on this stream."""

    def __init__(self, pool: Executor, run: Callable[[Any], None]) -> None:
        self.pool = pool
        self.run = run
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, Any], deque[Any]] = {}

    def submit(self, request: Any) -> None:
        key = sequence_of(request)
        if key is None:
            self.pool.submit(self.run, request)
            return
        with self._lock:
            queued = self._waiting.get(key)
            if queued is not None:  # one of its sequence runs: it goes after it
                queued.append(request)
                return
            self._waiting[key] = deque()
        self.pool.submit(self._chain, key, request)

    def _chain(self, key: tuple[str, Any], request: Any) -> None:
        while True:
            try:
                self.run(request)
            finally:
                with self._lock:
                    queued = self._waiting[key]
                    if not queued:
                        del self._waiting[key]
                        request = None
                    else:
                        request = queued.popleft()
            if request is None:
                return
