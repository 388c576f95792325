"""One model instance: its backends, loaded and warmed up, and the loop that drains into them.

An instance slot of ``instance_group`` holds one backend per loaded version, and one drain
loop on the model's queue (a ``Batcher``, or a ``SequenceBatcher`` for a sequence model)
that splits each batch by the versions its requests ask for. Both forms of an instance
build it here: the thread form in the worker process (``conch.worker.host``), the process
form in a child of its own (``conch.worker.process_instance``), so the two cannot drift.
"""

from __future__ import annotations

import threading

from conch.backends import Backend
from conch.backends.base import InstanceSpec
from conch.core.repository import ModelEntry
from conch.core.sequence import SequenceSpec, state_in_redis
from conch.wire.redis_link import RedisLink
from conch.worker import rate_limiter
from conch.worker.batcher import Batcher, BatchPolicy, Sequencer
from conch.worker.drain import Drain
from conch.worker.loop_parts import LoopParts, QueueParts, WorkerParts
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
    worker: WorkerParts,
    *,
    sequencer: Sequencer | None = None,
) -> DrainLoop:
    """The loop that drains ``entry``'s queue into one instance's ``backends`` (not
    started); with the worker's ``limiter``, each execution holds the instance's rate-limit
    resources."""
    seq = SequenceSpec.from_config(entry.config)
    limits = rate_limiter.instance_limits(entry, spec)
    # The loop's stop, shared with its gate: a stopping worker's wait for resources ends.
    stopping = threading.Event()
    gate = rate_limiter.gate(worker.limiter, limits, spec, stop=stopping)
    if seq is not None:
        parts = LoopParts(
            client=worker.client,
            model=entry.name,
            backends=backends,
            name=f"sequences-{spec.name}",
            stopping=stopping,
            gate=gate,
            on_batch=worker.on_batch,
        )
        return SequenceBatcher(
            parts,
            spec=seq,
            max_batch_size=entry.config.max_batch_size,
            worker_id=worker.worker_id,
            slot=spec.name,
            initial_state=seq.initial_state(entry.path),
            state_moves=state_in_redis(entry.config),
        )
    policy = BatchPolicy.from_config(entry.config)
    queue_parts = QueueParts(
        client=worker.client,
        model=entry.name,
        backends=backends,
        name=f"batcher-{spec.name}",
        stopping=stopping,
        gate=gate,
        on_batch=worker.on_batch,
        drain=Drain(worker.client, entry.name, hold=policy.bounded),
        sink=ReplySink(worker.client, entry.name),
        link=RedisLink(worker.client),
        inflight=worker.inflight,
        sequencer=sequencer,
        on_send=worker.on_send,
        max_attempts=worker.settings.max_attempts,
        samples=worker.settings.metrics_config.summary_latencies,
    )
    return Batcher(queue_parts, policy)
