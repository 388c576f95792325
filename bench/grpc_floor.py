#!/usr/bin/env python3
"""What a gRPC transport costs by itself, and what conch's gRPC path would cost on another.

    .venv/bin/python bench/grpc_floor.py [--concurrency 1,16,64] [--window-ms 2000] [--rounds 2]
    PYTHONPATH=platform .venv/bin/python bench/grpc_floor.py --dataplane [--concurrency 1,16,64]

Floors (the default): perf_analyzer -i grpc against servers that answer every call at
once, with the same canned output of the benchmark's ``mlp`` shape (and the metadata and
config perf_analyzer asks for first), no Redis, worker or data plane behind them, so their
CPU per call is what any frontend built on the transport pays before doing any work:

- ``grpcio``: grpcio's synchronous server and its thread pool, what ``conch grpc`` runs;
- ``grpcio-aio``: grpcio's asyncio server;
- ``h2``: the ``h2`` library's HTTP/2 state machine (``H2Connection``, server side) on a
  gevent socket, as the HTTP gateway runs: a greenlet per connection reads and feeds it, a
  greenlet per call answers, one writer per connection sends what h2 has ready. h2 does
  the framing, HPACK, SETTINGS, PING, GOAWAY and flow control (received DATA is
  acknowledged; a sender waits while the peer's window is shut); the gRPC layer above it
  (length-prefixed messages, ``grpc-status`` and ``grpc-message`` trailers) is a few
  lines here. Unary calls only: no streams, deadlines, compression or TLS;
- ``grpclib``: ``grpclib.server.Server`` (asyncio on h2), its handlers registered as
  ``grpclib.const.Handler`` entries, messages passed as bytes as grpcio's are here.

``--dataplane``: the whole path, over one private Redis and one worker: conch's HTTP
gateway, ``conch grpc`` on each of its transports (``--grpc-transport grpcio`` and ``h2``,
the latter built from the ``h2`` floor here), and the ``h2`` and ``grpclib`` prototypes answering
through conch's own ``InferenceService`` and data plane (what ``conch grpc`` runs, on the
other transport: on gevent for h2; in a pool of 64 threads beside grpclib's loop, since
the service blocks on Redis), with infer/s, p50 and CPU ms per request of the frontend,
worker, redis and perf_analyzer.

Measured: bench/README.md, "Issue 14: gRPC" (grpcio against HTTP/2 framed by hand) and
"Issue 28: which HTTP/2 library" (h2 against grpclib).

Rounds take turns through the servers, so that a busy host weighs on all of them alike.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SERVERS = ("grpcio", "grpcio-aio", "h2", "grpclib")
# --dataplane's frontends: name -> conch's command, or the ``serve`` variant of this script.
DATAPLANE = {
    "conch HTTP (gevent)": "gateway",
    "conch gRPC (grpcio)": "grpc",
    "conch gRPC (h2)": "grpc-h2",
    "gRPC on h2 (gevent)": "h2-dataplane",
    "gRPC on grpclib (asyncio)": "grpclib-dataplane",
}
SERVICE = "/inference.GRPCInferenceService/"


# --------------------------------------------------------------------------- the answers


def _answers() -> dict[str, Callable[[bytes], bytes]]:
    """Method name -> function from the request's bytes to the response's bytes."""
    import numpy as np
    from tritonclient.grpc import service_pb2 as pb

    output = np.zeros((1, 16), np.float32).tobytes()
    tensor = pb.ModelMetadataResponse.TensorMetadata
    metadata = pb.ModelMetadataResponse(
        name="mlp",
        versions=["1"],
        platform="onnxruntime_onnx",
        inputs=[tensor(name="INPUT0", datatype="FP32", shape=[-1, 64])],
        outputs=[tensor(name="OUTPUT0", datatype="FP32", shape=[-1, 16])],
    ).SerializeToString()
    config = pb.ModelConfigResponse(
        config={"name": "mlp", "max_batch_size": 64}
    ).SerializeToString()
    server = pb.ServerMetadataResponse(name="floor", version="0").SerializeToString()
    live = pb.ServerLiveResponse(live=True).SerializeToString()

    def infer(body: bytes) -> bytes:
        request = pb.ModelInferRequest.FromString(body)
        response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        out = response.outputs.add(name="OUTPUT0", datatype="FP32")
        out.shape.extend([1, 16])
        response.raw_output_contents.append(output)
        return response.SerializeToString()

    return {
        "ModelInfer": infer,
        "ModelMetadata": lambda _: metadata,
        "ModelConfig": lambda _: config,
        "ServerMetadata": lambda _: server,
        "ServerLive": lambda _: live,
    }


ANSWERED = 0  # ModelInfer calls answered, printed when the server is stopped


def _count_on_exit() -> None:
    def stop(*_: object) -> None:
        print(ANSWERED, flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)


def _grpcio_handlers(asynchronous: bool) -> object:
    import grpc

    def handler(answer: Callable[[bytes], bytes]) -> object:
        def call(body: bytes, _context: object) -> bytes:
            global ANSWERED
            ANSWERED += answer is infer
            return answer(body)

        async def acall(body: bytes, _context: object) -> bytes:
            return call(body, _context)

        return grpc.unary_unary_rpc_method_handler(acall if asynchronous else call)

    answers = _answers()
    infer = answers["ModelInfer"]
    handlers = {name: handler(answer) for name, answer in answers.items()}
    return grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers)


def serve_grpcio(port: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    server = grpc.server(ThreadPoolExecutor(64), handlers=[_grpcio_handlers(False)])
    server.add_insecure_port(f"127.0.0.1:{port}")
    _count_on_exit()
    server.start()
    server.wait_for_termination()


def serve_grpcio_aio(port: int) -> None:
    import asyncio

    import grpc

    async def main() -> None:
        server = grpc.aio.server(handlers=[_grpcio_handlers(True)])
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    _count_on_exit()
    asyncio.run(main())


def _grpc_message(payload: bytes) -> bytes:
    """One gRPC length-prefixed message: uncompressed flag, big-endian length, payload."""
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def _grpc_unary(body: bytes) -> bytes:
    """A unary call's one request message from the DATA it sent; ValueError when that is
    not exactly one uncompressed message."""
    if len(body) < 5 or body[0] != 0 or len(body) != 5 + int.from_bytes(body[1:5], "big"):
        raise ValueError("not one uncompressed gRPC message")
    return body[5:]


def _grpc_trailers(code: int, message: str = "") -> list[tuple[bytes, bytes]]:
    """The trailers that end a gRPC call: ``grpc-status``, and ``grpc-message``
    percent-encoded (gRPC's spec) when there is one."""
    from urllib.parse import quote

    trailers = [(b"grpc-status", str(code).encode())]
    if message:
        trailers.append((b"grpc-message", quote(message, safe=" ").encode()))
    return trailers


def serve_h2(port: int, answers: dict[str, Callable[[bytes], bytes]] | None = None) -> None:
    """gRPC on the ``h2`` library's server-side state machine, on a gevent socket: a
    greenlet per connection reads and feeds ``H2Connection``, a greenlet per call answers,
    and one writer per connection sends whatever h2 has ready. Flow control as h2 asks:
    received DATA acknowledged, and a sender waits while the peer's window is shut."""
    from gevent import monkey

    monkey.patch_all()
    import gevent
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions
    from gevent.event import Event
    from gevent.server import StreamServer

    answers = answers or _answers()
    # The peer's headers are checked as h2 checks them; ours are constants, written once.
    config = h2.config.H2Configuration(
        client_side=False,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    ok = _grpc_trailers(0)
    prefix = SERVICE.encode()

    def handle(sock: socket.socket, _address: object) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = h2.connection.H2Connection(config)
        conn.initiate_connection()
        ready = Event()  # h2 has bytes to send
        opened = Event()  # a window opened: senders held by flow control look again
        calls: dict[int, list] = {}  # stream -> [method, body so far]

        def writer() -> None:
            while True:
                ready.wait()
                ready.clear()
                out = conn.data_to_send()
                if out:
                    sock.sendall(out)

        def send_data(stream: int, data: bytes) -> None:
            while data:
                window = min(conn.local_flow_control_window(stream), conn.max_outbound_frame_size)
                if window <= 0:
                    opened.clear()
                    opened.wait()
                    continue
                conn.send_data(stream, data[:window])
                data = data[window:]
                ready.set()

        def answer(stream: int, method: str, body: bytes) -> None:
            global ANSWERED
            try:
                respond = answers.get(method)
                if respond is None:
                    trailers = _grpc_trailers(12, f"unknown method {method}")  # UNIMPLEMENTED
                    conn.send_headers(stream, head + trailers, end_stream=True)
                else:
                    ANSWERED += method == "ModelInfer"
                    try:
                        reply = _grpc_message(respond(_grpc_unary(body)))
                    except Exception as error:  # the call fails, not the connection
                        trailers = _grpc_trailers(2, f"{type(error).__name__}: {error}")
                        conn.send_headers(stream, head + trailers, end_stream=True)
                    else:
                        conn.send_headers(stream, head)
                        send_data(stream, reply)
                        conn.send_headers(stream, ok, end_stream=True)
            except h2.exceptions.StreamClosedError:
                pass  # the peer reset the call meanwhile
            ready.set()

        writing = gevent.spawn(writer)
        ready.set()
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                try:
                    events = conn.receive_data(data)
                except h2.exceptions.ProtocolError:
                    sock.sendall(conn.data_to_send())  # h2's GOAWAY
                    return
                for event in events:
                    if isinstance(event, h2.events.DataReceived):
                        calls[event.stream_id][1] += event.data
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.RequestReceived):
                        path = dict(event.headers)[b":path"]
                        calls[event.stream_id] = [path.removeprefix(prefix).decode(), b""]
                    elif isinstance(event, h2.events.StreamEnded):
                        gevent.spawn(answer, event.stream_id, *calls.pop(event.stream_id))
                    elif isinstance(
                        event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)
                    ):
                        opened.set()
                    elif isinstance(event, h2.events.StreamReset):
                        calls.pop(event.stream_id, None)
                        opened.set()
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        return
                ready.set()
        finally:
            writing.kill()

    _count_on_exit()
    StreamServer(("127.0.0.1", port), handle).serve_forever()


def serve_grpclib(
    port: int,
    answers: dict[str, Callable[[bytes], bytes]] | None = None,
    threads: int = 0,
) -> None:
    """gRPC on ``grpclib`` (asyncio on h2): a coroutine per call. Messages pass as bytes
    (a codec that leaves them be), as grpcio's handlers get them here; ``threads``: answer
    in a pool of that many threads, as a blocking service must under asyncio."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from grpclib.const import Cardinality, Handler
    from grpclib.encoding.base import CodecBase
    from grpclib.server import Server

    answers = answers or _answers()
    pool = ThreadPoolExecutor(threads) if threads else None

    class Bytes(CodecBase):
        __content_subtype__ = "proto"  # what grpclib takes plain application/grpc for

        def encode(self, message: bytes, _message_type: object) -> bytes:
            return message

        def decode(self, data: bytes, _message_type: object) -> bytes:
            return data

    def handler(method: str, respond: Callable[[bytes], bytes]) -> Handler:
        async def call(stream: object) -> None:
            global ANSWERED
            body = await stream.recv_message()
            ANSWERED += method == "ModelInfer"
            if pool is None:
                reply = respond(body)
            else:
                reply = await asyncio.get_running_loop().run_in_executor(pool, respond, body)
            await stream.send_message(reply)

        return Handler(call, Cardinality.UNARY_UNARY, None, None)

    class Service:
        def __mapping__(self) -> dict[str, Handler]:
            return {SERVICE + name: handler(name, respond) for name, respond in answers.items()}

    async def main() -> None:
        server = Server([Service()], codec=Bytes())
        await server.start("127.0.0.1", port)
        await server.wait_closed()

    _count_on_exit()
    asyncio.run(main())


def _dataplane_answers(repository: str, redis_url: str) -> dict[str, Callable[[bytes], bytes]]:
    """Every call answered by conch's own ``InferenceService`` and data plane, as
    ``conch grpc`` answers it (a gevent transport patches before this imports redis)."""
    from tritonclient.grpc import service_pb2 as pb

    from conch.core.restricted_apis import RestrictedApis
    from conch.frontend.composition import build_dataplane
    from conch.frontend.grpc.service import InferenceService
    from conch.settings import Settings

    settings = Settings(model_repository=Path(repository), redis_url=redis_url)
    service = InferenceService(build_dataplane(settings), RestrictedApis(), 1, compression=None)

    class Context:  # what the service asks of grpcio's context on these calls
        def invocation_metadata(self) -> tuple:
            return ()

        def time_remaining(self) -> None:
            return None

        def set_compression(self, _compression: object) -> None:
            pass

        def add_callback(self, _callback: object) -> None:
            pass

        def abort(self, code: object, details: str) -> None:
            raise RuntimeError(f"{code}: {details}")

    def unary(name: str) -> Callable[[bytes], bytes]:
        parse, method = getattr(pb, f"{name}Request").FromString, getattr(service, name)
        return lambda body: method(parse(body), Context()).SerializeToString()

    names = ("ModelInfer", "ModelMetadata", "ModelConfig", "ServerMetadata", "ModelStatistics")
    return {name: unary(name) for name in names}


def serve_h2_dataplane(port: int, repository: str, redis_url: str) -> None:
    """``serve_h2`` over conch's gRPC service and data plane, on gevent as the gateway."""
    from gevent import monkey

    monkey.patch_all()  # before redis is imported, as the gateway does
    serve_h2(port, _dataplane_answers(repository, redis_url))


def serve_grpclib_dataplane(port: int, repository: str, redis_url: str) -> None:
    """``serve_grpclib`` over conch's gRPC service and data plane: the service blocks on
    Redis, so it answers in threads (64, as ``conch grpc``'s pool) beside the loop."""
    serve_grpclib(port, _dataplane_answers(repository, redis_url), threads=64)


SERVE = {
    "grpcio": serve_grpcio,
    "grpcio-aio": serve_grpcio_aio,
    "h2": serve_h2,
    "grpclib": serve_grpclib,
    "h2-dataplane": serve_h2_dataplane,
    "grpclib-dataplane": serve_grpclib_dataplane,
}


# --------------------------------------------------------------------------- the driver

sys.path.insert(0, str(BENCH))
import procs  # noqa: E402

from conch.devtools import perf_analyzer  # noqa: E402
from conch.devtools.processes import conch  # noqa: E402


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def measure(
    pa: str, url: str, protocol: str, concurrency: int, args: argparse.Namespace, csv: Path
) -> tuple[float, float]:
    """Run perf_analyzer to the end; its last window's infer/s and p50 latency in ms."""
    ran = perf_analyzer.run(
        pa,
        [
            *("-m", "mlp", "-u", url, "-i", protocol),
            *("--concurrency-range", str(concurrency)),
            *("--measurement-mode", "time_windows", "--measurement-interval", str(args.window_ms)),
            *("--stability-percentage", "1000", "--max-trials", "3"),
        ],
        csv,
        timeout_s=args.window_ms / 1000 * 5 + 60,
    )
    if ran.code != 0 or not ran.rows:
        raise RuntimeError(
            f"perf_analyzer exited {ran.code}; its output: {csv.with_suffix('.log')}"
        )
    row = ran.rows[-1]
    return float(row["Inferences/Second"]), float(row["p50 latency"]) / 1000


def _turns(args: argparse.Namespace, names: list[str]) -> list[tuple[int, int, str]]:
    """(round, concurrency, name) in the order they run: each round takes every
    concurrency in turn, and at each concurrency every server in turn, so that a busy
    host weighs on all of them alike."""
    return [
        (n, c, name) for n in range(1, args.rounds + 1) for c in args.concurrency for name in names
    ]


def floors(pa: str, args: argparse.Namespace, out_dir: Path) -> None:
    """Each transport answering at once: its CPU per call, counted by the server."""
    print(
        "| round | conc | server | infer/s | p50 ms | server CPU ms/req "
        "| perf_analyzer CPU ms/req |"
    )
    print("|---|---|---|---|---|---|---|")
    for n, concurrency, kind in _turns(args, args.servers.split(",")):
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, __file__, "serve", kind, str(port)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            procs.wait_until(lambda port=port: _listening(port), 30, None, kind)
            cpu0, pa0 = procs.cpu_seconds(pids=[server.pid])[server.pid], _children_cpu()
            url = f"127.0.0.1:{port}"
            csv = out_dir / f"floor-{kind}-{concurrency}.csv"
            rate, p50 = measure(pa, url, "grpc", concurrency, args, csv)
            cpu1, pa1 = procs.cpu_seconds(pids=[server.pid])[server.pid], _children_cpu()
        finally:
            server.terminate()
            answered = int((server.communicate(timeout=10)[0] or "0").split()[-1])
        print(
            f"| {n} | {concurrency} | {kind} | {rate:,.0f} | {p50:.2f} "
            f"| {1000 * (cpu1 - cpu0) / answered:.3f} "
            f"| {1000 * (pa1 - pa0) / answered:.3f} |",
            flush=True,
        )


def _successes(http_url: str) -> int:
    """The mlp model's successful requests so far (statistics extension), any frontend's."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{http_url}/v2/models/mlp/stats", timeout=5) as resp:
        return int(json.load(resp)["model_stats"][0]["inference_stats"]["success"]["count"])


def dataplane(pa: str, args: argparse.Namespace, out_dir: Path) -> None:
    """The whole path: conch's HTTP gateway, ``conch grpc`` (grpcio), and the h2 and
    grpclib transports over conch's gRPC service, over one private Redis and one worker."""
    from conch.devtools import redis_server

    import models

    repo = models.build_repository()
    private = redis_server.start_private(unix_socket=True)
    try:
        with procs.Group(out_dir / "logs") as group:
            group.guard("redis-server", private.process.pid)
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            worker = group.start("worker", conch("worker", *common))
            local = "127.0.0.1"
            ports = {name: _free_port() for name in DATAPLANE}
            http = ports["conch HTTP (gevent)"]

            def command(name: str, port: int) -> list[str]:
                serve = DATAPLANE[name]
                if serve == "gateway":
                    address = ("--http-address", local, "--http-port", str(port))
                    return conch("gateway", *common, *address, "--allow-metrics", "false")
                if serve in ("grpc", "grpc-h2"):
                    transport = ("--grpc-transport", "h2" if serve == "grpc-h2" else "grpcio")
                    address = ("--grpc-address", local, "--grpc-port", str(port))
                    return conch("grpc", *common, *address, *transport)
                return [sys.executable, __file__, "serve", serve, str(port), str(repo), private.url]

            frontends = {
                name: (
                    group.start(DATAPLANE[name], command(name, port)),
                    f"{local}:{port}",
                    "http" if DATAPLANE[name] == "gateway" else "grpc",
                )
                for name, port in ports.items()
            }

            def ready() -> bool:
                try:
                    _successes(f"{local}:{http}")
                except OSError:
                    return False
                return all(_listening(port) for port in ports.values())

            procs.wait_until(ready, 180, group, "the frontends")
            print(
                "| round | conc | frontend | infer/s | p50 ms | frontend | worker | redis "
                "| perf_analyzer | total CPU ms/req |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|")
            pids = {"worker": worker.pid, "redis": private.process.pid}
            for n, concurrency, name in _turns(args, list(frontends)):
                child, url, protocol = frontends[name]
                group.check_alive()
                ids = {**pids, "frontend": child.pid}
                count0 = _successes(f"{local}:{http}")
                # A frontend's session holds its processes (gunicorn's workers too).
                cpu0 = procs.cpu_seconds(pids=[pids["redis"]], sessions=[child.pid, worker.pid])
                pa0 = _children_cpu()
                csv = out_dir / f"dataplane-{protocol}-{child.name}-{concurrency}.csv"
                rate, p50 = measure(pa, url, protocol, concurrency, args, csv)
                cpu1 = procs.cpu_seconds(pids=[pids["redis"]], sessions=[child.pid, worker.pid])
                served = _successes(f"{local}:{http}") - count0
                ms = {k: 1000 * (cpu1[pid] - cpu0[pid]) / served for k, pid in ids.items()}
                ms["perf_analyzer"] = 1000 * (_children_cpu() - pa0) / served
                cells = " | ".join(
                    f"{ms[k]:.3f}" for k in ("frontend", "worker", "redis", "perf_analyzer")
                )
                print(
                    f"| {n} | {concurrency} | {name} | {rate:,.0f} | {p50:.2f} | {cells} "
                    f"| {sum(ms.values()):.3f} |",
                    flush=True,
                )
    finally:
        private.stop()


def _concurrencies(text: str) -> list[int]:
    """``--concurrency``: one level or several, comma-separated (``1,16,64``)."""
    levels = [int(level) for level in text.split(",")]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be 1 or more: {text!r}")
    return levels


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        SERVE[argv[1]](int(argv[2]), *argv[3:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--concurrency",
        type=_concurrencies,
        default=[16],
        help="concurrency levels, comma-separated (default 16; e.g. 1,16,64)",
    )
    p.add_argument("--window-ms", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--servers", default=",".join(SERVERS), help=f"from {', '.join(SERVERS)}")
    p.add_argument(
        "--dataplane",
        action="store_true",
        help="the whole path instead: HTTP, conch grpc, and the h2 and grpclib transports "
        "over conch's data plane, a private Redis and a worker",
    )
    args = p.parse_args(argv)
    pa = perf_analyzer.binary()
    out_dir = BENCH.parent / ".cache" / "bench" / "grpc-floor"
    out_dir.mkdir(parents=True, exist_ok=True)
    (dataplane if args.dataplane else floors)(pa, args, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
