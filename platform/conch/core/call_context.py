"""What a model calling another model (BLS) inherits from the batch it is executing.

The Python backend sets ``CURRENT`` around ``execute`` (worker side); the BLS client reads
it when a call is made (frontend side). It lives in the core because both rooms need it and
neither may import the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallContext:
    """What a BLS call inherits from the batch being executed."""

    model: str  # the model executing
    chains: tuple[tuple[str, ...], ...] = ()  # per request of the batch: models waiting on it
    deadline: float = 0.0  # epoch seconds, the batch's smallest; 0 = none
    priority: int = 0  # the batch's best (smallest) queue priority step

    def waiting(self) -> list[str]:
        """Every model waiting on a call made now, outermost first, the caller last."""
        names = dict.fromkeys(name for chain in self.chains for name in chain)
        names.pop(self.model, None)
        return [*names, self.model]

    def longest(self) -> list[str]:
        """The longest path of calls that ends at the caller."""
        return [*max(self.chains, key=len, default=()), self.model]

    def cycle(self, target: str) -> list[str] | None:
        """The path a call to ``target`` would close into a cycle, or None."""
        for chain in sorted(self.chains, key=len):
            path = [*chain, self.model]
            if target in path:
                return [*path[path.index(target) :], target]
        return [self.model, target] if target == self.model else None


CURRENT: ContextVar[CallContext | None] = ContextVar("conch_bls_call", default=None)


def batch_context(model: str, requests: Iterable[Any]) -> CallContext:
    """The context of one batch of ``BackendRequest``s executing on ``model``."""
    requests = list(requests)
    deadlines = [r.deadline for r in requests if r.deadline > 0]
    return CallContext(
        model=model,
        chains=tuple(tuple(r.chain) for r in requests),
        deadline=min(deadlines, default=0.0),
        priority=min((r.priority for r in requests), default=0),
    )
