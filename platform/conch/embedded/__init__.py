"""The embedded engine: models served inside the caller's process, with no Redis and no
other process (``conch.Server`` without a ``redis_url``; see ``docs/in-process.md``).

It is the worker's role without the broker: the same repository reading, backend loading
and warmup (``conch.backends.loading``), the same dynamic-batching arithmetic
(``conch.core.batch_policy``), the same ensemble walk (``conch.core.ensemble_run``), the
same BLS call checks (``conch.core.bls_call``) and Triton's statistics counted the same
way (``conch.wire.statistics.execution_counts``), with an in-memory queue per model where
a fleet has a Redis list.
"""
