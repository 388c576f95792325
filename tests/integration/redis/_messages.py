"""The request the Redis-level tests queue: one FP32 input, its deadline seconds away."""

from __future__ import annotations

import time

from conch.wire import broker
from conch.wire.messages import InferMessage


def infer_message(model: str = "m", deadline_s: float = 5.0) -> InferMessage:
    now = time.time()
    return InferMessage(
        id=broker.new_id(),
        model=model,
        version=1,
        inputs=[("X", "FP32", (1,), b"\0\0\0\0")],
        outputs=["Y"],
        reply_to=None,
        enqueued=now,
        deadline=now + deadline_s,
    )
