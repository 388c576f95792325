"""Offline batch jobs: a JSONL file of infer requests in object storage, answered into another.

Each input line is an infer request body in Triton's JSON form; each output line, in
the same order, is its infer response in JSON, or ``{"error": ...}`` for a line that
was refused or failed. The job is a Celery task on ``conch.jobs`` (so a worker that dies
running it hands it to another, which starts over); it sends the lines as infer messages
at the lowest priority step of the model's queue, a bounded window at a time, so the
batchers fill only the slots online requests and async jobs leave free, and the queue
never holds more of the dataset than the window. Lines the model can run together go
packed into messages of many rows, ordered by size (``line_packing``).
"""

from __future__ import annotations

import contextvars
import logging
import queue
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson
import redis

from conch.core import inference, validation
from conch.core.ensemble_graph import ENSEMBLE
from conch.core.errors import ConchError, Internal, InvalidArgument, Unavailable
from conch.core.repository import ModelEntry, ModelRepository
from conch.frontend import calls, v2_json
from conch.frontend.ensemble_runner import GraphRunner
from conch.frontend.jobs import line_packing
from conch.frontend.jobs.keepalive import keepalive
from conch.settings import Settings
from conch.wire import broker, job_store, statistics
from conch.wire.job_store import JobCancelled
from conch.wire.messages import REPLY_PREFIX, BadMessage, InferMessage, Reply, WireTensor

log = logging.getLogger(__name__)

TASK_NAME = "conch.batch_job"
WINDOW = 64  # messages in flight per job
WINDOW_LINES = 256  # lines in flight per job (a message carries up to PACK_ROWS rows)
WINDOW_BYTES = 64 * 1024 * 1024  # and at most this much of their data in Redis
LOOKAHEAD = 1024  # lines read ahead and packed by size (line_packing)
PACK_ROWS = 32  # rows a message of packed lines carries at most (and the model's max)
READY_BYTES = 64 * 1024 * 1024  # answers held for earlier lines before they spill to disk
CHUNK = 1024 * 1024
STALL_S = 600.0  # no reply for this long: the model is not being served; give up
PROGRESS_EVERY_S = 0.5

# s3://bucket/key: S3's bucket naming rules; keys without "." or ".." segments, empty
# segments or control characters (a key names one object, never a relative path).
_URI = re.compile(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(.+)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
MAX_KEY_CHARS = 1024


@dataclass(frozen=True)
class ObjectRef:
    bucket: str
    key: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse_uri(uri: Any, what: str) -> ObjectRef:
    """``s3://bucket/key``, checked; anything else is the client's error."""
    if not isinstance(uri, str):
        raise InvalidArgument(f"'{what}' must be an s3://bucket/key string")
    m = _URI.fullmatch(uri)
    if m is None:
        raise InvalidArgument(f"'{what}' {uri!r} is not an s3://bucket/key URI")
    bucket, key = m.groups()
    segments = key.split("/")
    if (
        len(key) > MAX_KEY_CHARS
        or _CONTROL.search(key)
        or any(s in ("", ".", "..") for s in segments)
    ):
        raise InvalidArgument(
            f"'{what}' key {key!r} is refused: no empty, '.' or '..' segments, control "
            f"characters or backslashes, at most {MAX_KEY_CHARS} characters"
        )
    return ObjectRef(bucket, key)


def s3_client(region: str | None) -> Any:
    """boto3's S3 client in ``region`` (``Settings.s3_region``); boto3 reads the other AWS
    settings itself (AWS_ENDPOINT_URL for MinIO & co)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        region_name=region,
        config=Config(retries={"mode": "standard", "max_attempts": 5}),
    )


def submit(
    client: redis.Redis, entry: ModelEntry, version: str, source: Any, target: Any, ttl_s: int
) -> job_store.JobRecord:
    """Record a batch job reading ``source`` and writing ``target`` (s3:// URIs, checked
    here) and queue its task (gateway side); every 4xx is raised here."""
    source, target = parse_uri(source, "input"), parse_uri(target, "output")
    if source == target:
        raise InvalidArgument("'output' must not be the 'input' object")
    record = job_store.JobRecord(
        id=broker.new_id(),
        model=entry.name,
        version=version,
        submitted=time.time(),
        detail={"input": str(source), "output": str(target)},
        kind=job_store.BATCH,
    )
    message = broker.envelope(
        {"id": record.id},
        task_id=record.id,
        queue=broker.JOBS_QUEUE,
        priority=0,
        reply_to=None,
        task=TASK_NAME,
    )
    pipe = client.pipeline(transaction=True)
    record.save(pipe, ttl_s)
    pipe.lpush(broker.JOBS_QUEUE, message)
    statistics.count_model(
        pipe, entry.name, statistics.job_field(job_store.BATCH, statistics.JOB_SUBMITTED)
    )
    pipe.execute()
    return record


# -- the worker side ------------------------------------------------------------------


class _InOrder:
    """Answers written to ``out`` in line order. One that comes before an earlier line's
    waits in memory, or past ``budget`` bytes of them in a spill file, so a block of lines
    reordered by size costs bounded memory whatever a model's answers weigh."""

    def __init__(self, out: BinaryIO, spill: BinaryIO, budget: int = READY_BYTES) -> None:
        self.out, self.spill, self.budget = out, spill, budget
        self.held: dict[int, bytes] = {}
        self.held_bytes = 0
        self.spilled: dict[int, tuple[int, int]] = {}  # line -> offset, length
        self.next = 0  # the next line to write
        self.answered = 0
        self.failed = 0

    def answer(self, line: int, text: bytes, failed: bool) -> None:
        self.answered += 1
        self.failed += failed
        if line != self.next:
            self._hold(line, text)
            return
        self.out.write(text + b"\n")
        self.next += 1
        while True:
            if self.next in self.held:
                text = self.held.pop(self.next)
                self.held_bytes -= len(text)
            elif self.next in self.spilled:
                text = self._unspill(self.next)
            else:
                return
            self.out.write(text + b"\n")
            self.next += 1

    def _hold(self, line: int, text: bytes) -> None:
        if self.held_bytes + len(text) <= self.budget:
            self.held[line] = text
            self.held_bytes += len(text)
            return
        self.spill.seek(0, 2)
        self.spilled[line] = (self.spill.tell(), len(text))
        self.spill.write(text)

    def _unspill(self, line: int) -> bytes:
        offset, length = self.spilled.pop(line)
        self.spill.seek(offset)
        text = self.spill.read(length)
        if not self.spilled:  # nothing left in it: start it over
            self.spill.seek(0)
            self.spill.truncate()
        return text


@dataclass
class _Flight:
    """A message in flight: the lines it carries and their input bytes."""

    lines: list[line_packing.Line]
    size: int


class _Window:
    """The messages in flight, and how much of the job they hold."""

    def __init__(self) -> None:
        self.sent: dict[str, _Flight] = {}  # message id -> its lines
        self.lines = 0
        self.bytes = 0
        self.replies = 0  # messages answered so far

    def add(self, msg_id: str, flight: _Flight) -> None:
        self.sent[msg_id] = flight
        self.lines += len(flight.lines)
        self.bytes += flight.size

    def pop(self, msg_id: str) -> _Flight | None:
        flight = self.sent.pop(msg_id, None)
        if flight is not None:
            self.replies += 1
            self.lines -= len(flight.lines)
            self.bytes -= flight.size
        return flight

    def full(self) -> bool:
        return len(self.sent) >= WINDOW or self.lines >= WINDOW_LINES or self.bytes > WINDOW_BYTES


def _decode_line(line: bytes, limit: int) -> inference.InferRequest:
    """One line's request document (JSON only: a line has no binary tensor extension)."""
    if len(line) > limit:  # split_lines bounds a line only to the chunk it ends in
        raise InvalidArgument(
            f"request body of {len(line)} bytes exceeds the maximum of {limit} bytes"
        )
    return v2_json.decode_request(line)


def _error_line(request_id: str, message: str) -> bytes:
    doc = {"id": request_id, "error": message} if request_id else {"error": message}
    return orjson.dumps(doc)


def _answer_line(entry: ModelEntry, req: inference.InferRequest, reply: Reply) -> bytes:
    if reply.error is not None:
        return _error_line(req.id, reply.error.message)
    # JSONL holds JSON: every output as JSON data, whatever binary_data said.
    labels = entry.labels() if any(o.class_count for o in (req.outputs or ())) else None
    batched = entry.config.max_batch_size > 0

    def entries(outputs: list[WireTensor]) -> list[dict[str, Any]]:
        tensors = [inference.OutputTensor(n, dt, tuple(s), raw) for n, dt, s, raw in outputs]
        asked = req if reply.responses is None else req.narrowed(t.name for t in tensors)
        return v2_json.json_outputs(
            tensors, asked, model_name=entry.name, labels=labels, batched=batched
        )

    if reply.responses is not None:  # a decoupled model's: every response, in order
        return v2_json.responses_document(
            entry.name, str(reply.version), req.id, [entries(r) for r in reply.responses]
        )
    return v2_json.response_document(
        entry.name, str(reply.version), req.id, entries(reply.outputs or [])
    )


def _answer(
    entry: ModelEntry,
    pack: list[line_packing.Line],
    reply: Reply,
    done: _InOrder,
    send: Callable[[list[line_packing.Line]], None],
) -> None:
    """Answer each line a reply was for. A pack that failed is sent again a line at a
    time, so only the line that fails a model fails (as if the lines had gone alone)."""
    if len(pack) == 1:
        (ln,) = pack
        done.answer(ln.number, _answer_line(entry, ln.request, reply), reply.error is not None)
        return
    if reply.error is not None:
        for ln in pack:
            send([ln])
        return
    try:
        parts = line_packing.split(reply.outputs or (), pack)
    except ConchError as exc:
        for ln in pack:
            done.answer(ln.number, _error_line(ln.request.id, exc.message), True)
        return
    for ln, outputs in zip(pack, parts, strict=True):
        own = Reply(reply.id, outputs=outputs, version=reply.version)
        done.answer(ln.number, _answer_line(entry, ln.request, own), False)


def new_reply_key(job_id: str) -> str:
    """Where one attempt at a job collects its replies: a new list per attempt, so the
    late replies of an attempt that died are never taken for this one's."""
    return f"{REPLY_PREFIX}batch.{job_id}.{uuid.uuid4().hex[:8]}"


def run_task(
    settings: Settings,
    client: redis.Redis,
    repository: ModelRepository,
    payload: dict[str, Any],
    graph: GraphRunner | None = None,
) -> dict[str, Any]:
    """The body of the ``conch.batch_job`` Celery task, in the worker that took the task.

    ``repository`` is that worker's own (``control_bus.open_repository``, explicit-mode
    overrides included), so a job on a model loaded with a config or ``file:`` override
    reads the model the gateway accepted it for. A cancelled job is recorded REVOKED and
    ``JobCancelled`` raised; the task then tells Celery to leave that state alone.
    ``graph`` runs the lines of a job on an ensemble.
    """
    job_id = job_store.check_id(str(payload.get("id", "")))
    reply_key = new_reply_key(job_id)
    period = min(1.0, settings.visibility_timeout_s / 3)
    state = statistics.JOB_FAILED
    with keepalive(client, job_id, period, reply_key):
        try:
            summary = run(
                client,
                job_id,
                repository.read_model,
                s3=s3_client(settings.s3_region),
                max_line_bytes=settings.max_input_bytes,
                reply_key=reply_key,
                graph=graph,
            )
            state = statistics.JOB_SUCCEEDED
            return summary
        except JobCancelled:
            job_store.revoke(client, job_id, settings.job_ttl_s)
            state = statistics.JOB_CANCELLED
            raise
        finally:
            _count_end(client, job_id, state)


def _count_end(client: redis.Redis, job_id: str, state: str) -> None:
    """The job ended in ``state``: counted under its model (``conch_jobs_total``)."""
    record = job_store.JobRecord.load(client, job_id)
    if record is None:
        return  # expired: no model to count it under
    try:
        pipe = client.pipeline(transaction=False)
        statistics.count_model(pipe, record.model, statistics.job_field(job_store.BATCH, state))
        pipe.execute()
    except redis.RedisError as exc:  # a metric: the job's own outcome stands
        log.warning("batch job %s: its end was not counted: %s", job_id, exc)


def run(
    client: redis.Redis,
    job_id: str,
    entry_of: Callable[[str], ModelEntry],
    *,
    s3: Any,
    max_line_bytes: int = 64 * 1024 * 1024,
    reply_key: str = "",
    graph: GraphRunner | None = None,
) -> dict[str, Any]:
    """Run one batch job to the end; its summary is the Celery task's result.

    Its lines' replies come to ``reply_key`` (``new_reply_key``), which the caller keeps
    alive while the job runs (workers give reply lists a short TTL). A job on an ensemble
    runs each line's graph through ``graph`` instead.
    """
    record = job_store.JobRecord.load(client, job_id)
    if record is None:
        raise Unavailable(f"batch job {job_id} has no record (expired?)")
    entry = entry_of(record.model)
    if entry.error or entry.config is None:
        raise Unavailable(f"model '{record.model}' is not available: {entry.error}")
    to = calls.target(entry, record.version)
    source = parse_uri(record.detail["input"], "input")
    target = parse_uri(record.detail["output"], "output")
    _check_writable(s3, target)  # before the work, not after it
    if entry.backend == ENSEMBLE:
        if graph is None:
            raise Unavailable(f"model '{entry.name}' is an ensemble: this driver cannot run it")
        lines: _Lines = _Graphs(graph, entry, to.version)
    else:
        lines = _ModelQueue(client, entry.name, reply_key or new_reply_key(job_id), job_id)
    job_store.report_progress(client, job_id, lines=0, failed=0)
    last_report = time.monotonic()
    # A decoupled model's lines go alone: its responses cannot be split among lines.
    max_rows = 0 if to.decoupled else min(entry.config.max_batch_size, PACK_ROWS)
    window = _Window()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as spill, lines:
        done = _InOrder(out, spill)

        def send(pack: list[line_packing.Line]) -> None:
            msg = _message(to, line_packing.stack(pack), lines.reply_key)
            window.add(msg.id, _Flight(pack, sum(ln.size for ln in pack)))
            lines.send(msg)

        def collect(block: float) -> None:
            for reply in lines.replies(block):
                flight = window.pop(reply.id)
                if flight is not None:
                    _answer(entry, flight.lines, reply, done, send)

        def progress(force: bool = False) -> None:
            nonlocal last_report
            if force or time.monotonic() - last_report > PROGRESS_EVERY_S:
                job_store.report_progress(client, job_id, lines=done.answered, failed=done.failed)
                last_report = time.monotonic()

        def send_ahead(ahead: list[line_packing.Line]) -> None:
            for pack in line_packing.plan(ahead, entry.config, max_rows):
                send(pack)
                while window.full():
                    _wait(collect, window, progress, entry.name)
            progress()

        ahead: list[line_packing.Line] = []
        ahead_bytes = 0
        for line_no, line in enumerate(_lines(s3, source, max_line_bytes)):
            req: inference.InferRequest | None = None
            try:
                if line is None:
                    raise InvalidArgument(
                        f"line {line_no + 1} is longer than {max_line_bytes} bytes "
                        "(--http-max-input-size); skipped"
                    )
                req = _decode_line(line, max_line_bytes)
                rows = validation.validate_request(req, entry.config, model_name=entry.name)
            except ConchError as exc:
                done.answer(line_no, _error_line(req.id if req else "", exc.message), True)
                continue
            ahead.append(line_packing.line(line_no, req, rows))
            ahead_bytes += len(line)
            if len(ahead) >= LOOKAHEAD or ahead_bytes > WINDOW_BYTES:
                send_ahead(ahead)
                ahead, ahead_bytes = [], 0
        send_ahead(ahead)
        while window.sent:
            _wait(collect, window, progress, entry.name)
        progress(force=True)
        out.seek(0)
        s3.upload_fileobj(out, target.bucket, target.key)
    return {
        "model_name": entry.name,
        "input": str(source),
        "output": str(target),
        "lines": done.next,
        "failed": done.failed,
    }


class _Lines:
    """Where a job's lines go to be answered, and where their replies come from."""

    reply_key: str | None = None

    def send(self, msg: InferMessage) -> None:
        raise NotImplementedError

    def replies(self, block: float) -> list[Reply]:
        """The replies that came, waiting up to ``block`` seconds for the first."""
        raise NotImplementedError

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _ModelQueue(_Lines):
    """A model's lines: offline messages on its queue (the lowest step), replies on the
    job's list."""

    def __init__(self, client: redis.Redis, model: str, reply_key: str, job_id: str) -> None:
        self.client, self.model, self.reply_key, self.job_id = client, model, reply_key, job_id
        self.publisher = broker.Publisher(client)

    def send(self, msg: InferMessage) -> None:
        self.publisher.publish(
            self.model,
            msg.to_dict(),
            task_id=msg.id,
            priority=msg.priority,
            reply_to=self.reply_key,
        )

    def replies(self, block: float) -> list[Reply]:
        got = self.client.blmpop(block, 1, self.reply_key, direction="LEFT", count=256)
        out = []
        for raw in got[1] if got else ():
            try:
                out.append(Reply.unpack(raw))
            except BadMessage as exc:
                log.warning("batch job %s: unreadable reply: %s", self.job_id, exc)
        return out


class _Graphs(_Lines):
    """An ensemble's lines: each line's graph runs in a thread of its own (at most WINDOW
    at once, as many as the window holds), its steps sent as offline work to their models'
    queues, as the gateway runs an ensemble for a client."""

    def __init__(self, graph: GraphRunner, entry: ModelEntry, version: int) -> None:
        self.graph, self.entry, self.version = graph, entry, version
        self.done: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        self.pool = ThreadPoolExecutor(WINDOW, thread_name_prefix="batch-graph")

    def send(self, msg: InferMessage) -> None:
        # In the driver's context: the line's graph joins the job's trace (its span).
        self.pool.submit(contextvars.copy_context().run, self._run, msg)

    def _run(self, msg: InferMessage) -> None:
        try:
            reply = self.graph.reply(self.entry, msg, self.version, calls.Lane.OFFLINE)
        except Exception as exc:  # a broker error: this line fails, the job goes on
            reply = Reply(msg.id, error=Internal(f"the line's graph failed: {exc}"))
        self.done.put(reply)

    def replies(self, block: float) -> list[Reply]:
        try:
            out = [self.done.get(timeout=block)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self.done.get_nowait())
            except queue.Empty:
                return out

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _wait(
    collect: Callable[[float], None], window: _Window, progress: Callable, model: str
) -> None:
    """Collect replies until one arrives, giving up after STALL_S without any."""
    waited_since = time.monotonic()
    before = window.replies
    while window.replies == before:
        if time.monotonic() - waited_since > STALL_S:
            raise Unavailable(
                f"no reply from model '{model}' for {STALL_S:.0f} s: is a worker serving it?"
            )
        collect(1.0)
        progress()


def _message(to: calls.Target, req: inference.InferRequest, reply_key: str | None) -> InferMessage:
    """A line's message: offline work, below online requests and async jobs; a decoupled
    model's answers once, with every response (``InferMessage.collect``)."""
    msg = calls.build(to, req, lane=calls.Lane.OFFLINE, reply_to=reply_key).msg
    msg.collect = to.decoupled
    return msg


def _check_writable(s3: Any, target: ObjectRef) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        s3.head_bucket(Bucket=target.bucket)
    except (BotoCoreError, ClientError) as exc:
        raise InvalidArgument(f"cannot write {target}: {exc}") from None


def _lines(s3: Any, source: ObjectRef, limit: int) -> Iterator[bytes | None]:
    """The input object's non-blank lines, streamed; None for one longer than ``limit``."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        body = s3.get_object(Bucket=source.bucket, Key=source.key)["Body"]
    except (BotoCoreError, ClientError) as exc:
        raise InvalidArgument(f"cannot read {source}: {exc}") from None
    yield from split_lines(body.iter_chunks(CHUNK), limit)


def split_lines(chunks: Iterable[bytes], limit: int) -> Iterator[bytes | None]:
    """Non-blank lines of a byte stream, never holding more than ``limit`` bytes of one:
    a longer line is skipped to its end and given as None (botocore's iter_lines would
    hold all of it)."""
    buf = b""
    too_long = False
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if too_long:
                too_long = False
                yield None
            elif line.strip():
                yield line
        if len(buf) > limit:
            buf, too_long = b"", True
    if too_long:
        yield None
    elif buf.strip():
        yield buf
