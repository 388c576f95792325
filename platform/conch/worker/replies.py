"""Where a worker's answers go: the waiting caller's reply list, or the job store.

A request someone waits on names a reply list (``reply_to``: a gateway process, a BLS
call, a batch job), and its reply is pushed there. An async job (``job_ttl``) has no
one waiting: its reply is written where Celery's Redis result backend keeps a task's
result (``conch.wire.job_store``), for the job API and Celery's ``AsyncResult`` to read.
The batcher hands every reply to a ``ReplySink`` and knows neither format; this is the
only worker module that imports the job store.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from conch.wire import job_store, stream_log
from conch.wire.messages import REPLY_TTL_S, InferMessage, Reply, reply_packer
from conch.wire.redis_link import CommandQueue


class ReplySink:
    """One model's replies, queued on the caller's pipeline (which also acks them)."""

    def __init__(self, client: redis.Redis, model: str) -> None:
        self.client = client
        self.model = model

    def deliver(self, pipe: CommandQueue, msg: InferMessage, reply: Reply) -> None:
        self.deliver_all(pipe, [(msg, reply)])

    def deliver_all(
        self, pipe: CommandQueue, answers: Iterable[tuple[InferMessage, Reply]]
    ) -> None:
        by_list: dict[str, list[bytes]] = {}
        packer = reply_packer()  # one for the batch's replies
        for msg, reply in answers:
            if msg.job_ttl:
                job_store.store(pipe, msg.id, self.model, reply, msg.job_ttl)
            elif msg.reply_to:
                by_list.setdefault(msg.reply_to, []).append(reply.pack(packer))
        for key, packed in by_list.items():  # one push per gateway process, not per request
            pipe.rpush(key, *packed)
            pipe.expire(key, REPLY_TTL_S)

    def cancelled(self, msgs: Iterable[InferMessage]) -> set[str]:
        """The ids of the requests among ``msgs`` cancelled since they were queued: async
        jobs cancelled through the job API, and watched streams whose every reader went
        away (their lease lapsed: ``conch.wire.stream_log``)."""
        msgs = list(msgs)
        gone = job_store.cancelled(self.client, [m.id for m in msgs if m.job_ttl])
        watched = [m.id for m in msgs if m.watched]
        if watched:
            alive = stream_log.held(self.client, watched)
            gone.update(i for i, held in zip(watched, alive, strict=True) if not held)
        return gone
