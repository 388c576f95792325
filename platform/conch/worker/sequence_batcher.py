"""The sequence batcher: one loop per instance of a model with ``sequence_batching``.

It holds up to ``capacity`` sequences at once (Triton's Direct strategy: a slot per batch
row, ``max_batch_size`` of them; Oldest: ``max_candidate_sequences``), claimed from the
model's claim list (``conch.wire.sequences``). Each step it reads the request at the head of
every sequence it holds, runs them as one batch (different sequences batch together, one
request per sequence, so each sequence runs in order), feeds each row its control inputs
(START, END, READY, CORRID) and its implicit state, and commits: the reply, the new state
and the removal of the request from its mailbox go in one script that first checks this
slot still holds the sequence. Nothing a step did counts until it commits, so a worker that
dies mid-step leaves the request and the state from before it for the next holder.

The holder ends a sequence at END, or once it has been idle ``max_sequence_idle_microseconds``.
On stop (SIGTERM, unload, scale-down) it offers what it holds back on the claim list; a
sweep, run by every batcher of the model, offers back the sequences of a worker whose
heartbeat has expired. A sequence whose state cannot move (the model keeps it itself, or
opts out of keeping it in Redis) fails its next request on a new holder, with the reason,
instead of going on from the wrong state.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from conch.backends import BackendRequest
from conch.core import tensors
from conch.core.errors import ConchError, Internal, InvalidArgument, Unavailable
from conch.core.model_config import output_types
from conch.core.request_scope import RequestTag, about
from conch.core.sequence import (
    READY,
    STATE_IN_REDIS,
    RowControl,
    SequenceKey,
    SequenceSpec,
    control_tensors,
    not_started_error,
)
from conch.wire import outage, sequences, statistics
from conch.wire.broker import WAKE_CAP, decode
from conch.wire.keys import WORKER_PREFIX
from conch.wire.messages import REPLY_TTL_S, BadMessage, InferMessage, Reply
from conch.wire.rate_limits import Stopped
from conch.wire.sequence_state import pack_state, unpack_state
from conch.worker.drain import dead_letter
from conch.worker.loop_parts import LoopParts
from conch.worker.wake_wait import REDIS_TICK_S, WakeWait

log = logging.getLogger(__name__)

SWEEP_S = 1.0  # how often a batcher looks for sequences held by workers that died
MAX_WAIT_S = 1.0  # the longest an idle batcher blocks before it looks again
SWEEP_BATCH = 1000  # live sequences one sweep reads

# KEYS: claims, then per claimed token nothing (built here). ARGV: n, me, worker id,
# record prefix. Returns [token, state-or-false, steps, ...] for the sequences claimed.
_CLAIM_LUA = """
local out = {}
local n = tonumber(ARGV[1])
while n > 0 do
  local tok = redis.call('LPOP', KEYS[1])
  if not tok then break end
  local rec = ARGV[4] .. tok
  if redis.call('EXISTS', rec) == 1 and redis.call('HGET', rec, 'owner') == '' then
    redis.call('HSET', rec, 'owner', ARGV[2], 'worker', ARGV[3], 'offered', '0')
    out[#out + 1] = tok
    out[#out + 1] = redis.call('GET', rec .. '/state')
    out[#out + 1] = tonumber(redis.call('HGET', rec, 'steps') or '0')
    n = n - 1
  end
end
return out
"""

# KEYS: record, mail, state, live, reply list. ARGV: me, token, reply ('' for none),
# end (0/1), state blob ('' for none), ttl, reply list ttl.
# 0: this slot no longer holds the sequence (nothing done); 1: committed; 2: ended;
# 3: ended, and a request for a new sequence of the same id already waits behind it
# (a client that reuses the id at once): the slot keeps the id and runs it next.
_COMMIT_LUA = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('LPOP', KEYS[2])
redis.call('HDEL', KEYS[1], 'running')
if ARGV[3] ~= '' then
  redis.call('RPUSH', KEYS[5], ARGV[3])
  redis.call('EXPIRE', KEYS[5], ARGV[7])
end
if ARGV[4] == '1' then
  redis.call('DEL', KEYS[3])
  if redis.call('LLEN', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1], KEYS[2])
    redis.call('ZREM', KEYS[4], ARGV[2])
    return 2
  end
  redis.call('HSET', KEYS[1], 'steps', 0)
  return 3
end
redis.call('HINCRBY', KEYS[1], 'steps', 1)
if ARGV[5] ~= '' then redis.call('SET', KEYS[3], ARGV[5], 'EX', ARGV[6]) end
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[6])
return 1
"""

# KEYS: record, mail, state, live. ARGV: me, token, now, idle seconds.
# 1: ended for idleness; 0: not idle (a request came) or not ours.
_EXPIRE_LUA = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 1 end
if redis.call('LLEN', KEYS[2]) > 0 then return 0 end
local last = tonumber(redis.call('HGET', KEYS[1], 'last') or '0')
if tonumber(ARGV[3]) - last < tonumber(ARGV[4]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
"""

# KEYS: record. ARGV: me. The sequence's head runs now (sequences.pending_requests), if
# this slot still holds it: a record gone or moved on is left as it is.
_RUNNING_LUA = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'running', '1')
end
"""

# KEYS: record, claims, model wake. ARGV: holder to replace ('' = any), token, wake cap.
# Offers the sequence to any slot (a release, or a sweep of a dead holder).
_OFFER_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local owner = redis.call('HGET', KEYS[1], 'owner')
if ARGV[1] ~= '' and owner ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', '', 'offered', '1', 'moved', '1')
redis.call('HDEL', KEYS[1], 'running')
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('LPUSH', KEYS[3], '1')
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[3]) - 1)
return 1
"""


@dataclass
class Held:
    """A sequence this slot holds."""

    token: str
    seq_id: int | str
    slot: int = 0  # Direct: the batch row it owns
    state: dict[str, np.ndarray] | None = None  # after the last committed step
    lost: str = ""  # why its state could not follow it here ("" when it did)
    ended: bool = False  # its END ran with more requests queued: only a START goes on


@dataclass
class _Row:
    held: Held
    raw: bytes
    msg: InferMessage
    request: BackendRequest | None = None
    reply: Reply | None = None
    state: dict[str, np.ndarray] = field(default_factory=dict)


class SequenceBatcher(threading.Thread):
    """Runs one instance slot of a sequence model (see the module docstring)."""

    def __init__(
        self,
        parts: LoopParts,
        *,
        spec: SequenceSpec,
        max_batch_size: int,
        worker_id: str,
        slot: str,
        initial_state: dict[str, np.ndarray],
        state_moves: bool,
    ) -> None:
        super().__init__(name=parts.name, daemon=True)
        self.client = client = parts.client
        self.model = parts.model
        self.backends = parts.backends
        self.spec = spec
        self.max_rows = max(1, max_batch_size)
        self.capacity = spec.slots
        self.worker_id = worker_id
        self.me = f"{worker_id}/{slot}"
        # A queue delay's waits for more heads (CLIENT LIST names no spaces).
        self._short = WakeWait(client, f"conch-wait:{self.model}:{self.me}".replace(" ", "_"))
        self.initial_state = initial_state
        self.state_moves = state_moves and bool(spec.states)
        self.on_batch = parts.on_batch
        self.output_types = (
            output_types(next(iter(self.backends.values())).spec.config) if self.backends else {}
        )
        self.state_outputs = {s.output_name: s.input_name for s in spec.states}
        self._ready = spec.control(READY) is not None
        self.held: dict[str, Held] = {}
        # Each step's executions run inside it: the rate limiter's resources held
        # (worker.rate_limiter). ``stopping`` is shared with it, so that a stopping
        # loop's wait for resources ends.
        self.gate = parts.gate
        self.stopping = parts.stopping
        self._claim = client.register_script(_CLAIM_LUA)
        self._commit = client.register_script(_COMMIT_LUA)
        self._expire = client.register_script(_EXPIRE_LUA)
        self._offer = client.register_script(_OFFER_LUA)
        self._running = client.register_script(_RUNNING_LUA)
        self._next_sweep = 0.0
        self._ttl = max(60, int(spec.idle_s * 4) + 1)

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        away = False
        while not self.stopping.is_set():
            try:
                self._once()
                away = False
            except redis.RedisError as exc:
                if not away:
                    log.warning("%s: Redis error (%s); retrying", self.name, exc)
                away = outage.is_outage(exc)
                time.sleep(outage.RECONNECT_S)
            except Exception:
                log.exception("%s: unexpected error in the sequence loop", self.name)
                time.sleep(0.1)
        try:
            self.release_all()
        except redis.RedisError as exc:
            log.warning("%s: could not hand its sequences over (%s)", self.name, exc)

    def stop(self) -> None:
        self.stopping.set()

    def _once(self) -> None:
        now = time.time()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            self.sweep()
        if len(self.held) < self.capacity:
            self.claim(self.capacity - len(self.held))
        rows = self._heads()
        if not rows:
            self._expire_idle(time.time())
            self._wait()
            return
        deadline = min(r.msg.enqueued for r in rows) + self.spec.max_queue_delay_s
        # The strategy's queue delay: let more heads come, read again when one may have.
        while not self._enough(len(rows)) and self._short.wait(
            self._wake_keys(), deadline - time.time()
        ):
            if len(self.held) < self.capacity:
                self.claim(self.capacity - len(self.held))
            rows = self._heads()
        if self.spec.strategy == "oldest":
            rows.sort(key=lambda r: r.msg.enqueued)
        self.execute(rows[: self.max_rows])

    def _enough(self, ready: int) -> bool:
        """Whether ``ready`` requests make a batch without waiting out the queue delay:
        Oldest, a full or preferred batch; Direct, ``minimum_slot_utilization`` of the
        slots (any request when it is 0, Triton's default)."""
        if self.spec.strategy == "oldest":
            return ready >= self.max_rows or ready in self.spec.preferred_batch_size
        return ready >= self.spec.minimum_slot_utilization * self.capacity

    # -- claiming and letting go --------------------------------------------------------
    def claim(self, n: int) -> None:
        got = self._claim(
            keys=[sequences.claims_key(self.model)],
            args=[n, self.me, self.worker_id, sequences.record_key(self.model, "")],
        )
        for i in range(0, len(got), 3):
            tok = _s(got[i])
            blob, steps = got[i + 1], int(got[i + 2])
            used = {h.slot for h in self.held.values()}
            held = Held(
                tok,
                sequences.seq_id_of(tok),
                next(i for i in range(self.capacity + 1) if i not in used),
            )
            if steps > 0:  # it ran elsewhere before: its state must follow it here
                if not self.state_moves:
                    held.lost = (
                        "the model keeps this state itself"
                        if not self.spec.states
                        else f"the model keeps its state out of Redis ({STATE_IN_REDIS} false)"
                    )
                elif not blob:
                    held.lost = "its saved state expired"
                else:
                    try:
                        held.state = unpack_state(blob)
                    except (BadMessage, ValueError) as exc:
                        held.lost = f"its saved state is unreadable ({exc})"
            self.held[tok] = held
            log.info("%s: holds sequence %r of model '%s'", self.name, held.seq_id, self.model)

    def release_all(self) -> None:
        """Offer every sequence held back to the other slots (a stop or an unload)."""
        for tok in list(self.held):
            self._offer_back(tok, self.me)
            del self.held[tok]

    def _offer_back(self, tok: str, holder: str) -> bool:
        return bool(
            self._offer(
                keys=[
                    sequences.record_key(self.model, tok),
                    sequences.claims_key(self.model),
                    sequences.wake_key(self.model),
                ],
                args=[holder, tok, WAKE_CAP],
            )
        )

    def release_own(self) -> None:
        """Offer back the sequences this slot's name still holds from an earlier life: a
        process instance that died and was started again under the same name. Its
        worker lives on, so no sweep would ever see them as a dead worker's."""
        live = self.client.zrange(sequences.live_key(self.model), 0, SWEEP_BATCH - 1)
        toks = [_s(t) for t in live]
        pipe = self.client.pipeline(transaction=False)
        for tok in toks:
            pipe.hget(sequences.record_key(self.model, tok), "owner")
        for tok, owner in zip(toks, pipe.execute() if toks else [], strict=True):
            if owner is not None and _s(owner) == self.me and self._offer_back(tok, self.me):
                log.warning(
                    "model '%s': sequence %r was held by %s before it restarted; offered again",
                    self.model,
                    sequences.seq_id_of(tok),
                    self.name,
                )

    def sweep(self) -> None:
        """Offer back the sequences held by workers whose heartbeat expired."""
        live = self.client.zrange(sequences.live_key(self.model), 0, SWEEP_BATCH - 1)
        if not live:
            return
        toks = [_s(t) for t in live]
        pipe = self.client.pipeline(transaction=False)
        for tok in toks:
            pipe.hmget(sequences.record_key(self.model, tok), "owner", "worker")
        holders = pipe.execute()
        gone = [t for t, (owner, _) in zip(toks, holders, strict=True) if owner is None]
        if gone:  # records that expired unseen: nothing holds or waits for them
            self.client.zrem(sequences.live_key(self.model), *gone)
        workers = {_s(w) for owner, w in holders if owner and w and _s(w) != self.worker_id}
        if not workers:
            return
        order = sorted(workers)
        pipe = self.client.pipeline(transaction=False)
        for w in order:
            pipe.exists(WORKER_PREFIX + w)
        alive = {w: bool(n) for w, n in zip(order, pipe.execute(), strict=True)}
        for tok, (owner, w) in zip(toks, holders, strict=True):
            dead = owner and w and _s(w) in alive and not alive[_s(w)]
            if dead and self._offer_back(tok, _s(owner)):
                log.warning(
                    "model '%s': sequence %r was held by worker %s, which is gone; "
                    "offered to the other workers",
                    self.model,
                    sequences.seq_id_of(tok),
                    _s(w),
                )

    def _expire_idle(self, now: float) -> None:
        for tok in list(self.held):
            ended = self._expire(
                keys=[
                    sequences.record_key(self.model, tok),
                    sequences.mail_key(self.model, tok),
                    sequences.state_key(self.model, tok),
                    sequences.live_key(self.model),
                ],
                args=[self.me, tok, repr(now), self.spec.idle_s],
            )
            if ended:
                del self.held[tok]

    def _wake_keys(self) -> list[str]:
        """The wake lists a new head may come by: this slot's (a held sequence's), and
        while it has room the model's (a sequence offered to any slot)."""
        keys = [sequences.wake_key(self.model, self.me)]
        if len(self.held) < self.capacity:
            keys.append(sequences.wake_key(self.model))
        return keys

    def _wait(self) -> None:
        block = MAX_WAIT_S
        if self.held:
            block = min(block, max(self.spec.idle_s / 2, 2 * REDIS_TICK_S + 0.05))
        pipe = self.client.pipeline(transaction=False)
        for command in self._short.unblock():  # a delay's wait left pending: end it first
            pipe.execute_command(*command)
        pipe.blpop(self._wake_keys(), timeout=round(block, 3))
        pipe.execute()

    # -- one step -----------------------------------------------------------------------
    def _heads(self) -> list[_Row]:
        if not self.held:
            return []
        toks = list(self.held)
        pipe = self.client.pipeline(transaction=False)
        ended = self._short.unblock()  # a delay's wait left pending: end it with these
        for command in ended:
            pipe.execute_command(*command)
        for tok in toks:
            pipe.lindex(sequences.mail_key(self.model, tok), 0)
        rows = []
        for tok, raw in zip(toks, pipe.execute()[len(ended) :], strict=True):
            if raw is None:
                continue
            try:
                payload = decode(raw).payload
                msg = InferMessage.from_dict(payload)
            except BadMessage as exc:
                self._drop_bad(tok, raw, str(exc))
                continue
            rows.append(_Row(self.held[tok], raw, msg))
        return rows

    def _drop_bad(self, tok: str, raw: bytes, why: str) -> None:
        log.warning("model '%s': dropping an unreadable sequence message: %s", self.model, why)
        pipe = self.client.pipeline(transaction=True)
        pipe.lpop(sequences.mail_key(self.model, tok))
        dead_letter(pipe, f"sequence:{self.model}/{tok}", raw, why)
        pipe.execute()

    def execute(self, rows: list[_Row]) -> None:
        """Run ``rows``; every line logged meanwhile names their requests."""
        with about(*(RequestTag(r.msg.client_id, r.msg.id) for r in rows)):
            log.debug("model '%s': executing %d sequence request(s)", self.model, len(rows))
            self._execute(rows)

    def _execute(self, rows: list[_Row]) -> None:
        started = time.time()
        runnable = [r for r in rows if self._prepare(r)]
        self._mark_running(runnable)
        by_version: dict[int, list[_Row]] = {}
        for r in runnable:
            by_version.setdefault(self._version(r.msg), []).append(r)
        runs = []
        try:
            with self.gate() if self.gate is not None else nullcontext():
                for version, group in by_version.items():
                    if self._rows_by_slot:
                        group = self._by_slot(group)
                    runs.append(self._run(version, group, started))
        except Stopped:
            # The loop stopped while the step waited for its rate-limit resources: it
            # never ran and nothing is committed, so its requests and states stay for
            # the sequences' next holder (``release_all`` offers them back).
            return
        self._commit_all(rows, runs)

    def _mark_running(self, rows: list[_Row]) -> None:
        """Each row's head runs now, so it no longer counts as pending
        (``sequences.pending_requests``); its commit, or an offer, clears the mark."""
        if not rows:
            return
        pipe = self.client.pipeline(transaction=False)
        for r in rows:
            record = sequences.record_key(self.model, r.held.token)
            self._running(keys=[record], args=[self.me], client=pipe)
        pipe.execute()

    @property
    def _rows_by_slot(self) -> bool:
        """Direct's batches are its slots, row for row, when the model can tell a slot
        with no request apart (it takes READY): rows of sequences with nothing ready, and
        free slots below the highest held one, are sent with READY false, as Triton does."""
        return self.spec.strategy == "direct" and self.spec.batched and self._ready

    def _by_slot(self, group: list[_Row]) -> list[_Row | None]:
        by_slot: dict[int, _Row] = {r.held.slot: r for r in group}
        top = max(h.slot for h in self.held.values())
        return [by_slot.get(i) for i in range(top + 1)]

    def _version(self, msg: InferMessage) -> int:
        return max(self.backends) if msg.version <= 0 else msg.version

    def _prepare(self, r: _Row) -> bool:
        """The row's backend request, or its reply when it cannot run."""
        msg, held = r.msg, r.held
        seq = msg.sequence
        if seq is None:
            r.reply = Reply(
                msg.id, error=InvalidArgument("a sequence model's request lacks its id")
            )
            return False
        _, start, end = seq
        if held.lost and not start:
            r.reply = Reply(
                msg.id,
                error=Unavailable(
                    f"sequence {held.seq_id!r} of model '{self.model}' lost its state when the "
                    f"worker holding it stopped ({held.lost}): start the sequence again"
                ),
            )
            r.state = {}
            return False
        if held.ended and not start:
            r.reply = Reply(msg.id, error=not_started_error(self.model, SequenceKey(held.seq_id)))
            return False
        if start:
            held.lost, held.ended = "", False
        if self._version(msg) not in self.backends:
            r.reply = Reply(
                msg.id,
                error=Unavailable(f"model '{self.model}' version {msg.version} is not loaded"),
            )
            return False
        try:
            inputs = {n: tensors.to_numpy(dt, shape, raw) for n, dt, shape, raw in msg.inputs}
        except ConchError as exc:
            r.reply = Reply(msg.id, error=exc)
            return False
        except Exception as exc:
            r.reply = Reply(msg.id, error=InvalidArgument(f"bad input tensor: {exc}"))
            return False
        inputs.update(control_tensors(self.spec, [RowControl(start, end, True, held.seq_id)]))
        state = self.initial_state if start or held.state is None else held.state
        inputs.update(state)
        outputs = list(msg.outputs) + [o for o in self.state_outputs if o not in msg.outputs]
        params = {
            **msg.params,
            "sequence_id": held.seq_id,
            "sequence_start": start,
            "sequence_end": end,
        }
        r.request = BackendRequest(
            inputs,
            outputs,
            msg.client_id,
            params,
            msg.timeout_us,
            msg.deadline,
            tuple(msg.chain),
            msg.priority,
        )
        return True

    def _null_request(self, like: BackendRequest) -> BackendRequest:
        """A slot with no request: zeros shaped like a real row, READY false."""
        inputs = {n: np.zeros_like(a) for n, a in like.inputs.items()}
        inputs.update(control_tensors(self.spec, [RowControl(ready=False)]))
        inputs.update(self.initial_state)
        return BackendRequest(inputs, list(like.outputs), "", {}, 0, 0.0, (), 0)

    def _run(self, version: int, slots: list[_Row | None], started: float) -> statistics.Execution:
        backend = self.backends[version]
        rows = [r for r in slots if r is not None]
        like = rows[0].request
        assert like is not None
        requests = [
            r.request if r is not None and r.request is not None else self._null_request(like)
            for r in slots
        ]
        t0 = time.perf_counter_ns()
        try:
            every = backend.execute(requests)
            results = [res for r, res in zip(slots, every, strict=True) if r is not None]
        except ConchError as exc:
            results = [exc] * len(rows)
        except Exception as exc:
            log.exception("%s: backend failed", self.name)
            results = [Internal(f"model '{self.model}' failed to execute: {exc}")] * len(rows)
        compute_ns = time.perf_counter_ns() - t0
        run = statistics.Execution(version, batch_size=len(slots))
        run.infer_ns = compute_ns
        now = time.time()
        for r, result in zip(rows, results, strict=True):
            took = max(0, int((now - r.msg.enqueued) * 1e9))
            timing = {"queue": int((started - r.msg.enqueued) * 1e9), "compute": compute_ns}
            if isinstance(result, ConchError):
                r.reply = Reply(r.msg.id, error=result, timing=timing)
                run.failed(statistics.BACKEND, took)
                continue
            try:
                outputs = tensors.named_outputs(result, r.msg.outputs, self.output_types)
                r.state = {self.state_outputs[o]: np.asarray(result[o]) for o in self.state_outputs}
            except Exception as exc:
                r.reply = Reply(
                    r.msg.id, error=Internal(f"model '{self.model}' returned a bad output: {exc}")
                )
                run.failed(statistics.BACKEND, took)
                continue
            r.reply = Reply(r.msg.id, outputs=outputs, timing=timing, batch_size=len(rows))
            run.success += 1
            run.rows += 1
            run.success_ns += took
            run.queue_ns += timing["queue"]
        return run

    def _commit_all(self, rows: list[_Row], runs: list[statistics.Execution]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for r in rows:
            assert r.reply is not None
            msg, tok = r.msg, r.held.token
            end = bool(msg.sequence and msg.sequence[2]) or (
                r.reply.error is not None and (r.held.lost != "" or r.held.ended)
            )
            if r.reply.error is None and r.state:
                r.held.state = r.state
            blob = pack_state(r.held.state) if self.state_moves and r.held.state else b""
            self._commit(
                keys=[
                    sequences.record_key(self.model, tok),
                    sequences.mail_key(self.model, tok),
                    sequences.state_key(self.model, tok),
                    sequences.live_key(self.model),
                    msg.reply_to or sequences.record_key(self.model, tok) + "/noreply",
                ],
                args=[
                    self.me,
                    tok,
                    r.reply.pack() if msg.reply_to else b"",
                    int(end),
                    blob,
                    self._ttl,
                    REPLY_TTL_S,
                ],
                client=pipe,
            )
        now_ms = int(time.time() * 1000)
        for run in runs:
            statistics.record(pipe, self.model, run, now_ms)
        results = pipe.execute()
        for r, done in zip(rows, results, strict=False):
            if done == 2 or done == 0:  # ended, or another slot holds it now
                self.held.pop(r.held.token, None)
            elif done == 3:  # ended; the id's next requests are queued here
                r.held.state, r.held.lost, r.held.ended = None, "", True
        if self.on_batch is not None:
            failed = sum(1 for r in rows if r.reply is not None and r.reply.error is not None)
            replies = [r.reply for r in rows if r.reply is not None]
            self.on_batch(
                self.model,
                {
                    "executions": len(runs),
                    "requests": len(rows),
                    "rows": len(rows),
                    "success": len(rows) - failed,
                    "failure": failed,
                    "queue_us": sum(r.timing.get("queue", 0) for r in replies) // 1000,
                    "compute_us": sum(r.timing.get("compute", 0) for r in replies) // 1000,
                },
            )


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


__all__ = ["SequenceBatcher"]
