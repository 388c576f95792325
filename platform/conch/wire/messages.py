"""The messages that cross the broker: one inference request, one reply.

They are msgpack maps whose tensors are Triton's binary bytes plus datatype and shape,
so nothing is re-encoded between the HTTP body, Redis and the backend. Broker data is
treated as untrusted: never pickled, every field type-checked, every size bounded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from conch.core.datatypes import WIRE_TYPES
from conch.core.errors import ConchError, InvalidArgument, from_code
from conch.core.inference import MAX_STREAM_KEEP_S
from conch.core.repository_keys import MAX_SEGMENT_BYTES
from conch.core.tensors import WireTensor
from conch.core.trace_config import TRACEPARENT
from conch.wire.keys import REPLY_PREFIX

# Workers give a reply list this TTL at each push, so the lists of callers that died go
# away; a caller that may read slowly (a batch job) refreshes it while it waits.
REPLY_TTL_S = 60
MAX_RANK = 16
MAX_TENSORS = 1024
# Models a BLS request's chain may name (the models waiting on it); BLS bounds the depth
# of a call chain far lower, this only bounds what a message may carry.
MAX_CHAIN = 256
MAX_MODEL_NAME = MAX_SEGMENT_BYTES  # a model is a folder: its name fits in one
MAX_ATTEMPT = 2**31 - 1  # a reply's run of its request (deliveries are far fewer)
MAX_COLLECTED = 10_000  # the responses a collected decoupled request may answer with


class BadMessage(ValueError):
    """A broker message that is not one of ours; it is dead-lettered, never executed."""


MAX_SEQUENCE_ID = 2**64 - 1
MAX_SEQUENCE_STRING_BYTES = 256


def _sequence(value: Any) -> tuple[int | str, bool, bool] | None:
    """A message's sequence field, checked: [uint64 or short string id, start, end]."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise BadMessage("seq is not [id, start, end]")
    seq_id, start, end = value
    if isinstance(seq_id, bool) or not isinstance(seq_id, int | str):
        raise BadMessage("seq id is not an integer or a string")
    if isinstance(seq_id, int) and not 0 < seq_id <= MAX_SEQUENCE_ID:
        raise BadMessage("seq id is out of range")
    if isinstance(seq_id, str) and not 0 < len(seq_id.encode()) <= MAX_SEQUENCE_STRING_BYTES:
        raise BadMessage("seq id string is empty or too long")
    if not isinstance(start, bool) or not isinstance(end, bool):
        raise BadMessage("seq flags are not booleans")
    return seq_id, start, end


@dataclass
class InferMessage:
    id: str
    model: str
    version: int
    inputs: list[WireTensor]
    outputs: list[str]
    reply_to: str | None
    enqueued: float  # epoch seconds, stamped by the gateway
    deadline: float  # epoch seconds; 0 = none
    priority: int = 0  # the queue's priority sub-list
    params: dict[str, Any] = field(default_factory=dict)
    queue_deadline: float = 0.0  # epoch seconds; past it the queue policy applies
    delay_on_timeout: bool = False  # Triton's DELAY: run it later instead of rejecting
    delayed: bool = False  # already moved behind the requests still in time
    client_id: str = ""  # the "id" the client gave its request
    timeout_us: int = 0  # the client's "timeout" parameter
    # The client's "priority" parameter (Triton's level; 0: the model's default), which
    # an ensemble's steps ask of their own models' queues as Triton's ensembles do.
    priority_level: int = 0
    # BLS: the models whose instances wait on this request (outermost first); empty for a
    # request from a client. See conch.frontend.bls.
    chain: list[str] = field(default_factory=list)
    # An async job (conch.wire.job_store): its result is stored for this many seconds instead of
    # being pushed to a reply list; 0 for a request someone waits on.
    job_ttl: int = 0
    # A sequence model's request (conch.wire.sequences): its correlation id (uint64 or
    # string), and whether it starts and ends the sequence; None for any other model.
    sequence: tuple[int | str, bool, bool] | None = None
    # A decoupled request someone watches (``conch.wire.stream_log``): its lease key says
    # the caller is still there (``is_cancelled`` once it is gone), and with ``keep_s`` its
    # responses are kept in its log that long, for a client that reconnects.
    watched: bool = False
    keep_s: int = 0
    # A decoupled request nobody reads as it streams (an async job, a batch job's line):
    # the worker collects its responses and answers once, with all of them, at the end.
    collect: bool = False
    # the worker's spans join the request's trace (conch.core.tracing).
    traceparent: str = ""

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "model": self.model,
            "version": self.version,
            "inputs": [list(t) for t in self.inputs],
            "outputs": self.outputs,
            "reply_to": self.reply_to,
            "enqueued": self.enqueued,
            "deadline": self.deadline,
            "priority": self.priority,
            "params": self.params,
            "qd": self.queue_deadline,
            "dot": self.delay_on_timeout,
            "delayed": self.delayed,
            "cid": self.client_id,
            "tmo": self.timeout_us,
        }
        if self.chain:  # only BLS requests carry one; a client's message stays as it was
            body["chain"] = list(self.chain)
        if self.job_ttl:
            body["job"] = self.job_ttl
        if self.sequence is not None:
            body["seq"] = list(self.sequence)
        if self.priority_level:
            body["lvl"] = self.priority_level
        if self.traceparent:
            body["tp"] = self.traceparent
        if self.watched:
            body["w"] = True
        if self.keep_s:
            body["keep"] = self.keep_s
        if self.collect:
            body["col"] = True
        return body

    @classmethod
    def from_dict(cls, m: Any) -> InferMessage:
        """A payload read back, every field checked. A worker reads one per request, so
        each field takes the exact type msgpack gives it at the cost of a ``type`` test;
        anything else goes through the full check, which says what is wrong."""
        if not isinstance(m, dict):
            raise BadMessage("message is not a map")
        try:
            ident, model, version = m["id"], m["model"], m["version"]
            raw_inputs, raw_outputs, enqueued = m["inputs"], m["outputs"], m["enqueued"]
        except KeyError as exc:
            raise BadMessage(f"message lacks field {exc}") from None
        get = m.get
        if type(raw_inputs) is not list or len(raw_inputs) > MAX_TENSORS:
            raw_inputs = _list(raw_inputs, MAX_TENSORS)
        inputs = [read_tensor(t) for t in raw_inputs]
        if type(raw_outputs) is not list or len(raw_outputs) > MAX_TENSORS:
            raw_outputs = _list(raw_outputs, MAX_TENSORS)
        outputs = raw_outputs if all(type(o) is str for o in raw_outputs) else _strs(raw_outputs)
        reply_to = get("reply_to")
        params = get("params") or {}
        if not isinstance(params, dict):
            raise BadMessage("params is not a map")
        deadline, priority = get("deadline", 0.0), get("priority", 0)
        cid, timeout_us = get("cid", ""), get("tmo", 0)
        qd, level, job, keep = get("qd", 0.0), get("lvl", 0), get("job", 0), get("keep", 0)
        chain, seq, tp = get("chain"), get("seq"), get("tp", "")
        return cls(
            id=ident if type(ident) is str else _str(ident),
            model=model if type(model) is str else _str(model),
            version=version if type(version) is int else _int(version),
            inputs=inputs,
            outputs=outputs,
            reply_to=None if reply_to is None else _reply_key(reply_to),
            enqueued=enqueued if type(enqueued) is float else _float(enqueued),
            deadline=deadline if type(deadline) is float else _float(deadline),
            priority=priority if type(priority) is int else _int(priority),
            params=params,
            queue_deadline=qd if type(qd) is float else _float(qd),
            delay_on_timeout=bool(get("dot", False)),
            delayed=bool(get("delayed", False)),
            client_id=cid if type(cid) is str else _str(cid),
            timeout_us=timeout_us if type(timeout_us) is int else _int(timeout_us),
            priority_level=level if type(level) is int else _int(level),
            chain=[_model_name(c) for c in _list(chain, MAX_CHAIN)] if chain else [],
            job_ttl=job if type(job) is int else _int(job),
            sequence=None if seq is None else _sequence(seq),
            traceparent=_traceparent(tp) if tp else "",
            watched=get("w", False) is True,
            keep_s=0 if keep == 0 and type(keep) is int else _keep(keep),
            collect=get("col", False) is True,
        )


@dataclass
class Reply:
    """One response to request ``id``. A request gets one (``final``), except on a
    decoupled model, whose requests get any number, in order (``seq`` counts them from
    0), the last one ``final``; that last one may be empty (no outputs: the model only
    said it was done, Triton's empty final response), and an error ends the request
    whatever its flag."""

    id: str
    outputs: list[WireTensor] | None = None
    error: ConchError | None = None
    timing: dict[str, int] = field(default_factory=dict)  # ns: queue, compute
    batch_size: int = 0
    version: int = 0  # the model version that answered
    final: bool = True  # the request's last response
    seq: int = 0  # its place among the request's responses (a decoupled model's)
    # The run of the request that sent it (its delivery: 1 unless a worker died holding
    # it). A later run's replies replace an earlier run's, from seq 0 again.
    attempt: int = 1
    # Set by the reader, never sent: the first reply of a later run, whose caller drops
    # what the earlier run sent (``conch.frontend.producer``).
    restarted: bool = False
    # A collected decoupled request's answer (``InferMessage.collect``): every response's
    # outputs, in order (its empty final response, only a flag, is none); ``outputs`` is
    # then None.
    responses: list[list[WireTensor]] | None = None

    def pack(self, packer: msgpack.Packer | None = None) -> bytes:
        """The reply's msgpack bytes. ``packer`` (``reply_packer``): one a caller packing
        many replies in one thread makes once (``conch.worker.replies``). Tensors go as
        the tuples they are, which msgpack writes as the arrays ``unpack`` reads."""
        body: dict[str, Any] = {
            "id": self.id,
            "t": self.timing,
            "bs": self.batch_size,
            "v": self.version,
        }
        if not self.final:  # the common case (one final reply) carries neither field
            body["fin"] = False
        if self.seq:
            body["seq"] = self.seq
        if self.attempt != 1:
            body["at"] = self.attempt
        if self.error is not None:
            body["err"] = [self.error.code, self.error.status, self.error.message]
        elif self.responses is not None:
            body["rs"] = self.responses
        else:
            body["out"] = self.outputs or ()
        if packer is None:
            return msgpack.packb(body, use_bin_type=True)
        return packer.pack(body)

    @classmethod
    def unpack(cls, data: bytes) -> Reply:
        m = unpack(data)
        if not isinstance(m, dict):
            raise BadMessage("reply is not a map")
        rid = _str(m.get("id"))
        timing = m.get("t") or {}
        seq = _int(m.get("seq", 0))
        if seq < 0:
            raise BadMessage("negative reply seq")
        attempt = _int(m.get("at", 1))
        if not 0 < attempt <= MAX_ATTEMPT:
            raise BadMessage("reply attempt out of range")
        if "err" in m:
            code, status, message = m["err"]
            error = from_code(_str(code), _str(message), _int(status))
            return cls(rid, error=error, timing=timing, seq=seq, attempt=attempt)
        responses = None
        if "rs" in m:
            responses = [
                [read_tensor(t) for t in _list(outputs, MAX_TENSORS)]
                for outputs in _list(m["rs"], MAX_COLLECTED)
            ]
        outputs = (
            None
            if responses is not None
            else [read_tensor(t) for t in _list(m.get("out"), MAX_TENSORS)]
        )
        return cls(
            rid,
            outputs=outputs,
            timing=timing,
            batch_size=_int(m.get("bs", 0)),
            version=_int(m.get("v", 0)),
            final=m.get("fin", True) is not False,
            seq=seq,
            attempt=attempt,
            responses=responses,
        )


def reply_packer() -> msgpack.Packer:
    """A packer for ``Reply.pack``, for one thread's batch of replies (not thread-safe)."""
    return msgpack.Packer(use_bin_type=True)


def unpack(data: bytes) -> Any:
    """Broker bytes as msgpack values, decoded as untrusted (``BadMessage`` if not)."""
    try:
        # strict_map_key keeps keys to str/bytes; no ext hooks: ext types stay inert.
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise BadMessage(f"undecodable msgpack: {exc}") from None


def read_tensor(t: Any) -> WireTensor:
    """A [name, datatype, shape, bytes] list read from Redis, checked."""
    if not isinstance(t, list | tuple) or len(t) != 4:
        raise BadMessage("tensor is not [name, datatype, shape, bytes]")
    name, datatype, shape, raw = t
    if datatype not in WIRE_TYPES:
        raise BadMessage(f"datatype {datatype!r} is not allowed")
    if type(shape) is list and len(shape) <= MAX_RANK:
        for d in shape:  # the common case: every dimension a plain int, none negative
            if type(d) is not int or d < 0:
                shape = _shape(shape)
                break
        else:
            shape = tuple(shape)
    else:
        shape = _shape(shape)
    if not isinstance(raw, bytes):
        raise BadMessage("tensor data is not bytes")
    return WireTensor(name if type(name) is str else _str(name), datatype, shape, raw)


def _shape(v: Any) -> tuple[int, ...]:
    shape = tuple(_int(d) for d in _list(v, MAX_RANK))
    if any(d < 0 for d in shape):
        raise BadMessage("negative dimension")
    return shape


def _model_name(v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > MAX_MODEL_NAME:
        raise BadMessage("chain holds something that is not a model name")
    return v


def _keep(v: Any) -> int:
    keep = _int(v)
    if not 0 <= keep <= MAX_STREAM_KEEP_S:
        raise BadMessage("keep is out of range")
    return keep


def _traceparent(v: Any) -> str:
    if v and not (isinstance(v, str) and TRACEPARENT.fullmatch(v)):
        raise BadMessage("tp is not a W3C traceparent")
    return v or ""


def _reply_key(v: Any) -> str:
    # A worker pushes replies to this key: never let a message point it elsewhere.
    if not isinstance(v, str) or not v.startswith(REPLY_PREFIX) or len(v) > 200:
        raise BadMessage("reply_to is not a conch reply list")
    return v


def _list(v: Any, limit: int) -> list:
    if not isinstance(v, list | tuple) or len(v) > limit:
        raise BadMessage("expected a bounded list")
    return list(v)


def _strs(v: list) -> list[str]:
    return [_str(o) for o in v]


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise BadMessage("expected a string")
    return v


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadMessage("expected an integer")
    return v


def _float(v: Any) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise BadMessage("expected a number")
    return float(v)


__all__ = ["BadMessage", "InferMessage", "InvalidArgument", "Reply", "WireTensor"]
