"""One model instance: its backends, loaded and warmed up, and the loop that drains into them.

An instance slot of ``instance_group`` holds one backend per loaded version, and one drain
loop on the model's queue (a ``Batcher``, or a ``SequenceBatcher`` for a sequence model)
that splits each batch by the versions its requests ask for. Both forms of an instance
build it here: the thread form in the worker process (``conch.worker.host``), the process
form in a child of its own (``conch.worker.process_instance``), so the two cannot drift.
"""

from __future__ import annotations

import threading

import redis

from conch.backends import Backend
from conch.backends.base import InstanceSpec
from conch.core.repository import ModelEntry
from conch.core.sequence import SequenceSpec, state_in_redis
from conch.settings import Settings
from conch.wire.rate_limits import FleetLimiter
from conch.wire.redis_link import RedisLink
from conch.worker import rate_limiter
from conch.worker.batcher import Batcher, BatchPolicy, InFlight, Sequencer
from conch.worker.drain import Drain
from conch.worker.loop_parts import LoopParts, OnBatch, OnSend, QueueParts
from conch.worker.replies import ReplySink
from conch.worker.sequence_batcher import SequenceBatcher

DrainLoop = Batcher | SequenceBatcher


def ordered(entry: ModelEntry) -> bool:
    """Whether the model asks for ``preserve_ordering``: its replies leave in the order its
    requests were popped, which a ``Sequencer`` shared by its drain loops keeps, so they
    must share one process."""
    cfg = entry.config
    return cfg.HasField("dynamic_batching") and cfg.dynamic_batching.preserve_ordering


def drain_loop(
    entry: ModelEntry,
    backends: dict[int, Backend],
    spec: InstanceSpec,
    *,
    client: redis.Redis,
    settings: Settings,
    worker_id: str,
    inflight: InFlight,
    on_batch: OnBatch | None = None,
    on_send: OnSend | None = None,
    sequencer: Sequencer | None = None,
    limiter: FleetLimiter | None = None,
) -> DrainLoop:
    """The loop that drains ``entry``'s queue into one instance's ``backends`` (not
    started); with ``limiter``, each execution holds the instance's rate-limit resources."""
    seq = SequenceSpec.from_config(entry.config)
    limits = rate_limiter.instance_limits(entry, spec)
    # The loop's stop, shared with its gate: a stopping worker's wait for resources ends.
    stopping = threading.Event()
    gate = rate_limiter.gate(limiter, limits, spec, stop=stopping)
    if seq is not None:
        parts = LoopParts(
            client=client,
            model=entry.name,
            backends=backends,
            name=f"sequences-{spec.name}",
            stopping=stopping,
            gate=gate,
            on_batch=on_batch,
        )
        return SequenceBatcher(
            parts,
            spec=seq,
            max_batch_size=entry.config.max_batch_size,
            worker_id=worker_id,
            slot=spec.name,
            initial_state=seq.initial_state(entry.path),
            state_moves=state_in_redis(entry.config),
        )
    policy = BatchPolicy.from_config(entry.config)
    queue_parts = QueueParts(
        client=client,
        model=entry.name,
        backends=backends,
        name=f"batcher-{spec.name}",
        stopping=stopping,
        gate=gate,
        on_batch=on_batch,
        drain=Drain(client, entry.name, hold=policy.bounded),
        sink=ReplySink(client, entry.name),
        link=RedisLink(client),
        inflight=inflight,
        sequencer=sequencer,
        on_send=on_send,
        max_attempts=settings.max_attempts,
        samples=settings.metrics_config.summary_latencies,
    )
    return Batcher(queue_parts, policy)
