#!/usr/bin/env python3
"""What a gRPC transport costs by itself: perf_analyzer -i grpc against servers that answer
every call at once, with no Redis, worker or data plane behind them.

    .venv/bin/python bench/grpc_floor.py [--concurrency 16] [--window-ms 2000] [--rounds 2]

Each server answers ModelInfer with a canned output of the benchmark's ``mlp`` shape (and
the metadata and config perf_analyzer asks for first), so its CPU per request is the
transport's floor, what any frontend built on it pays before doing any work:

- ``grpcio``: grpcio's synchronous server and its thread pool, what ``conch grpc`` runs;
- ``grpcio-aio``: grpcio's asyncio server;
- ``h2-gevent``: HTTP/2 framed by hand on a gevent socket, as the HTTP gateway's
  keep-alive loop reads HTTP/1.1 (HPACK decoding by the ``hpack`` package, response
  header blocks written once). It is a measuring device, not a server: no flow control
  past the connection window, no TLS, no errors, one header frame per request.

It prints infer/s and CPU ms per request of the server and of perf_analyzer, round by
round, the servers taking turns so that a busy host weighs on all of them alike.
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
import time
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


def serve_h2_gevent(port: int) -> None:
    from gevent import monkey

    monkey.patch_all()
    import hpack
    from gevent.server import StreamServer

    answers = _answers()
    head = b"\x88" + _literal(b"content-type", b"application/grpc")  # 0x88: :status 200
    trailers = _literal(b"grpc-status", b"0")

    def handle(sock: socket.socket, _address: object) -> None:
        global ANSWERED
        buf = b""
        while len(buf) < len(PREFACE):
            data = sock.recv(65536)
            if not data:
                return
            buf += data
        if not buf.startswith(PREFACE):
            return
        buf = buf[len(PREFACE) :]
        sock.sendall(_frame(SETTINGS, 0, 0))
        decoder = hpack.Decoder()
        methods: dict[bytes, str] = {}  # header block -> method: a client repeats its blocks
        calls: dict[int, list] = {}  # stream -> [method, body]
        while True:
            out, consumed = [], 0
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
                        ANSWERED += call[0] == "ModelInfer"
                        body = answers[call[0]](call[1][5:])
                        message = b"\x00" + struct.pack(">I", len(body)) + body
                        out += [
                            _frame(HEADERS, END_HEADERS, stream, head),
                            _frame(DATA, 0, stream, message),
                            _frame(HEADERS, END_HEADERS | END_STREAM, stream, trailers),
                        ]
                elif kind in (SETTINGS, PING) and not flags & ACK:
                    out.append(_frame(kind, ACK, 0, payload if kind == PING else b""))
            if consumed:
                out.append(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", consumed)))
            if out:
                sock.sendall(b"".join(out))
            data = sock.recv(65536)
            if not data:
                return
            buf += data

    _count_on_exit()
    StreamServer(("127.0.0.1", port), handle).serve_forever()


SERVE = {"grpcio": serve_grpcio, "grpcio-aio": serve_grpcio_aio, "h2-gevent": serve_h2_gevent}


# --------------------------------------------------------------------------- the driver


def _cpu_seconds(pid: int) -> float:
    sys.path.insert(0, str(BENCH))
    import procs

    return procs.cpu_seconds(pids=[pid])[pid]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port} after {timeout_s:.0f} s")


def measure(kind: str, pa: str, concurrency: int, window_ms: int, out_dir: Path) -> dict:
    import csv

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "serve", kind, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_port(port)
        csv_path = out_dir / f"floor-{kind}-c{concurrency}.csv"
        cpu0, pa0 = _cpu_seconds(server.pid), _children_cpu()
        subprocess.run(
            [
                pa,
                *("-m", "mlp", "-u", f"127.0.0.1:{port}", "-i", "grpc"),
                *("--concurrency-range", str(concurrency)),
                *("--measurement-mode", "time_windows", "--measurement-interval", str(window_ms)),
                *("--stability-percentage", "1000", "--max-trials", "3", "-f", str(csv_path)),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=window_ms / 1000 * 5 + 60,
        )
        cpu1, pa1 = _cpu_seconds(server.pid), _children_cpu()
    finally:
        server.terminate()
        answered = int((server.communicate(timeout=10)[0] or "0").split()[-1])
    with csv_path.open(newline="") as f:
        rate = float(list(csv.DictReader(f))[-1]["Inferences/Second"])
    return {
        "infer_per_s": rate,
        "server_ms": 1000 * (cpu1 - cpu0) / answered,
        "pa_ms": 1000 * (pa1 - pa0) / answered,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        SERVE[argv[1]](int(argv[2]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--window-ms", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--servers", default=",".join(SERVERS), help=f"from {', '.join(SERVERS)}")
    args = p.parse_args(argv)
    pa = subprocess.run(
        [str(BENCH / "perf-analyzer-setup")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.split()[-1]
    out_dir = BENCH.parent / ".cache" / "bench" / "floor"
    out_dir.mkdir(parents=True, exist_ok=True)
    print("| round | server | infer/s | server CPU ms/req | perf_analyzer CPU ms/req |")
    print("|---|---|---|---|---|")
    for n in range(1, args.rounds + 1):
        for kind in args.servers.split(","):
            m = measure(kind, pa, args.concurrency, args.window_ms, out_dir)
            print(
                f"| {n} | {kind} | {m['infer_per_s']:,.0f} | {m['server_ms']:.3f} "
                f"| {m['pa_ms']:.3f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
