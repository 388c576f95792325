#!/usr/bin/env python3
"""The infer route of bench/http_cores.py on an asyncio HTTP core: granian (RSGI) or
uvicorn with httptools and uvloop (ASGI). A prototype for issue 42, point 1: it measures
what carrying a request costs on each core, and is not part of conch.

    granian --interface rsgi --http 1 --loop uvloop http_core_app:rsgi   # from bench/
    python bench/http_core_app.py uvicorn PORT
    python bench/http_core_app.py gevent PORT       # canned answers only

Both read ``CORE_REDIS_URL`` and ``CORE_REPOSITORY`` from the environment. Each infer
call runs conch's own ``fast_path.serve_infer``, the same code the gevent gateway runs
(the restricted-API check, the size limit, decoding, validation, ``calls.build``, the
response's encoding), inside a greenlet. Its one blocking call, the data plane's
``dispatcher.call``, is answered on the event loop instead (``LoopDispatcher``): the
message goes through conch's ``Publisher``'s own group commit (a subclass that sends its
pipeline on an asyncio connection), and the reply comes from a listener task popping this
process's reply list, as the gateway's reply listener does. So the three cores run the
same request Python; what differs is the HTTP parsing and writing, the event loop, and
how the wait for the reply is carried (two greenlet switches a call here).

With ``CORE_CANNED=1`` they answer every call at once with a canned infer answer of the
size the stand-in's would be, and so does the third form, a gevent server reading each
call as the gateway's own keep-alive loop does: each core's own cost per call, with no
conch code and no Redis.

Left out, as the measurement does not reach them: abandonment, routes other than infer
(a 404 here), Redis outages, the NOSCRIPT retry (the script is loaded at start).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import greenlet
import hiredis
import redis

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "platform"))

from conch.core.errors import Unavailable  # noqa: E402
from conch.frontend import composition  # noqa: E402
from conch.frontend.dataplane import DataPlane  # noqa: E402
from conch.frontend.http import fast_path  # noqa: E402
from conch.settings import Settings  # noqa: E402
from conch.wire import broker  # noqa: E402
from conch.wire.messages import REPLY_PREFIX, InferMessage, Reply  # noqa: E402

LISTEN_BLOCK_S = 1  # the reply listener's BLMPOP timeout, as the gateway's
CANNED = os.environ.get("CORE_CANNED") == "1"
_CANNED_TENSOR = 1024  # bytes: bench/http_cores.py's calls carry 1 KiB


def _canned() -> fast_path.Answer:
    """An infer answer of one FP32 output of ``_CANNED_TENSOR`` bytes, binary."""
    header = (
        b'{"model_name":"drain_b64","model_version":"1","outputs":[{"name":"OUTPUT0",'
        b'"datatype":"FP32","shape":[1,256],"parameters":{"binary_data_size":1024}}]}'
    )
    body = header + bytes(_CANNED_TENSOR)
    headers = [
        ("Content-Type", "application/octet-stream"),
        ("Inference-Header-Content-Length", str(len(header))),
        ("Content-Length", str(len(body))),
    ]
    return 200, headers, body


CANNED_ANSWER = _canned()


# --------------------------------------------------------------------------- Redis on the loop


class Link(asyncio.Protocol):
    """One Redis connection on the event loop: each ``pipeline`` one write, its replies
    read by hiredis and handed back in order (errors as values, as ``RedisLink``'s)."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader(replyError=redis.ResponseError)
        self.waiting: deque[tuple[int, list[Any], asyncio.Future]] = deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while self.waiting:
            reply = self.reader.gets()
            if reply is False:
                return
            count, got, future = self.waiting[0]
            got.append(reply)
            if len(got) == count:
                self.waiting.popleft()
                future.set_result(got)

    def connection_lost(self, exc: Exception | None) -> None:
        for _count, _got, future in self.waiting:
            future.set_exception(redis.ConnectionError(f"Redis closed the connection: {exc}"))

    async def pipeline(self, commands: list[tuple]) -> list[Any]:
        assert self.transport is not None
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((len(commands), [], future))
        self.transport.write(b"".join([hiredis.pack_command(c) for c in commands]))
        return await future


async def open_link(url: str) -> Link:
    loop = asyncio.get_running_loop()
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        _, link = await loop.create_unix_connection(Link, parsed.path)
    else:
        _, link = await loop.create_connection(Link, parsed.hostname, parsed.port or 6379)
    return link


class LoopPublisher(broker.Publisher):
    """conch's ``Publisher`` whose flush awaits its pipeline on the event loop: the same
    messages (single or bundled, ``Publisher._messages``) and the same group commit
    (whoever finds no flush under way lets the loop run once, then sends every request
    queued meanwhile in one round trip)."""

    def __init__(self, client: redis.Redis, link: Link) -> None:
        super().__init__(client)
        client.script_load(self._script.script)
        self.link = link
        self.futures: dict[int, asyncio.Future] = {}  # by id(_Pending)
        self.flusher: asyncio.Future | None = None  # the flush under way, held till it ends

    async def publish_message(
        self, msg: InferMessage, max_queue_size: int, bundling: broker.Bundling | None
    ) -> bool:
        """``Publisher.publish`` of ``msg`` (to its ``reply_to``), awaited: False when its
        bounded queue is full."""
        queue, reply_to = broker.queue_name(msg.model), msg.reply_to
        if max_queue_size:
            bundling = None
        payload = msg.to_dict()
        entry = broker._Pending(
            queue, payload, msg.id, msg.priority, reply_to, max_queue_size, bundling
        )
        if bundling is None:
            entry.raw = broker.envelope(
                payload, task_id=msg.id, queue=queue, priority=msg.priority, reply_to=reply_to
            )
        future = asyncio.get_running_loop().create_future()
        self.futures[id(entry)] = future
        self._queue.append(entry)
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._start_flush)
        return await future

    def _start_flush(self) -> None:
        self.flusher = asyncio.ensure_future(self._flush_loop())

    async def _flush_loop(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            messages = self._messages(batch)
            commands = [
                ("EVALSHA", self._script.sha, len(m.keys), *m.keys, *m.args) for m in messages
            ]
            try:
                replies = await self.link.pipeline(commands)
                for message, r in zip(messages, replies, strict=True):
                    for e in message.entries:
                        self.futures.pop(id(e)).set_result(
                            not isinstance(r, redis.ResponseError) and bool(r)
                        )
            except Exception as exc:
                for e in batch:
                    future = self.futures.pop(id(e), None)
                    if future is not None and not future.done():
                        future.set_exception(exc)
        self._flushing = False


class LoopDispatcher:
    """The data plane's dispatcher on the event loop: ``call`` is the one the data plane
    makes (``Dispatcher.call``'s arguments), from inside a greenlet, which it suspends
    while the loop publishes and waits (``await_only``)."""

    def __init__(self, client: redis.Redis, publisher: LoopPublisher, replies: Link) -> None:
        self.client = client
        self.publisher = publisher
        self.replies = replies
        self.reply_key = f"{REPLY_PREFIX}http-core.{os.getpid()}"
        self.pending: dict[str, asyncio.Future] = {}

    def call(self, msg: InferMessage, *, max_queue_size: int = 0, bundling=None, **_: Any) -> Reply:
        return await_only(self._call(msg, max_queue_size, bundling))

    async def _call(self, msg: InferMessage, max_queue_size: int, bundling) -> Reply:
        loop = asyncio.get_running_loop()
        msg.reply_to = self.reply_key
        future = loop.create_future()
        self.pending[msg.id] = future
        timer = None
        if msg.deadline:  # the gateway's wait ends at the deadline too
            timer = loop.call_at(
                loop.time() + max(0.0, msg.deadline - time.time()), _expire, future, msg.model
            )
        try:
            queued = await self.publisher.publish_message(msg, max_queue_size, bundling)
            if not queued:
                raise Unavailable(f"Exceeds maximum queue size: model '{msg.model}'")
            return await future
        finally:
            self.pending.pop(msg.id, None)
            if timer is not None:
                timer.cancel()

    async def listen(self) -> None:
        """Pop this process's replies in bulk and wake each one's waiter."""
        while True:
            got = (
                await self.replies.pipeline(
                    [("BLMPOP", LISTEN_BLOCK_S, 1, self.reply_key, "LEFT", "COUNT", 256)]
                )
            )[0]
            if not got or isinstance(got, Exception):
                continue
            for raw in got[1]:
                reply = Reply.unpack(raw)
                future = self.pending.get(reply.id)
                if future is not None and not future.done():
                    future.set_result(reply)

    def close(self) -> None:
        pass


def _expire(future: asyncio.Future, model: str) -> None:
    if not future.done():
        future.set_exception(Unavailable(f"Request timeout expired for model '{model}'"))


# --------------------------------------------------------------------------- greenlets


def await_only(awaitable: Awaitable) -> Any:
    """From inside ``in_greenlet``'s greenlet: have the loop await ``awaitable``, and
    return what it gives (or raise what it raises)."""
    return greenlet.getcurrent().parent.switch(awaitable)


async def in_greenlet(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` run in a greenlet of its own; each ``await_only`` in it is
    awaited here, on the loop, while the greenlet waits."""
    g = greenlet.greenlet(fn)
    got = g.switch(*args, **kwargs)
    while not g.dead:
        try:
            result = await got
        except BaseException as exc:  # handed to the greenlet that awaited it
            got = g.throw(exc)
        else:
            got = g.switch(result)
    return got


# --------------------------------------------------------------------------- the route


class Core:
    """What each process serves with: conch's data plane, its dispatcher on the loop."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.listener: asyncio.Future | None = None  # the reply listener's task

    @classmethod
    async def open(cls) -> Core:
        url, repository = os.environ["CORE_REDIS_URL"], os.environ["CORE_REPOSITORY"]
        plane = composition.build_dataplane(
            Settings(model_repository=Path(repository), redis_url=url)
        )
        publisher = LoopPublisher(plane.dispatcher.client, await open_link(url))
        dispatcher = LoopDispatcher(plane.dispatcher.client, publisher, await open_link(url))
        plane.dispatcher = dispatcher  # type: ignore[assignment]
        core = cls(plane)
        core.listener = asyncio.ensure_future(dispatcher.listen())
        return core

    async def infer(
        self, method: str, path: str, body: bytes, header: fast_path.Header
    ) -> fast_path.Answer:
        call = fast_path.infer_call(method, path)
        if call is None:
            return 404, [("Content-Length", "0")], b""
        return await in_greenlet(
            fast_path.serve_infer,
            self.plane,
            call,
            length=len(body),
            read=lambda _n: body,
            header=header,
        )


class _Opened:
    """The process's ``Core``, opened by the first request that needs it."""

    def __init__(self) -> None:
        self.core: Core | None = None
        self.opening: asyncio.Future | None = None

    async def get(self) -> Core:
        if self.core is not None:
            return self.core
        if self.opening is None:
            self.opening = asyncio.ensure_future(Core.open())
        self.core = await asyncio.shield(self.opening)
        return self.core


_opened = _Opened()


async def rsgi(scope: Any, proto: Any) -> None:
    """granian's RSGI application."""
    if scope.proto != "http":
        return
    body = await proto()
    if CANNED:
        proto.response_bytes(*CANNED_ANSWER)
        return
    core = await _opened.get()
    headers = scope.headers
    status, out, payload = await core.infer(
        scope.method, scope.path, body, lambda name: headers.get(name.lower())
    )
    proto.response_bytes(status, out, payload)


async def asgi(scope: dict, receive: Callable, send: Callable) -> None:
    """uvicorn's ASGI application."""
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if CANNED:
        status, out, payload = CANNED_ANSWER
    else:
        core = await _opened.get()
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        status, out, payload = await core.infer(
            scope["method"], scope["path"], body, lambda name: headers.get(name.lower())
        )
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def gevent_canned(port: int) -> None:
    """Canned answers on gevent, each call read as the gateway's own loop reads it
    (``GatewayWorker._connection``: the head found, ``infer_head.parse``, the body read
    whole) and answered in one write."""
    from gevent import monkey

    monkey.patch_all()
    from gevent.server import StreamServer

    from conch.frontend.http import infer_head

    status, headers, payload = CANNED_ANSWER
    fields = "".join(f"{k}: {v}\r\n" for k, v in headers)
    answer = f"HTTP/1.1 {fast_path.status_line(status)}\r\n{fields}\r\n".encode() + payload

    def connection(sock: Any, _addr: Any) -> None:
        buf = b""
        while True:
            end = buf.find(b"\r\n\r\n")
            while end < 0:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
                end = buf.find(b"\r\n\r\n")
            head = infer_head.parse(buf, end)
            if head is None:
                return
            need = end + 4 + head.length
            while len(buf) < need:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            buf = buf[need:]
            sock.sendall(answer)

    StreamServer(("127.0.0.1", port), connection).serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("uvicorn", "gevent"):
        print("usage: http_core_app.py uvicorn|gevent PORT", file=sys.stderr)
        return 2
    if argv[0] == "gevent":
        gevent_canned(int(argv[1]))
        return 0
    import uvicorn

    uvicorn.run(
        asgi,
        host="127.0.0.1",
        port=int(argv[1]),
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
