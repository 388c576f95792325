"""How a supervising command (``conch serve``, ``conch grpc --grpc-workers``) learns it is
asked to stop: SIGTERM or SIGINT set a flag its loop reads, so the loop stops its children
itself instead of dying with them still running."""

from __future__ import annotations

import signal


class StopSignal:
    """Installs the handlers on creation; ``requested`` turns true at the first signal."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, _signum: int, _frame: object) -> None:
        self.requested = True
