#!/usr/bin/env python3
"""What a gRPC transport costs by itself, and what conch's gRPC path would cost on another.

    .venv/bin/python bench/grpc_floor.py [--concurrency 16] [--window-ms 2000] [--rounds 2]
    PYTHONPATH=platform .venv/bin/python bench/grpc_floor.py --dataplane

Floors (the default): perf_analyzer -i grpc against servers that answer every call at
once, with a canned output of the benchmark's ``mlp`` shape (and the metadata and config
perf_analyzer asks for first), no Redis, worker or data plane behind them, so their CPU
per call is what any frontend built on the transport pays before doing any work:

- ``grpcio``: grpcio's synchronous server and its thread pool, what ``conch grpc`` runs;
- ``grpcio-aio``: grpcio's asyncio server;
- ``h2-gevent``: HTTP/2 framed by hand on a gevent socket, as the HTTP gateway's
  keep-alive loop reads HTTP/1.1: a greenlet per call, one writer per connection
  (HPACK decoding by the ``hpack`` package, response header blocks written once). It is
  a measuring device, not a server: no flow control past the connection window, no
  TLS, no errors, no streams, one header frame per request.

``--dataplane``: the whole path, over one private Redis and one worker: conch's HTTP
gateway, ``conch grpc`` (grpcio), and ``h2-gevent`` answering through conch's own
``InferenceService`` and data plane (what ``conch grpc`` runs, on the other transport),
with CPU ms per request of the frontend, worker, redis and perf_analyzer.

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
SERVERS = ("grpcio", "grpcio-aio", "h2-gevent")
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
            ANSWERED += 1
            return answer(body)

        async def acall(body: bytes, _context: object) -> bytes:
            return call(body, _context)

        return grpc.unary_unary_rpc_method_handler(acall if asynchronous else call)

    handlers = {name: handler(answer) for name, answer in _answers().items()}
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


# HTTP/2 (RFC 9113) frame types and flags the floor server reads or writes.
DATA, HEADERS, SETTINGS, PING, WINDOW_UPDATE = 0x0, 0x1, 0x4, 0x6, 0x8
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name (no Huffman)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def serve_h2_gevent(port: int, answers: dict[str, Callable[[bytes], bytes]] | None = None) -> None:
    """HTTP/2 by hand: a greenlet reads a connection's frames and starts a greenlet per
    call; answers are sent by one writer per connection, as many as are ready per send."""
    from gevent import monkey

    monkey.patch_all()
    import gevent
    import hpack
    from gevent.event import Event
    from gevent.server import StreamServer

    answers = answers or _answers()
    head = b"\x88" + _literal(b"content-type", b"application/grpc")  # 0x88: :status 200
    trailers = _literal(b"grpc-status", b"0")

    def handle(sock: socket.socket, _address: object) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while len(buf) < len(PREFACE):
            data = sock.recv(65536)
            if not data:
                return
            buf += data
        if not buf.startswith(PREFACE):
            return
        buf = buf[len(PREFACE) :]
        outbox: list[bytes] = [_frame(SETTINGS, 0, 0)]
        ready = Event()

        def send(*frames: bytes) -> None:
            outbox.extend(frames)
            ready.set()

        def writer() -> None:
            while True:
                ready.wait()
                ready.clear()
                out = b"".join(outbox)
                outbox.clear()
                sock.sendall(out)

        def answer(stream: int, method: str, body: bytes) -> None:
            global ANSWERED
            ANSWERED += method == "ModelInfer"
            reply = answers[method](body[5:])
            message = b"\x00" + struct.pack(">I", len(reply)) + reply
            send(
                _frame(HEADERS, END_HEADERS, stream, head),
                _frame(DATA, 0, stream, message),
                _frame(HEADERS, END_HEADERS | END_STREAM, stream, trailers),
            )

        decoder = hpack.Decoder()
        methods: dict[bytes, str] = {}  # header block -> method: a client repeats its blocks
        calls: dict[int, list] = {}  # stream -> [method, body]
        writing = gevent.spawn(writer)
        ready.set()
        try:
            while True:
                consumed = 0
                while len(buf) >= 9:
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    kind, flags = buf[3], buf[4]
                    stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    payload, buf = buf[9 : 9 + length], buf[9 + length :]
                    if kind == HEADERS:
                        if flags & PADDED:
                            payload = payload[1 : len(payload) - payload[0]]
                        if flags & PRIORITY:
                            payload = payload[5:]
                        method = methods.get(payload)
                        if method is None:
                            path = dict(decoder.decode(payload))[":path"]
                            method = methods[payload] = path.removeprefix(SERVICE)
                        calls[stream] = [method, b""]
                    elif kind == DATA:
                        consumed += length
                        if flags & PADDED:
                            payload = payload[1 : len(payload) - payload[0]]
                        call = calls[stream]
                        call[1] += payload
                        if flags & END_STREAM:
                            del calls[stream]
                            gevent.spawn(answer, stream, *call)
                    elif kind in (SETTINGS, PING) and not flags & ACK:
                        send(_frame(kind, ACK, 0, payload if kind == PING else b""))
                if consumed:
                    send(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", consumed)))
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
        finally:
            writing.kill()

    _count_on_exit()
    StreamServer(("127.0.0.1", port), handle).serve_forever()


def serve_h2_dataplane(port: int, repository: str, redis_url: str) -> None:
    """The hand-framed transport over conch's own gRPC service and data plane: every
    call answered by ``InferenceService``, as ``conch grpc`` answers it."""
    from gevent import monkey

    monkey.patch_all()  # before redis is imported, as the gateway does
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    from conch.core.restricted_apis import RestrictedApis
    from conch.frontend.composition import build_dataplane
    from conch.frontend.grpc.service import InferenceService
    from conch.settings import Settings

    settings = Settings(model_repository=Path(repository), redis_url=redis_url)
    service = InferenceService(
        build_dataplane(settings), RestrictedApis(), 1, grpc.Compression.NoCompression
    )

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
    serve_h2_gevent(port, {name: unary(name) for name in names})


SERVE = {
    "grpcio": serve_grpcio,
    "grpcio-aio": serve_grpcio_aio,
    "h2-gevent": serve_h2_gevent,
    "h2-dataplane": serve_h2_dataplane,
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


def measure(pa: str, url: str, protocol: str, args: argparse.Namespace, csv: Path) -> float:
    """Run perf_analyzer to the end; its last window's infer/s."""
    ran = perf_analyzer.run(
        pa,
        [
            *("-m", "mlp", "-u", url, "-i", protocol),
            *("--concurrency-range", str(args.concurrency)),
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
    return float(ran.rows[-1]["Inferences/Second"])


def floors(pa: str, args: argparse.Namespace, out_dir: Path) -> None:
    """Each transport answering at once: its CPU per call, counted by the server."""
    print("| round | server | infer/s | server CPU ms/req | perf_analyzer CPU ms/req |")
    print("|---|---|---|---|---|")
    for n in range(1, args.rounds + 1):
        for kind in args.servers.split(","):
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
                rate = measure(pa, url, "grpc", args, out_dir / f"floor-{kind}.csv")
                cpu1, pa1 = procs.cpu_seconds(pids=[server.pid])[server.pid], _children_cpu()
            finally:
                server.terminate()
                answered = int((server.communicate(timeout=10)[0] or "0").split()[-1])
            print(
                f"| {n} | {kind} | {rate:,.0f} | {1000 * (cpu1 - cpu0) / answered:.3f} "
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
    """The whole path: conch's HTTP gateway, ``conch grpc`` (grpcio) and the hand-framed
    transport over conch's gRPC service, over one private Redis and one worker."""
    from conch.devtools import redis_server

    import models

    repo = models.build_repository()
    private = redis_server.start_private(unix_socket=True)
    try:
        with procs.Group(out_dir / "logs") as group:
            group.guard("redis-server", private.process.pid)
            common = ["--model-repository", str(repo), "--redis-url", private.url]
            worker = group.start("worker", conch("worker", *common))
            http, grpc_port, h2_port = _free_port(), _free_port(), _free_port()
            local = "127.0.0.1"
            commands = {
                "conch HTTP (gevent)": (
                    "gateway",
                    conch(
                        "gateway",
                        *common,
                        "--http-address",
                        local,
                        "--http-port",
                        str(http),
                        "--allow-metrics",
                        "false",
                    ),
                    http,
                    "http",
                ),
                "conch gRPC (grpcio)": (
                    "grpc",
                    conch(
                        "grpc",
                        *common,
                        "--grpc-address",
                        local,
                        "--grpc-port",
                        str(grpc_port),
                    ),
                    grpc_port,
                    "grpc",
                ),
                "gRPC by hand (gevent)": (
                    "h2-dataplane",
                    [
                        sys.executable,
                        __file__,
                        "serve",
                        "h2-dataplane",
                        str(h2_port),
                        str(repo),
                        private.url,
                    ],
                    h2_port,
                    "grpc",
                ),
            }
            frontends = {
                name: (group.start(tag, cmd), f"{local}:{port}", protocol)
                for name, (tag, cmd, port, protocol) in commands.items()
            }

            def ready() -> bool:
                try:
                    _successes(f"127.0.0.1:{http}")
                except OSError:
                    return False
                return _listening(grpc_port) and _listening(h2_port)

            procs.wait_until(ready, 180, group, "the frontends")
            print(
                "| round | frontend | infer/s | frontend | worker | redis | perf_analyzer "
                "| total CPU ms/req |"
            )
            print("|---|---|---|---|---|---|---|---|")
            pids = {"worker": worker.pid, "redis": private.process.pid}
            for n in range(1, args.rounds + 1):
                for name, (child, url, protocol) in frontends.items():
                    group.check_alive()
                    ids = {**pids, "frontend": child.pid}
                    count0 = _successes(f"127.0.0.1:{http}")
                    # A frontend's session holds its processes (gunicorn's workers too).
                    cpu0 = procs.cpu_seconds(pids=[pids["redis"]], sessions=[child.pid, worker.pid])
                    pa0 = _children_cpu()
                    csv = out_dir / f"dataplane-{protocol}-{child.name}.csv"
                    rate = measure(pa, url, protocol, args, csv)
                    cpu1 = procs.cpu_seconds(pids=[pids["redis"]], sessions=[child.pid, worker.pid])
                    served = _successes(f"127.0.0.1:{http}") - count0
                    ms = {k: 1000 * (cpu1[pid] - cpu0[pid]) / served for k, pid in ids.items()}
                    ms["perf_analyzer"] = 1000 * (_children_cpu() - pa0) / served
                    cells = " | ".join(
                        f"{ms[k]:.3f}" for k in ("frontend", "worker", "redis", "perf_analyzer")
                    )
                    print(
                        f"| {n} | {name} | {rate:,.0f} | {cells} | {sum(ms.values()):.3f} |",
                        flush=True,
                    )
    finally:
        private.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        SERVE[argv[1]](int(argv[2]), *argv[3:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--window-ms", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--servers", default=",".join(SERVERS), help=f"from {', '.join(SERVERS)}")
    p.add_argument(
        "--dataplane",
        action="store_true",
        help="the whole path instead: HTTP, conch grpc and the hand-framed transport over "
        "conch's data plane, a private Redis and a worker",
    )
    args = p.parse_args(argv)
    pa = perf_analyzer.binary()
    out_dir = BENCH.parent / ".cache" / "bench" / "grpc-floor"
    out_dir.mkdir(parents=True, exist_ok=True)
    (dataplane if args.dataplane else floors)(pa, args, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
