"""The worker's side of Triton's rate limiter: an instance executes while it holds its
resources, counted across the fleet (``conch.wire.rate_limits``).

With ``--rate-limit execution_count``, each instance of a group whose config has
``rate_limiter { resources [...] priority }`` waits, before each execution, until every
resource it lists has the copies free, holds them while it executes, and gives them back.
A pool's copies are ``--rate-limit-resource`` where given (for the instance's device, else
for every device), else the most that any instance of the repository's models asks for,
as in Triton. Every worker reads the same repository and flags, so all agree on them.
With ``--rate-limit off`` (Triton's default) the configs' ``rate_limiter`` is not applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import redis

from conch.core.model_spec import InstanceSpec
from conch.core.repository import ModelEntry
from conch.settings import RateLimitMode, RateLimitResources, Settings
from conch.wire.rate_limits import FleetLimiter, ResourceNeed, Stopped

Gate = Callable[[], contextlib.AbstractContextManager[None]]


@dataclass(frozen=True)
class InstanceLimits:
    """What one instance holds while it executes, and its priority among waiters."""

    needs: tuple[ResourceNeed, ...]
    priority: int


def instance_limits(entry: ModelEntry, spec: InstanceSpec) -> InstanceLimits:
    """The ``rate_limiter`` of the instance group ``spec`` belongs to (its name is
    ``<group>_<index>``); none when the group has none."""
    config = entry.config
    if config is None:
        return InstanceLimits((), 1)
    group = next(
        (g for g in config.instance_group if spec.name.rsplit("_", 1)[0] == g.name),
        None,
    )
    if group is None or not group.HasField("rate_limiter"):
        return InstanceLimits((), 1)
    limiter = group.rate_limiter
    needs = tuple(
        ResourceNeed(r.name, int(r.count), bool(getattr(r, "global"))) for r in limiter.resources
    )
    return InstanceLimits(needs, max(1, int(limiter.priority or 1)))


def default_counts(entries: Iterable[ModelEntry]) -> dict[str, int]:
    """Each resource's copies when no flag says: the most any instance asks for."""
    counts: dict[str, int] = {}
    for entry in entries:
        if entry.config is None:
            continue
        for group in entry.config.instance_group:
            for r in group.rate_limiter.resources:
                counts[r.name] = max(counts.get(r.name, 0), int(r.count))
    return counts


def resource_conflict(entries: Iterable[ModelEntry]) -> str | None:
    """Triton's refusal, or None: a resource listed as global by one instance group and
    per device by another would be counted in two pools at once."""
    shared: dict[str, bool] = {}
    for entry in entries:
        if entry.config is None:
            continue
        for group in entry.config.instance_group:
            for r in group.rate_limiter.resources:
                is_global = bool(getattr(r, "global"))
                if shared.setdefault(r.name, is_global) != is_global:
                    return (
                        f'Resource "{r.name}" is present as both global and device-specific '
                        "resource in the model configuration."
                    )
    return None


def with_default_counts(settings: Settings, entries: Iterable[ModelEntry]) -> Settings:
    """``settings`` with the repository's default copies of every resource no
    ``--rate-limit-resource`` counts on every device, so that a process instance's child,
    which is sent the settings, counts as its worker does."""
    given = settings.rate_limit_resources.counts
    filled = {(n, None): c for n, c in default_counts(entries).items() if (n, None) not in given}
    if not filled:
        return settings
    resources = RateLimitResources({**filled, **given})
    return dataclasses.replace(settings, rate_limit_resources=resources)


def fleet_limiter(settings: Settings, client: redis.Redis) -> FleetLimiter | None:
    """The process's limiter under ``--rate-limit execution_count``, else None."""
    if settings.rate_limit is not RateLimitMode.EXECUTION_COUNT:
        return None
    given = settings.rate_limit_resources.counts

    def capacity(need: ResourceNeed, device: int) -> int:
        for key in ((need.name, device), (need.name, None)):
            if key in given:
                return given[key]
        return need.count  # a resource no model of the repository listed at start

    return FleetLimiter(client, capacity)


def gate(
    limiter: FleetLimiter | None,
    limits: InstanceLimits,
    spec: InstanceSpec,
    stop: threading.Event | None = None,
) -> Gate | None:
    """What an instance's drain loop runs each execution inside, or None (no limit).

    ``stop`` is the drain loop's own stop: a worker that stops while an execution waits
    for its resources must not wait for them (as long as another execution holds them),
    so the wait ends and the gate raises ``Stopped``, for the loop to hand the batch back.
    """
    if limiter is None or not limits.needs:
        return None

    @contextlib.contextmanager
    def held() -> Iterator[None]:
        with limiter.holding(limits.needs, spec.device_id, priority=limits.priority, stop=stop):
            yield

    return held


__all__ = [
    "Gate",
    "InstanceLimits",
    "Stopped",
    "default_counts",
    "fleet_limiter",
    "gate",
    "instance_limits",
    "resource_conflict",
    "with_default_counts",
]
