"""Triton's ``dynamic_batching`` as a policy: when a forming batch is cut, and how much of
the queue it takes.

Pure arithmetic over row counts and times, so that every batcher cuts alike: a worker's
drain loop (``conch.worker.batcher``) and an embedded server's (``conch.embedded``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

# Why a batch was cut (conch's ``conch_batch_cut_total``'s ``reason``).
CUT_FULL, CUT_PREFERRED, CUT_DELAY, CUT_DRAINED = "full", "preferred", "delay", "drained"
CUT_REASONS = (CUT_FULL, CUT_PREFERRED, CUT_DELAY, CUT_DRAINED)


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int  # rows; 1 when the model does not batch dynamically
    max_queue_delay: float  # seconds, measured from the oldest request's enqueue time
    preferred: tuple[int, ...] = ()
    # Whether requests carry a batch dimension (max_batch_size > 0): each then counts its
    # first dimension's rows, with or without a dynamic batcher, as Triton counts
    # inference_count and batch_stats. False: each request is one row.
    batch_dimension: bool = True
    # A level's queue has a max_queue_size: the requests a forming batch holds still
    # count against it, as Triton's pending batch stays in its queue until it runs.
    bounded: bool = False

    @classmethod
    def from_config(cls, config: ModelConfig) -> BatchPolicy:
        if config.max_batch_size > 0 and config.HasField("dynamic_batching"):
            db = config.dynamic_batching
            preferred = tuple(
                sorted(p for p in db.preferred_batch_size if 0 < p <= config.max_batch_size)
            )
            policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
            bounded = any(p.max_queue_size > 0 for p in policies)
            delay = db.max_queue_delay_microseconds / 1e6
            return cls(config.max_batch_size, delay, preferred, bounded=bounded)
        return cls(1, 0.0, batch_dimension=config.max_batch_size > 0)

    def ready(self, rows: int) -> bool:
        """A batch this size need not wait for more."""
        return rows >= self.max_batch_size or rows in self.preferred

    def why_cut(self, rows: int, carried: bool, oldest: float, now: float) -> str:
        """Why a batch went when it did (``conch_batch_cut_total``'s reason): it reached a
        preferred size, it was full (or the next request did not fit), its oldest request
        waited out ``max_queue_delay``, or the queue ran dry with no delay left to wait
        for (no delay configured, or the worker stopping)."""
        if rows in self.preferred and rows < self.max_batch_size:
            return CUT_PREFERRED
        if rows >= self.max_batch_size or carried:
            return CUT_FULL
        if self.max_queue_delay > 0 and now >= oldest + self.max_queue_delay:
            return CUT_DELAY
        return CUT_DRAINED

    def cut(self, rows: list[int]) -> int:
        """How many of the queued requests (with these row counts) form the batch."""
        total, n = 0, 0
        for r in rows:
            if total + r > self.max_batch_size and n:
                break
            total, n = total + r, n + 1
        if total > self.max_batch_size or not self.preferred or total in self.preferred:
            return n
        # Prefer the largest preferred size that a prefix of the queue makes exactly.
        best, acc = 0, 0
        for k, r in enumerate(rows[:n], 1):
            acc += r
            if acc in self.preferred:
                best = k
        return best or n
