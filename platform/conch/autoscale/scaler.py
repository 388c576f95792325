"""How many workers a group should run: the scaling formula, with a cooldown on the way down.

The formula is ``work_owed.desired_workers``, the one the chart's KEDA trigger computes.
What it adds is time: more workers are started at once, fewer only once the higher count
has not been wanted for ``cooldown_s``. That is the HPA's scale-down stabilization window
(KEDA scales through an HPA), and it keeps a bursty queue from starting and retiring a
worker on every poll; going to zero waits out the same cooldown, as KEDA's
``cooldownPeriod``. Pure logic: the caller brings the clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from conch.settings import Settings
from conch.wire.work_owed import desired_workers


@dataclass(frozen=True)
class ScalePolicy:
    """A worker group's bounds and tuning (``--workers MIN:MAX`` and the flags beside it)."""

    minimum: int
    maximum: int
    target_per_worker: float
    activation: int = 0
    cooldown_s: float = 300.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ScalePolicy:
        if settings.workers is None:
            raise ValueError("the autoscaler needs --workers MIN:MAX")
        return cls(
            settings.workers.minimum,
            settings.workers.maximum,
            settings.target_work_per_worker,
            settings.activation_work,
            settings.scale_down_cooldown_secs,
        )

    def wanted(self, owed: int) -> int:
        """Workers for ``owed`` work right now, with no memory."""
        return desired_workers(
            owed, self.target_per_worker, self.minimum, self.maximum, self.activation
        )


class Scaler:
    """The worker count to run: the most wanted at any poll of the last ``cooldown_s``.

    A sliding-window maximum: ``_window`` keeps (time, count) pairs whose counts fall from
    left to right, so its head is the maximum, and a count is dropped once a later poll
    wanted as many or more (it can never be the maximum again) or once it is older than
    the window.
    """

    def __init__(self, policy: ScalePolicy) -> None:
        self.policy = policy
        self._window: deque[tuple[float, int]] = deque()

    def decide(self, owed: int, now: float) -> int:
        """Workers to run, given the work owed at monotonic time ``now``."""
        wanted = self.policy.wanted(owed)
        while self._window and self._window[0][0] <= now - self.policy.cooldown_s:
            self._window.popleft()
        while self._window and self._window[-1][1] <= wanted:
            self._window.pop()
        self._window.append((now, wanted))
        return self._window[0][1]


__all__ = ["ScalePolicy", "Scaler"]
