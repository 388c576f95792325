"""The gateway's side of sequence models: each request goes to its sequence's mailbox.

A model with ``sequence_batching`` keeps every request of one sequence on one worker slot,
in order (``conch.wire.sequences``, ``conch.worker.sequence_batcher``). Here a request is
checked for Triton's sequence parameters, and appended to its sequence's mailbox instead of
the model's shared queue; a request that continues a sequence that does not exist (never
started, ended, or idled out) is refused with Triton's error before anything is queued.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from conch.core.errors import InvalidArgument
from conch.core.sequence import (
    SequenceKey,
    SequenceSpec,
    check_request,
    not_started_error,
    sequence_params,
)
from conch.wire import broker, sequences
from conch.wire.messages import InferMessage

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig


class SequenceRoute:
    """Sequence models' specs (read once per config) and the mailbox publisher."""

    def __init__(self, client: redis.Redis) -> None:
        self.publisher = sequences.SequencePublisher(client)
        # model -> (the config read, its spec): one entry a model, replaced on a reload.
        self._specs: dict[str, tuple[ModelConfig, SequenceSpec | None]] = {}

    def spec(self, config: ModelConfig) -> SequenceSpec | None:
        """The model's sequence batching, None for a model without it."""
        known = self._specs.get(config.name)
        if known is None or known[0] is not config:
            known = (config, SequenceSpec.from_config(config))
            self._specs[config.name] = known
        return known[1]

    @staticmethod
    def mark(
        spec: SequenceSpec | None, model: str, request: Any, batch_size: int, msg: InferMessage
    ) -> None:
        """Check the request's sequence parameters against its model with Triton's errors
        (a sequence model's request without an id, or of more than one row) and put the
        sequence on its message. Other models ignore the parameters, as Triton's other
        schedulers do (the protocol codecs have checked their types already)."""
        if spec is None:
            return
        key = check_request(
            spec, model, request.parameters, batch_size=batch_size, request_id=request.id
        )
        if key is None:
            return
        _, start, end = sequence_params(request.parameters)
        msg.sequence = (key.value, start, end)

    def route(self, spec: SequenceSpec) -> Callable[[InferMessage], None]:
        """What ``Dispatcher.submit`` sends the message with: its sequence's mailbox."""

        def publish(msg: InferMessage) -> None:
            assert msg.sequence is not None
            seq_id, start, _ = msg.sequence
            raw = broker.envelope(
                msg.to_dict(),
                task_id=msg.id,
                queue=sequences.mail_key(msg.model, sequences.token(seq_id)),
                priority=0,
                reply_to=msg.reply_to,
            )
            ttl = max(60, int(spec.idle_s * 4) + 1)
            if not self.publisher.publish(
                msg.model, seq_id, raw, start=start, now=time.time(), ttl_s=ttl
            ):
                raise not_started_error(msg.model, SequenceKey(seq_id))

        return publish

    @staticmethod
    def refuse_job(model: str) -> InvalidArgument:
        return InvalidArgument(
            f"model '{model}' is a sequence model: its requests must reach it in order on one "
            "stream, which async and batch jobs do not keep; call infer"
        )
