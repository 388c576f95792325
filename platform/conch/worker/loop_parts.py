"""What one drain loop is made of, named: the parts its pieces share.

A drain loop is a thread and the pieces it calls: a ``batcher.Batcher`` forms the batches,
its ``admission.Admission`` admits what it pops, its ``runner.Runner`` runs each batch and
sends the replies, and the runner's ``streams.Streams`` answers a decoupled model's
requests. They all work for one model, on one instance's backends, with one queue and the
worker's accounts. Those parts are built once per loop (``conch.worker.instance``, or a
test with its fakes) into one of the types here, and each piece takes from it what it
needs, as Celery's bootsteps take theirs from the one parent they are given; nothing of a
loop travels as a loose list of arguments or an untyped dict.

``WorkerParts`` is what every drain loop of one worker (or one process instance) shares,
handed to ``instance.drain_loop``; ``LoopParts`` is what every drain loop has, a sequence
model's (``SequenceBatcher``) included; ``QueueParts`` adds what a loop on a model's queue shares among its batcher,
admission, runner and streams.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import redis

from conch.backends import Backend
from conch.settings import Settings
from conch.wire.rate_limits import FleetLimiter
from conch.wire.redis_link import CommandQueue, RedisLink
from conch.worker.bundle_ledger import BundleLedger
from conch.worker.drain import Drain
from conch.worker.in_flight import InFlight
from conch.worker.replies import ReplySink
from conch.worker.reply_order import Sequencer

# Held around each execution: the rate limiter's resources (``conch.worker.rate_limiter``).
Gate = Callable[[], AbstractContextManager[None]]
# Given each batch's counts, for the worker's own telemetry (``telemetry.WorkerTelemetry``).
OnBatch = Callable[[str, dict[str, int]], None]
# May add commands to the round trip that sends a batch's replies (``metrics_publisher``).
OnSend = Callable[[CommandQueue], None]


@dataclass(frozen=True, eq=False, kw_only=True)
class WorkerParts:
    """What every drain loop of one worker process (or one process instance) shares: its
    Redis client and settings, its id (which sequences it holds are named by), the tags it
    holds (``inflight``), its telemetry's and metrics' hooks, and with ``--rate-limit`` the
    fleet's ``limiter``."""

    client: redis.Redis
    settings: Settings
    worker_id: str
    inflight: InFlight
    on_batch: OnBatch | None = None
    on_send: OnSend | None = None
    limiter: FleetLimiter | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class LoopParts:
    """The parts of any drain loop.

    ``backends`` maps each loaded version to its instance in this loop's slot, so a batch
    splits by the version its requests ask for. ``stopping`` is set when the loop stops;
    the ``gate`` shares it, so that a wait for rate-limit resources ends with the loop.
    """

    client: redis.Redis
    model: str
    backends: dict[int, Backend]
    name: str  # the loop's thread, which its log lines name
    stopping: threading.Event = field(default_factory=threading.Event)
    gate: Gate | None = None
    on_batch: OnBatch | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class QueueParts(LoopParts):
    """The parts of a drain loop on a model's queue, shared by its batcher, admission,
    runner and streams: where requests come from (``drain``) and their replies go
    (``sink``, through the loop's own round trips, ``link``), the tags the worker holds
    (``inflight``), the bundles not yet settled (``ledger``), and with
    ``preserve_ordering`` the ``sequencer`` the model's loops share.

    ``max_attempts``: a message delivered more often is dead-lettered. ``samples``: each
    request's latencies are kept for the summaries.
    """

    drain: Drain
    sink: ReplySink
    link: RedisLink
    inflight: InFlight
    ledger: BundleLedger = field(default_factory=BundleLedger)
    sequencer: Sequencer | None = None
    on_send: OnSend | None = None
    max_attempts: int = 3
    samples: bool = False
