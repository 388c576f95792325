"""The one message builder: a checked request for a model, as the queue message that carries it.

Every frontend caller queues work through here: the gateway (a client's infer call and
its async jobs), a Python model's BLS call, an ensemble's steps (run by either) and a
batch job's lines. Each used to build its ``InferMessage`` itself, and the rules had
drifted apart (the "latest version" rule was written out five ways). The rules, once:

- **Version.** A request that names no version ("" or -1) is sent as -1: the worker
  answers with the latest version it serves, so such requests share batches however the
  repository moved meanwhile, and the reply says which version ran. A named version is
  checked against the repository and sent as is. (A gateway's client request to a model
  with a traffic split gets a version drawn by weight first: ``conch.frontend.traffic``.)
- **Lane.** Where the message waits in its model's queue (``Lane``): an online call that
  someone waits on takes the step the target's queue policy gives it (``admission``),
  unless the work it is made for sits below online work (an async job's or a batch
  job's BLS calls stay there); async jobs and offline work (a batch job's messages) have
  fixed steps below every online request.
- **Deadline.** An online call inherits the deadline of the work it is made for (a BLS
  call's batch, an ensemble's outer request); the request's own ``timeout`` only
  shortens it. With nothing to inherit, the timeout replaces the default, which counts
  from when the target's queue would let the request go (its queue timeout and
  ``max_queue_delay``: Triton's queues keep a request that long whatever the caller's
  default). Where Triton gives ``timeout`` a meaning of its own, it has that
  meaning only and sets no deadline: the queue timeout of a policy that allows the
  override, and an ensemble's, which its steps take. A call whose inherited deadline
  has passed is refused here rather than queued to be dropped.

The caller checks the request against the target's config first
(``core.validation.validate_request``); nothing here looks at tensors.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from conch.core import tracing
from conch.core.ensemble_graph import ENSEMBLE
from conch.core.errors import Unavailable
from conch.core.inference import InferRequest
from conch.core.repository import ModelEntry
from conch.frontend.admission import admit
from conch.wire import broker
from conch.wire.messages import InferMessage

LATEST = -1  # the version a message carries when the worker picks its latest


class Lane(enum.Enum):
    """Where a message waits in its model's queue, and for how long."""

    ONLINE = "online"  # someone waits: the queue policy, a deadline always
    ASYNC = "async"  # an async job: below online work, a deadline only from its timeout
    OFFLINE = "offline"  # a batch job's message: below async jobs, no deadline


@dataclass(frozen=True)
class Target:
    """A model entry and the version a request asked of it."""

    entry: ModelEntry
    version: int  # resolved now: what a response names when the worker does not say
    latest: bool  # no version asked for: the message carries LATEST
    # A copy also goes to this version, its answer recorded, not returned (the model's
    # traffic split: ``conch.frontend.traffic``); 0: none.
    shadow: int = 0

    @property
    def wire_version(self) -> int:
        return LATEST if self.latest else self.version

    @property
    def decoupled(self) -> bool:
        """The model may send any number of responses to a request (Triton's
        ``model_transaction_policy { decoupled: true }``; an ensemble with such a step)."""
        return self.entry.config.model_transaction_policy.decoupled


def target(entry: ModelEntry, asked: str | int | None) -> Target:
    """Resolve the version ``asked`` ("", "-1", -1 or None: the latest) of ``entry``;
    an unknown version raises ``NotFound``."""
    text = "" if asked is None else str(asked).strip()
    return Target(entry, entry.resolve_version(text), text in ("", "-1"))


@dataclass(frozen=True)
class Caller:
    """What a call inherits from the work it is made for (nothing, for a client's call)."""

    deadline: float = 0.0  # epoch seconds; 0 = none
    priority: int = 0  # that work's queue step; a step below online work is kept
    chain: Sequence[str] = field(default_factory=tuple)  # models waiting on the call (BLS)


CLIENT = Caller()


@dataclass(frozen=True)
class Call:
    """A message ready to publish, and how full its queue may be when it is."""

    msg: InferMessage
    max_queue_size: int  # of the target's queue at the message's step; 0 = unbounded
    version: int  # resolved when built: a reply without a version ran this one


def build(
    to: Target,
    request: InferRequest,
    *,
    lane: Lane = Lane.ONLINE,
    caller: Caller = CLIENT,
    default_timeout_s: float = 0.0,
    reply_to: str | None = None,
) -> Call:
    """The message for ``request`` (already validated) to ``to``, under the rules above.

    ``default_timeout_s`` is an online call's deadline when the request sets no
    ``timeout`` and inherits no deadline, after what the target's queue may hold it (an
    ensemble's caller adds its steps' queues: ``ensemble_runner.steps_hold_s``).
    """
    entry, config = to.entry, to.entry.config
    now = time.time()
    timeout_us = int(request.parameters.get("timeout") or 0)
    queue_deadline, delay, bound = 0.0, False, 0
    if lane is Lane.ONLINE:
        admission = admit(config, request.parameters.get("priority"), timeout_us or None)
        # Where Triton gives 'timeout' a meaning (a queue policy that takes it, an
        # ensemble that hands it to its steps), it has that one only; elsewhere it is
        # conch's deadline. The default never cuts short what the model's queue may hold.
        own = 0 if admission.took_timeout or entry.backend == ENSEMBLE else timeout_us
        deadline = _deadline(now, own, caller.deadline, default_timeout_s + admission.may_hold_s)
        if deadline <= now:
            raise Unavailable(
                f"Request timeout expired for model '{entry.name}': the request that made "
                "this call is past its deadline"
            )
        step = caller.priority if caller.priority >= broker.ONLINE_STEPS else admission.step
        if admission.queue_timeout_s:
            queue_deadline = now + admission.queue_timeout_s
        delay, bound = admission.delay_on_timeout, admission.max_queue_size
    elif lane is Lane.ASYNC:
        # A job waits behind online traffic for as long as it must: no deadline unless
        # the client set a 'timeout', and the online queue policy does not apply.
        deadline = now + timeout_us / 1e6 if timeout_us else 0.0
        step = broker.PRIORITY_ASYNC
    else:  # offline work waits as long as online traffic keeps the model busy
        deadline, timeout_us, step = 0.0, 0, broker.PRIORITY_OFFLINE
    msg = InferMessage(
        id=broker.new_id(),
        model=entry.name,
        version=to.wire_version,
        inputs=request.wire_inputs(),
        outputs=request.output_names(config),
        reply_to=reply_to,
        enqueued=now,
        deadline=deadline,
        priority=step,
        params=request.custom_parameters(),
        queue_deadline=queue_deadline,
        delay_on_timeout=delay,
        client_id=request.id,
        timeout_us=timeout_us,
        priority_level=int(request.parameters.get("priority") or 0),
        chain=list(caller.chain),
        traceparent=tracing.current_traceparent(),
    )
    return Call(msg, bound, to.version)


def _deadline(now: float, timeout_us: int, inherited: float, default_s: float) -> float:
    if inherited > 0:
        return min(inherited, now + timeout_us / 1e6) if timeout_us else inherited
    return now + (timeout_us / 1e6 if timeout_us else default_s)


__all__ = ["CLIENT", "LATEST", "Call", "Caller", "Lane", "Target", "build", "target"]
