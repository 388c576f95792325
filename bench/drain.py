#!/usr/bin/env python3
"""conch's own cost per request, one process at a time, with no load generator in the way.

    .venv/bin/python bench/drain.py                  # N = 4096 requests per row
    .venv/bin/python bench/drain.py --quick          # N = 512
    .venv/bin/python bench/drain.py --n 20000 --concurrency 1,16,64 --profile
    .venv/bin/python bench/drain.py --quick --python # the worker rows on the Python backend

Everything runs over one private redis-server on a Unix socket, as ``conch serve`` starts
it. Three kinds of row, measured in the same run:

- **floor**: Redis alone. A list filled with N messages of the worker's size is drained
  by one client that pops ``batch`` of them and pushes as many replies of the reply's
  size in one round trip, with no decoding (conch's own ``RedisLink``).
- **worker**: a model's queue filled in advance with N messages built and published by
  the gateway's own code (``validate_request``, ``calls.build``, ``Publisher.publish``),
  then drained by the real ``Batcher``, with its real ``Drain`` and ``ReplySink``, in
  this process. Its backend (``Echo``) returns its inputs as outputs and computes
  nothing; with ``--python`` the real Python backend runs a ``model.py`` that does the
  same through ``pb_utils``, as a Python model's requests and responses go. Timed from the first pop to the last batch's replies pushed; CPU is this
  process's own (``time.process_time``), whose other threads are idle meanwhile.
- **bundled**: the worker row again, at batch 8 and 64, over a queue of bundles of a
  batch's requests each (``Publisher.publish_bundle``): what a gateway's bundles save a
  worker at best, when every batch comes as one message.
- **gateway**: a real ``conch gateway`` process answering HTTP infer calls (binary
  tensors, keep-alive connections, ``--concurrency`` of them at once) from a cheap
  client in this process, against a stand-in worker (this script with ``--stand-in``:
  pops the queue with the real ``Drain``, pushes each request's input back as its reply
  with the real ``ReplySink``, runs no model). CPU is the gateway's processes' own (from
  /proc); the client's and the stand-in's are not counted.

Batches: 1 is a model without dynamic batching (``max_batch_size`` 64, each request runs
alone as under Triton's default scheduler; a pop still takes several); 8 and 64 are
dynamic batching with that ``max_batch_size`` and no queue delay, over a full queue. Each
request is one FP32 row of 1 KiB or 64 KiB. A gateway row's "batch" is its concurrency,
and it is compared with the floor at batch 1. A floor lasts milliseconds, so that one
descheduling would double it: each is the fastest of ``FLOOR_TRIES`` tries.

- **hops**: the latency floor at concurrency 1 of what every conch request crosses, with
  no conch code: a client, a gateway process (a keep-alive connection, LPUSH, BLPOP), Redis,
  a worker process (BLPOP, LPUSH), Redis again, and back; its p50 is in its note.

Prints the table (µs per request: wall, CPU of the measured process and Redis's CPU; wall
and CPU divided by the floor's) and writes it as JSON (``--json``, by default
``.cache/bench/drain.json``); gateway and stand-in logs go beside it. ``--profile`` runs
the worker at batch 64 once more, untimed, under cProfile, and prints its top functions.
Results and where the time goes: bench/README.md, "bench/drain.py: conch's own cost per
request".
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import pstats
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import redis

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import procs  # noqa: E402

from conch.backends import Backend, BackendRequest  # noqa: E402
from conch.backends.python.backend import PythonBackend  # noqa: E402
from conch.core import validation  # noqa: E402
from conch.core.inference import InferRequest, InputTensor, RequestedOutput  # noqa: E402
from conch.core.model_spec import InstanceSpec  # noqa: E402
from conch.core.repository import ModelEntry, ModelRepository  # noqa: E402
from conch.devtools import redis_server  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402
from conch.frontend import calls  # noqa: E402
from conch.wire import broker, worker_reports  # noqa: E402
from conch.wire.messages import REPLY_PREFIX, InferMessage, Reply  # noqa: E402
from conch.wire.redis_client import open_client  # noqa: E402
from conch.wire.redis_link import Commands, RedisLink  # noqa: E402
from conch.worker.batcher import Batcher, BatchPolicy, InFlight  # noqa: E402
from conch.worker.drain import Drain, ack  # noqa: E402
from conch.worker.loop_parts import QueueParts  # noqa: E402
from conch.worker.replies import ReplySink  # noqa: E402

DEFAULT_JSON = ROOT / ".cache" / "bench" / "drain.json"
BATCHES = (1, 8, 64)
SIZES_KIB = (1, 64)
INPUT, OUTPUT = "INPUT0", "OUTPUT0"
GATEWAY_MODEL = "drain_b64"
REPLY_KEY = f"{REPLY_PREFIX}drain-bench"
FLOOR_KEY = "drain-bench.floor"
QUEUED_TIMEOUT_S = 600.0  # a request filled in advance must not expire in its queue
FLOOR_TRIES = 5  # the floor's measurements at each point, the fastest kept
PUBLISH_THREADS = 8  # publishers at once while filling, so the fill takes little time


def say(msg: str) -> None:
    print(f"[drain {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the models


def model_name(batch: int) -> str:
    return f"drain_b{batch}"


# With --python, the worker rows run this model.py on the real Python backend: each
# request's input is its output, through pb_utils as a model sees it.
ECHO_MODEL = f"""\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("{OUTPUT}", pb_utils.get_input_tensor_by_name(r, "{INPUT}").as_numpy())]
            )
            for r in requests
        ]
"""


def write_repository(root: Path) -> None:
    """One Python-backend model per batch size, one FP32 input and output of any length.

    The gateway reads them; only the worker rows with ``--python`` run their ``model.py``.
    """
    for batch in BATCHES:
        name = model_name(batch)
        # Without dynamic batching every request runs alone, whatever max_batch_size says.
        batching = "dynamic_batching { }\n" if batch > 1 else ""
        max_batch_size = batch if batch > 1 else 64
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "1" / "model.py").write_text(ECHO_MODEL)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n{batching}'
            f'input [ {{ name: "{INPUT}" data_type: TYPE_FP32 dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "{OUTPUT}" data_type: TYPE_FP32 dims: [ -1 ] }} ]\n'
        )


def read_entries(root: Path) -> dict[str, ModelEntry]:
    entries = ModelRepository(root, auto_complete=False).scan()
    broken = {n: e.error for n, e in entries.items() if not e.available}
    if broken:
        raise RuntimeError(f"the benchmark's models do not read: {broken}")
    return entries


def request(size: int) -> InferRequest:
    """One row of ``size`` bytes of FP32, as the HTTP codec decodes a binary-tensor body."""
    row = np.random.default_rng(0).standard_normal((1, size // 4), dtype=np.float32)
    return InferRequest(
        id="",
        inputs=[InputTensor(INPUT, "FP32", row.shape, row.tobytes())],
        outputs=[RequestedOutput(OUTPUT, binary=True)],
        binary_data_output=True,
        parameters={},
    )


def fill(client: redis.Redis, entry: ModelEntry, size: int, n: int, bundle: int = 1) -> None:
    """``n`` requests on ``entry``'s queue, each checked, built and published as the
    gateway's data plane does it (``DataPlane._prepare``, ``Dispatcher.submit``); with
    ``bundle`` above 1, ``bundle`` of them to a message (``Publisher.publish_bundle``), as
    a gateway's bundles are at best."""
    req = request(size)
    publisher = broker.Publisher(client)
    to = calls.target(entry, "")

    def publish(count: int) -> None:
        held: list[dict] = []
        for k in range(count):
            validation.validate_request(req, entry.config, model_name=entry.name)
            msg = calls.build(to, req, default_timeout_s=QUEUED_TIMEOUT_S, reply_to=REPLY_KEY).msg
            if bundle > 1:
                held.append(msg.to_dict())
                if len(held) == bundle or k == count - 1:
                    publisher.publish_bundle(
                        msg.model, held, priority=msg.priority, reply_to=REPLY_KEY
                    )
                    held = []
                continue
            publisher.publish(
                msg.model,
                msg.to_dict(),
                task_id=msg.id,
                priority=msg.priority,
                reply_to=REPLY_KEY,
            )

    threads = [threading.Thread(target=publish, args=(c,)) for c in shares(n, PUBLISH_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def shares(n: int, ways: int) -> list[int]:
    """``n`` split into at most ``ways`` near-equal counts, none of them 0."""
    ways = max(1, min(ways, n))
    return [n // ways + (k < n % ways) for k in range(ways)]


# --------------------------------------------------------------------------- rows


@dataclass
class Row:
    kind: str  # floor, worker, gateway or hops (wall: the sum of its requests' latencies)
    batch: int  # rows per batch; a gateway row's concurrent connections
    kib: int  # tensor size
    n: int  # requests
    wall_s: float
    cpu_s: float  # the measured process's (the floor's: its client's)
    redis_cpu_s: float
    note: str = ""

    def us(self, seconds: float) -> float:
        return seconds / self.n * 1e6


# --------------------------------------------------------------------------- floor


def measure_floor(client: redis.Redis, redis_pid: int, batch: int, size: int, n: int) -> Row:
    """Pop ``n`` messages ``batch`` at a time and push a reply for each, one round trip a
    batch: the replies of one batch ride with the next pop, as the worker's do."""
    client.flushall()
    raw, reply = sample_message(size), sample_reply(size)
    link = RedisLink(client)
    for start in range(0, n, 256):
        link.call("LPUSH", FLOOR_KEY, *[raw] * min(256, n - start))
    t0, c0, r0 = time.perf_counter(), time.process_time(), procs.on_cpu_seconds([redis_pid])
    taken, owed = 0, 0
    while taken < n:
        commands = [("RPUSH", REPLY_KEY, *[reply] * owed)] if owed else []
        got = link.pipeline([*commands, ("RPOP", FLOOR_KEY, batch)])[-1] or []
        owed = len(got)
        taken += owed
    link.call("RPUSH", REPLY_KEY, *[reply] * owed)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    redis_cpu = procs.on_cpu_seconds([redis_pid]) - r0
    if client.llen(REPLY_KEY) != n:
        raise RuntimeError(f"the floor pushed {client.llen(REPLY_KEY)} replies for {n} messages")
    return Row("floor", batch, size // 1024, n, wall, cpu, redis_cpu)


def sample_message(size: int) -> bytes:
    """A queued message of a ``size``-byte request, as the worker rows' queues hold."""
    req = request(size)
    msg = InferMessage(
        id=broker.new_id(),
        model=GATEWAY_MODEL,
        version=-1,
        inputs=req.wire_inputs(),
        outputs=[OUTPUT],
        reply_to=REPLY_KEY,
        enqueued=time.time(),
        deadline=time.time() + QUEUED_TIMEOUT_S,
    )
    queue = broker.queue_name(msg.model)
    return broker.envelope(
        msg.to_dict(), task_id=msg.id, queue=queue, priority=0, reply_to=REPLY_KEY
    )


def sample_reply(size: int) -> bytes:
    """A reply carrying one ``size``-byte output, as ``Echo``'s replies are packed."""
    _name, datatype, shape, raw = request(size).wire_inputs()[0]
    timing = {"queue": 1_000_000, "compute": 1_000}
    return Reply(broker.new_id(), [(OUTPUT, datatype, shape, raw)], timing=timing, version=1).pack()


# --------------------------------------------------------------------------- worker


class Echo(Backend):
    """A backend that computes nothing: each request's input is its output."""

    def load(self) -> None:
        pass

    def execute(self, requests: list[BackendRequest]) -> list[dict[str, np.ndarray]]:
        return [{OUTPUT: r.inputs[INPUT]} for r in requests]


class TimedDrain(Drain):
    """The real drain, noting when (wall and process CPU) its first pop began."""

    started: tuple[float, float] | None = None

    def pop(self, *args, **kwargs):
        if self.started is None:
            self.started = (time.perf_counter(), time.process_time())
        return super().pop(*args, **kwargs)


class Tally:
    """``Batcher.on_batch``: counts the requests answered, and notes when (wall and
    process CPU) the batch that completes ``n`` of them had its replies pushed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.answered = 0
        self.failed = 0
        self.rows = 0
        self.executions = 0
        self.ended: tuple[float, float] | None = None
        self.done = threading.Event()

    def __call__(self, _model: str, counts: dict[str, int]) -> None:
        self.answered += counts["requests"]
        self.failed += counts["failure"]
        self.rows += counts["rows"]
        self.executions += counts["executions"]
        if self.answered >= self.n and self.ended is None:
            self.ended = (time.perf_counter(), time.process_time())
            self.done.set()


class ProfiledBatcher(Batcher):
    """A batcher whose loop runs under cProfile (``--profile``)."""

    profile: cProfile.Profile | None = None

    def run(self) -> None:
        self.profile = cProfile.Profile()
        self.profile.runcall(super().run)


def measure_worker(
    client: redis.Redis,
    redis_pid: int,
    entry: ModelEntry,
    size: int,
    n: int,
    *,
    profile: bool = False,
    bundled: bool = False,
    python: bool = False,
) -> tuple[Row, str]:
    """Fill ``entry``'s queue with ``n`` requests (``bundled``: a batch's worth to each
    message), then drain it with one batcher, on ``Echo`` or (``python``) the real Python
    backend running ``ECHO_MODEL``; the row, and with ``profile`` the batcher loop's top
    functions (a run of its own, untimed)."""
    client.flushall()
    batch = int(entry.name.removeprefix("drain_b"))
    fill(client, entry, size, n, bundle=batch if bundled else 1)
    spec = entry.spec(1)
    drain = TimedDrain(client, entry.name)
    tally = Tally(n)
    cls = ProfiledBatcher if profile else Batcher
    instance = InstanceSpec(f"{entry.name}_0", "CPU")
    backend = PythonBackend(spec, instance) if python else Echo(spec, instance)
    backend.load()
    parts = QueueParts(
        client=client,
        model=entry.name,
        backends={1: backend},
        name=f"drain-{entry.name}",
        inflight=InFlight(),
        drain=drain,
        sink=ReplySink(client, entry.name),
        link=RedisLink(client),
        on_batch=tally,
    )
    batcher = cls(parts, BatchPolicy.from_config(entry.config), idle_poll=0.25)
    r0 = procs.on_cpu_seconds([redis_pid])
    batcher.start()
    finished = tally.done.wait(max(60.0, n * 0.01))
    redis_cpu = procs.on_cpu_seconds([redis_pid]) - r0
    batcher.stop()
    batcher.join(10)
    backend.unload()
    if not finished or drain.started is None or tally.ended is None:
        raise RuntimeError(f"{entry.name}: {tally.answered} of {n} requests answered in time")
    if tally.failed:
        raise RuntimeError(f"{entry.name}: {tally.failed} of {n} requests failed")
    check_replies(client, n, size)
    wall = tally.ended[0] - drain.started[0]
    cpu = tally.ended[1] - drain.started[1]
    note = f"mean batch formed {tally.rows / max(1, tally.executions):.1f} rows"
    note += f", on {type(backend).__name__}"
    kind = "bundled" if bundled else "worker"
    row = Row(kind, batch, size // 1024, n, wall, cpu, redis_cpu, note)
    return row, top_functions(batcher.profile) if profile else ""


def check_replies(client: redis.Redis, n: int, size: int) -> None:
    """Every request answered once, and the first and last answers are their inputs."""
    count = client.llen(REPLY_KEY)
    if count != n:
        raise RuntimeError(f"{count} replies for {n} requests")
    expected = request(size).inputs[0].raw
    for raw in (client.lindex(REPLY_KEY, 0), client.lindex(REPLY_KEY, -1)):
        reply = Reply.unpack(raw)
        if reply.error is not None or not reply.outputs or reply.outputs[0].raw != expected:
            raise RuntimeError(f"a reply is not the request's input: {reply.error}")


def top_functions(profile: cProfile.Profile | None, top: int = 25) -> str:
    if profile is None:
        return ""
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# --------------------------------------------------------------------------- gateway


def stand_in(url: str, model: str) -> None:
    """A worker that runs no model: every message popped is answered with its own input.

    It says it serves ``model`` (a worker report), so the gateway finds the model ready.
    """
    client = open_client(url)
    report = {model: {"versions": {"1": worker_reports.READY}, "reason": None}}
    worker_reports.publish(client, f"drain-stand-in-{os.getpid()}", report, ttl_s=3600)
    drain, sink, link = Drain(client, model), ReplySink(client, model), RedisLink(client)
    while True:
        popped = drain.pop(256)
        if not popped:
            drain.wait(1.0)
            continue
        answers = []
        for message in popped:
            for payload in broker.decode(message.raw).payloads:  # a bundle holds several
                msg = InferMessage.from_dict(payload)
                answers.append((msg, Reply(msg.id, [(OUTPUT, *msg.inputs[0][1:])], version=1)))
        pipe = Commands()
        sink.deliver_all(pipe, answers)
        ack(pipe, drain.queue, [message.tag for message in popped])
        link.run(pipe)


def infer_call(model: str, size: int) -> bytes:
    """An HTTP infer call with one binary input tensor of ``size`` bytes, whole."""
    raw = request(size).inputs[0].raw
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": INPUT,
                    "shape": [1, size // 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": size},
                }
            ],
            "outputs": [{"name": OUTPUT, "parameters": {"binary_data": True}}],
        }
    ).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(header) + len(raw)}\r\n\r\n"
    )
    return head.encode() + header + raw


def call_loop(port: int, call: bytes, count: int, errors: list[str]) -> None:
    """``count`` calls, one after another, on one keep-alive connection; the first
    answer that is not a 200 ends it, in ``errors``."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        for _ in range(count):
            sock.sendall(call)
            while (end := buf.find(b"\r\n\r\n")) < 0:
                buf += receive(sock)
            head = bytes(buf[:end]).lower()
            length = content_length(head)
            need = end + 4 + length
            while len(buf) < need:
                buf += receive(sock)
            if not head.startswith(b"http/1.1 200"):
                errors.append(bytes(buf[:need]).decode("utf-8", "replace"))
                return
            del buf[:need]


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip() == b"content-length":
            return int(value)
    return 0


def receive(sock: socket.socket) -> bytes:
    data = sock.recv(262144)
    if not data:
        raise ConnectionError("the gateway closed the connection")
    return data


def drive(port: int, call: bytes, n: int, concurrency: int) -> float:
    """Seconds ``n`` calls took from ``concurrency`` connections at once. A connection that
    fails (refused, reset) fails the run, as an answer that is not a 200 does: a thread's
    exception would otherwise end only that thread, and the calls it never made would
    still count."""
    errors: list[str] = []

    def connection(count: int) -> None:
        try:
            call_loop(port, call, count, errors)
        except OSError as exc:
            errors.append(f"connection failed: {exc!r}")

    counts = shares(n, concurrency)
    threads = [threading.Thread(target=connection, args=(c,)) for c in counts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"the gateway answered: {errors[0][:500]}")
    return took


def measure_gateway(
    group: procs.Group, url: str, redis_pid: int, repo: Path, args: argparse.Namespace
) -> list[Row]:
    open_client(url).flushall()
    stand = group.start("stand-in", [sys.executable, __file__, "--stand-in", url, GATEWAY_MODEL])
    port = redis_server.free_port()
    common = ["--model-repository", str(repo), "--redis-url", url]
    listen = ["--http-address", "127.0.0.1", "--http-port", str(port)]
    listen += ["--metrics-port", str(redis_server.free_port())]
    gateway = group.start("conch-gateway", conch("gateway", *common, *listen))
    ready_url = f"http://127.0.0.1:{port}/v2/models/{GATEWAY_MODEL}/ready"
    procs.wait_until(lambda: http_ok(ready_url), 120, group, "the gateway's readiness")
    rows = []
    for size in args.sizes:
        call = infer_call(GATEWAY_MODEL, size)
        for concurrency in args.concurrency:
            drive(port, call, 4 * concurrency, concurrency)  # the gateway's paths warm
            group.check_alive()
            measured = (procs.session_pids(gateway.pid), [stand.pid], [redis_pid])
            before = [procs.on_cpu_seconds(pids) for pids in measured]
            wall = drive(port, call, args.n, concurrency)
            cpu, stand_cpu, redis_cpu = (
                procs.on_cpu_seconds(pids) - b for pids, b in zip(measured, before, strict=True)
            )
            note = f"stand-in CPU {stand_cpu / args.n * 1e6:.0f} µs/req, not counted"
            row = Row("gateway", concurrency, size // 1024, args.n, wall, cpu, redis_cpu, note)
            rows.append(row)
            say(f"gateway, {size // 1024} KiB, concurrency {concurrency}: {report(row)}")
    gateway.stop()
    stand.stop()
    return rows


# --------------------------------------------------------------------------- the hops' floor

HOP_QUEUE = "drain-bench.hops"
HOP_REPLY = "drain-bench.hop-reply"
HOP_BYTES = 1024


def hop_gateway(url: str, port: str) -> None:
    """The gateway's hops and nothing else: a request read from one keep-alive connection
    is pushed to a list, and the reply popped from another is written back."""
    client = open_client(url)
    with socket.create_server(("127.0.0.1", int(port))) as server:
        conn, _ = server.accept()
        while True:
            data = conn.recv(65536)
            if not data:
                return
            client.lpush(HOP_QUEUE, data)
            _, reply = client.blpop([HOP_REPLY])
            conn.sendall(reply)


def hop_worker(url: str) -> None:
    """The worker's hops and nothing else: pop a request, push it back as its reply."""
    client = open_client(url)
    while True:
        _, raw = client.blpop([HOP_QUEUE])
        client.lpush(HOP_REPLY, raw)


@dataclass(frozen=True)
class HopFloor:
    """One request at a time through what every conch request crosses: a client, a
    gateway process, Redis, a worker process, Redis again, and back; no conch code."""

    n: int
    p50_s: float
    mean_s: float


def measure_hops(group: procs.Group, url: str, n: int) -> HopFloor:
    """The latency floor of conch's hops at concurrency 1 (``hop_gateway``, ``hop_worker``)."""
    port = redis_server.free_port()
    worker = group.start("hop-worker", [sys.executable, __file__, "--hop-worker", url])
    gateway = group.start(
        "hop-gateway", [sys.executable, __file__, "--hop-gateway", url, str(port)]
    )
    payload = b"x" * HOP_BYTES
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            if not (gateway.alive() and worker.alive()) or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the hop processes did not start: {gateway.log_tail()}"
                ) from None
            time.sleep(0.05)
    took: list[float] = []
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(n + 50):  # the first 50 warm the path
            t0 = time.perf_counter()
            sock.sendall(payload)
            got = 0
            while got < len(payload):
                got += len(sock.recv(65536))
            if i >= 50:
                took.append(time.perf_counter() - t0)
    gateway.stop()
    worker.stop()
    took.sort()
    return HopFloor(n, took[len(took) // 2], sum(took) / len(took))


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


# --------------------------------------------------------------------------- the run


def report(row: Row) -> str:
    return f"{row.us(row.wall_s):.1f} us/req wall, {row.us(row.cpu_s):.1f} us/req CPU"


def floor_for(rows: list[Row], row: Row) -> Row | None:
    """The floor a row is divided by: a worker's (bundled or not) at its batch size, the
    floor of one message a request; a gateway's at batch 1,
    since a gateway sends one message and takes one reply for each call, however many are
    in flight."""
    if row.kind == "hops":  # a latency, not a cost: its note says what it is
        return None
    batch = row.batch if row.kind != "gateway" else 1
    return next(
        (r for r in rows if r.kind == "floor" and (r.batch, r.kib) == (batch, row.kib)), None
    )


GATEWAY_GOAL_US = 80  # issue 42: the gateway's CPU per request at concurrency 64, 1 KiB
GATEWAY_GOAL_AT = (64, 1)  # (concurrency, KiB)


def gateway_goal(rows: list[Row]) -> str:
    """Issue 42's goal for the gateway row, PASS/FAIL/SKIP with what was measured."""
    batch, kib = GATEWAY_GOAL_AT
    row = next((r for r in rows if (r.kind, r.batch, r.kib) == ("gateway", batch, kib)), None)
    goal = f"gateway c={batch}, {kib} KiB: CPU <= {GATEWAY_GOAL_US} µs/request (issue 42)"
    if row is None:
        return f"SKIP  {goal}: not measured"
    us = row.us(row.cpu_s)
    return f"{'PASS' if us <= GATEWAY_GOAL_US else 'FAIL'}  {goal}: {us:.1f} µs"


def format_table(rows: list[Row]) -> str:
    head = (
        "row",
        "batch",
        "tensor",
        "N",
        "wall µs/req",
        "CPU µs/req",
        "Redis CPU µs/req",
        "wall ÷ floor",
        "CPU ÷ floor",
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        floor = floor_for(rows, row)
        ratio = (
            (f"{row.wall_s / floor.wall_s:.2f}", f"{row.cpu_s / floor.cpu_s:.2f}")
            if floor is not None and floor.wall_s > 0 and floor.cpu_s > 0
            else ("", "")
        )
        cells = (
            row.kind,
            str(row.batch),
            f"{row.kib} KiB",
            str(row.n),
            f"{row.us(row.wall_s):.1f}",
            f"{row.us(row.cpu_s):.1f}",
            f"{row.us(row.redis_cpu_s):.1f}",
            *ratio,
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N = 512 unless --n says otherwise")
    p.add_argument("--n", type=int, help="requests per row (default 4096; --quick: 512)")
    p.add_argument(
        "--concurrency",
        default="1,64",
        help="the gateway rows' concurrent connections, comma-separated (default 1,64)",
    )
    p.add_argument("--profile", action="store_true", help="cProfile the worker at batch 64")
    p.add_argument(
        "--python",
        action="store_true",
        help="the worker rows run an echo model.py on the real Python backend, not Echo",
    )
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"default {DEFAULT_JSON}")
    p.add_argument("--stand-in", nargs=2, metavar=("URL", "MODEL"), help=argparse.SUPPRESS)
    p.add_argument("--hop-gateway", nargs=2, metavar=("URL", "PORT"), help=argparse.SUPPRESS)
    p.add_argument("--hop-worker", metavar="URL", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.n is None:
        args.n = 512 if args.quick else 4096
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        p.error("--concurrency takes integers, e.g. 1,64")
    if args.n < 1 or not args.concurrency or min(args.concurrency) < 1:
        p.error("--n and --concurrency take positive integers")
    args.sizes = [kib * 1024 for kib in SIZES_KIB]
    return args


def run(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    logs = args.json.parent / f"{args.json.stem}-logs"
    private = redis_server.start_private(unix_socket=True)
    try:
        with procs.Group(logs) as group, tempfile.TemporaryDirectory(prefix="drain-") as tmp:
            group.guard("redis-server", private.process.pid)
            pid = private.process.pid
            repo = Path(tmp)
            write_repository(repo)
            entries = read_entries(repo)
            client = open_client(private.url)
            Drain(client, "warm-up").pop(1)  # Redis loads the pop script before any timing
            for size in args.sizes:
                for batch in BATCHES:
                    floor = min(
                        (
                            measure_floor(client, pid, batch, size, args.n)
                            for _ in range(FLOOR_TRIES)
                        ),
                        key=lambda r: r.wall_s,
                    )
                    say(f"floor, {size // 1024} KiB, batch {batch}: {report(floor)}")
                    # The worker rows at this size and batch, on Echo or (--python) model.py.
                    drained = functools.partial(
                        measure_worker,
                        client,
                        pid,
                        entries[model_name(batch)],
                        size,
                        args.n,
                        python=args.python,
                    )
                    worker, _ = drained()
                    say(f"worker, {size // 1024} KiB, batch {batch}: {report(worker)}")
                    rows += [floor, worker]
                    if batch > 1:  # a model without dynamic batching gets no bundles
                        bundled, _ = drained(bundled=True)
                        say(f"bundled, {size // 1024} KiB, batch {batch}: {report(bundled)}")
                        rows.append(bundled)
                    if args.profile and batch == 64:
                        _, top = drained(profile=True)
                        print(f"\nworker, batch 64, {size // 1024} KiB, cProfile:\n{top}")
            rows += measure_gateway(group, private.url, pid, repo, args)
            hops = measure_hops(group, private.url, args.n)
            say(f"hops, 1 KiB, concurrency 1: p50 {hops.p50_s * 1e6:.0f} µs")
            rows.append(
                Row(
                    "hops",
                    1,
                    HOP_BYTES // 1024,
                    hops.n,
                    hops.mean_s * hops.n,
                    0.0,
                    0.0,
                    f"p50 {hops.p50_s * 1e6:.0f} µs a request: the floor of conch's p50 at "
                    "concurrency 1 (client, gateway process, Redis, worker process, Redis)",
                )
            )
    finally:
        private.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stand_in:
        stand_in(*args.stand_in)
        return 0
    if args.hop_gateway:
        hop_gateway(*args.hop_gateway)
        return 0
    if args.hop_worker:
        hop_worker(args.hop_worker)
        return 0
    started = time.monotonic()
    rows = run(args)
    kinds = ("floor", "worker", "bundled", "gateway", "hops")
    rows.sort(key=lambda r: (kinds.index(r.kind), r.kib, r.batch))
    print(
        f"\nconch's own cost per request ({os.cpu_count()} CPUs, N = {args.n} per row; "
        "CPU: the measured process's, a floor's is its client's):\n"
    )
    print(format_table(rows))
    for row in rows:
        if row.note:
            print(f"  {row.kind} batch {row.batch}, {row.kib} KiB: {row.note}")
    print(f"\ngoal:\n  {gateway_goal(rows)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "argv": sys.argv[1:],
        "cpus": os.cpu_count(),
        "at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "rows": [{**asdict(r), "wall_us": r.us(r.wall_s), "cpu_us": r.us(r.cpu_s)} for r in rows],
    }
    args.json.write_text(json.dumps(document, indent=2))
    print(f"\n(results: {args.json}; took {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
