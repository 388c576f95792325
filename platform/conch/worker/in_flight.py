"""The messages a worker holds (popped, not yet acked or handed back), by tag.

Every drain loop of a worker adds what it pops and lets go of what it acks or hands back;
the heartbeat reads them, to keep them from being restored by the visibility timeout
while they run.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class InFlight:
    """Tags this worker holds, so a heartbeat can keep them from being restored."""

    tags: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, tags: list[str]) -> None:
        with self.lock:
            self.tags.update(tags)

    def discard(self, tags: list[str]) -> None:
        with self.lock:
            self.tags.difference_update(tags)

    def snapshot(self) -> list[str]:
        with self.lock:
            return list(self.tags)
