"""Triton's queue policy, decided by the frontend before a request is queued.

``calls.build`` applies it to every online call: a client's request at the gateway, a
BLS call and an ensemble step (in the gateway, or in a worker for BLS).

From the model's ``dynamic_batching`` and the request's ``priority`` and ``timeout``
parameters: which priority sub-list the request joins, how long that queue may grow,
and how long it may wait before it is rejected or delayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from conch.core.model_config import per_config
from conch.wire import broker

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig


@dataclass(frozen=True)
class Admission:
    step: int  # the online priority sub-list
    max_queue_size: int  # 0 = unbounded
    queue_timeout_s: float  # 0 = none
    delay_on_timeout: bool  # Triton's timeout_action DELAY (else REJECT)
    # The queue policy took the request's ``timeout`` as its own (it allows the override),
    # so the timeout means that and nothing more, as in Triton.
    took_timeout: bool = False
    # How long the model's queue may keep the request before it runs or is refused: its
    # queue timeout (after which DELAY may still hold it for a batch), then the batcher's
    # ``max_queue_delay``. A caller's default wait counts from there.
    may_hold_s: float = 0.0


def admit(config: ModelConfig, priority: int | None, timeout_us: int | None) -> Admission:
    """Apply the model's queue policy to one request's parameters."""
    if priority or timeout_us:
        return _admit(config, priority, timeout_us)
    return _plain(config)  # the common case: neither a priority nor a timeout


def _admit(config: ModelConfig, priority: int | None, timeout_us: int | None) -> Admission:
    if not config.HasField("dynamic_batching"):
        return Admission(0, 0, 0.0, False)
    db = config.dynamic_batching
    level = 0
    if db.priority_levels > 0:
        # As Triton does: 0 or a level past the last one means the default level.
        level = (
            priority if priority and priority <= db.priority_levels else db.default_priority_level
        )
    policy = db.priority_queue_policy.get(level, db.default_queue_policy)
    timeout = policy.default_timeout_microseconds
    took = bool(timeout_us and policy.allow_timeout_override)
    if took:
        # A request may shorten the model's queue timeout, not lengthen it.
        timeout = min(timeout, timeout_us) if timeout else timeout_us
    delay = policy.timeout_action == policy.DELAY
    return Admission(
        broker.online_step(level) if level else 0,
        policy.max_queue_size,
        timeout / 1e6,
        delay,
        took,
        (timeout + db.max_queue_delay_microseconds) / 1e6,
    )


_plain = per_config(lambda config: _admit(config, None, None))


def longest_hold_s(config: ModelConfig) -> float:
    """The longest the model's queue may keep a request of any level (``Admission.may_hold_s``
    of the level whose policy waits longest); 0 without dynamic batching."""
    if not config.HasField("dynamic_batching"):
        return 0.0
    db = config.dynamic_batching
    policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
    timeout = max(p.default_timeout_microseconds for p in policies)
    return (timeout + db.max_queue_delay_microseconds) / 1e6
