"""Sequences on Redis: how one stateful sequence's requests reach the worker slot that
holds it, in order, and outlive that worker.

A model with ``sequence_batching`` is not drained from its shared queue. Each sequence
(one correlation id of one model) has a record and a mailbox:

* the gateway appends each request to the sequence's mailbox (``publish``), in the order
  it got them, and wakes the slot that holds the sequence, or, when no slot holds it (a
  new sequence, or one whose worker died), offers the sequence on the model's claim list;
* a worker's sequence batcher claims sequences into its slots, runs the request at the
  head of each mailbox, and removes that head only in the round trip that sends its
  reply and saves the sequence's state (``commit`` in ``conch.worker.sequence_batcher``):
  a worker that dies mid-step leaves the request where the next holder finds it, with the
  state from before it;
* a sequence idle past ``max_sequence_idle_microseconds`` is ended by its holder, and its
  record with it, so a later request without START is refused as Triton refuses it.

Keys (``<m>`` a model, ``<s>`` a sequence's ``token``: ``i:<uint64>`` or ``s:<string>``)::

    conch.seq.<m>/<s>          hash    gateway (create, last), worker (owner, steps,
                                       running: its head runs now)
    conch.seq.<m>/<s>/mail     list    gateway RPUSH; the holder reads the head, LPOPs it
                                       when the step commits
    conch.seq.<m>/<s>/state    string  the holder after each step: the implicit state
                                       (conch.core.sequence.pack_state), expiring with
                                       the idle timeout
    conch.seqs.<m>/claims      list    gateway, a releasing or sweeping worker: tokens
                                       of sequences no slot holds
    conch.seqs.<m>/live        zset    gateway: token -> last request (epoch seconds);
                                       work_owed counts it, sweeps read it
    conch.seqs.<m>/wake        list    tokens that wake idle batchers (a claim waits)
    conch.seqs.<m>/wake/<slot> list    tokens that wake the slot's batcher
"""

from __future__ import annotations

import redis

from conch.core.sequence import SequenceKey
from conch.wire.broker import WAKE_CAP

SEQ_PREFIX = "conch.seq."
SEQS_PREFIX = "conch.seqs."


def token(seq_id: int | str) -> str:
    """A sequence id as it appears in keys (``SequenceKey.key``: 5 and "5" differ)."""
    return SequenceKey(seq_id).key


def seq_id_of(tok: str) -> int | str:
    """The id a ``token`` names."""
    kind, _, value = tok.partition(":")
    return int(value) if kind == "i" else value


def record_key(model: str, tok: str) -> str:
    return f"{SEQ_PREFIX}{model}/{tok}"


def mail_key(model: str, tok: str) -> str:
    return record_key(model, tok) + "/mail"


def state_key(model: str, tok: str) -> str:
    return record_key(model, tok) + "/state"


def claims_key(model: str) -> str:
    return f"{SEQS_PREFIX}{model}/claims"


def live_key(model: str) -> str:
    return f"{SEQS_PREFIX}{model}/live"


def wake_key(model: str, slot: str = "") -> str:
    """Where a batcher waits: its own slot's list, or the model's (claims)."""
    return f"{SEQS_PREFIX}{model}/wake" + (f"/{slot}" if slot else "")


def slot_wake_prefix(model: str) -> str:
    """``wake_key(model, slot)`` less the slot: the publish script adds the holder's."""
    return f"{SEQS_PREFIX}{model}/wake/"


# KEYS: record, mail, claims, live, model wake. ARGV: message, start (0/1), now, token,
# slot wake prefix, wake cap, record ttl (s).
# Returns 1 (queued), 0 (no such sequence: not started, ended or idled out).
_PUBLISH_LUA = """
local start = ARGV[2] == '1'
if not start and redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'last', ARGV[3])
redis.call('HSETNX', KEYS[1], 'owner', '')
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[7])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[4])
local owner = redis.call('HGET', KEYS[1], 'owner')
local wake = KEYS[5]
if owner == '' then
  if redis.call('HGET', KEYS[1], 'offered') ~= '1' then
    redis.call('HSET', KEYS[1], 'offered', '1')
    redis.call('RPUSH', KEYS[3], ARGV[4])
  end
else
  wake = ARGV[5] .. owner
end
redis.call('LPUSH', wake, '1')
redis.call('LTRIM', wake, 0, tonumber(ARGV[6]) - 1)
return 1
"""


class SequencePublisher:
    """The gateway's side: append a request to its sequence's mailbox."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._script = client.register_script(_PUBLISH_LUA)

    def publish(
        self, model: str, seq_id: int | str, raw: bytes, *, start: bool, now: float, ttl_s: int
    ) -> bool:
        """Append ``raw``; False when the sequence does not exist and ``start`` is not set.

        ``ttl_s`` bounds how long a sequence's keys outlive its last request if no
        worker ever ends it (the holder ends it at its idle timeout long before)."""
        tok = token(seq_id)
        keys = [
            record_key(model, tok),
            mail_key(model, tok),
            claims_key(model),
            live_key(model),
            wake_key(model),
        ]
        args = [raw, int(start), repr(now), tok, slot_wake_prefix(model), WAKE_CAP, ttl_s]
        return bool(self._script(keys=keys, args=args))


# KEYS: live. ARGV: record prefix. Every request in the live sequences' mailboxes, less
# the head of each whose holder runs it now (its record's 'running').
_PENDING_LUA = """
local n = 0
for _, tok in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local rec = ARGV[1] .. tok
  local mail = redis.call('LLEN', rec .. '/mail')
  if mail > 0 and redis.call('HGET', rec, 'running') == '1' then mail = mail - 1 end
  n = n + mail
end
return n
"""


def pending_requests(client: redis.Redis, model: str) -> int:
    """A sequence model's requests that wait to run (Triton's pending request count): in
    its mailboxes, but for the head a holder is running now."""
    script = client.register_script(_PENDING_LUA)
    return int(script(keys=[live_key(model)], args=[record_key(model, "")]))


def live_sequences(client: redis.Redis, model: str) -> int:
    """Sequences of ``model`` that have a record (each holds, or waits for, a slot)."""
    return int(client.zcard(live_key(model)))


__all__ = [
    "SequencePublisher",
    "claims_key",
    "live_key",
    "live_sequences",
    "mail_key",
    "pending_requests",
    "record_key",
    "seq_id_of",
    "slot_wake_prefix",
    "state_key",
    "token",
    "wake_key",
]
