"""One Redis connection owned by one loop, and commands sent on it without redis-py's
per-command machinery.

redis-py's pool checks every connection it hands out for stray data with a zero-timeout
poll; under gevent that poll is a hub round trip, which costs more than the command it
guards. And each command it runs goes through argument packing, response callbacks and
(redis-py 8) observability hooks in Python, nine commands per request on the worker's hot
path (bench/README.md, "Measurements the code cites"). A ``RedisLink`` owns one
connection (redis-py still opens it: URL, Unix socket, AUTH, SELECT, TLS), packs each
command with hiredis in C, writes a round trip's commands in one send and reads their
replies with a hiredis reader of its own.

``Commands`` is what a round trip is put together in: it has redis-py's command methods
(``rpush``, ``hdel``, ``eval``...) with their exact argument rules, but they only record.

A blocking command (BLPOP) names how long Redis may hold it (``wait_s``): the socket's
read timeout is stretched past that for the round trip. redis-py 8 gives every
connection a 5 s read timeout by default, which would otherwise cut a longer wait short.
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Sequence
from typing import Any

import hiredis
import redis
from redis.commands.core import CoreCommands


class Commands(CoreCommands):
    """Commands for one round trip, queued by redis-py's own command methods."""

    def __init__(self) -> None:
        self.queued: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any, **_options: Any) -> None:
        self.queued.append(args)

    def __len__(self) -> int:
        return len(self.queued)


# What the functions that add commands to a round trip take: a redis-py pipeline, or a
# ``Commands`` a ``RedisLink`` sends.
CommandQueue = redis.client.Pipeline | Commands

# How much longer than a blocking command's own timeout its reply may take to arrive:
# Redis times blocked clients out on its clock tick (100 ms at the default ``hz 10``),
# and a busy host adds its own delay.
BLOCKING_GRACE_S = 2.0


# A link idle this long checks that Redis has not closed its connection meanwhile (a
# restart takes longer): commands sent on a dead connection would fail for nothing.
IDLE_CHECK_S = 0.1


class RedisLink:
    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._conn: Any = None
        self._reader: Any = None
        self._pid = 0
        self._used_at = 0.0  # monotonic time of the last round trip that got its replies

    def _connection(self) -> Any:
        if (
            self._conn is not None
            and self._pid == os.getpid()
            and time.monotonic() - self._used_at > IDLE_CHECK_S
            and _closed(self._conn._sock)
        ):
            self._conn.disconnect()
            self._conn = None
        if self._conn is None or self._pid != os.getpid():  # never share one across a fork
            # The pool's settings, outside its accounting: a link owns its connection for
            # good, and the pool never learns when one closes, so reconnects through
            # make_connection() would use up max_connections (100 by default) for ever.
            conn = self._pool.connection_class(**self._pool.connection_kwargs)
            conn.connect()
            self._conn, self._pid = conn, os.getpid()
            self._reader = hiredis.Reader(replyError=redis.ResponseError)
        return self._conn

    def call(self, *args: Any, wait_s: float = 0.0) -> Any:
        """One command's reply; ``wait_s``: how long Redis may block it (BLPOP's timeout)."""
        return self.pipeline([args], wait_s=wait_s)[0]

    def run(self, commands: Commands) -> list[Any]:
        """Send what ``commands`` queued; the replies, in order (errors as values)."""
        return self.pipeline(commands.queued)

    def pipeline(self, commands: Sequence[Sequence[Any]], *, wait_s: float = 0.0) -> list[Any]:
        """Send the commands in one write; error replies come back as ResponseError values
        (NoScriptError for a script Redis does not hold). A Redis that cannot be reached,
        or that is still loading its dataset, raises ConnectionError (BusyLoadingError).

        ``wait_s`` is the longest a blocking command among them may be held by Redis; the
        replies are waited for that long and ``BLOCKING_GRACE_S`` more, whatever read
        timeout the connection has.
        """
        conn = self._connection()
        sock = conn._sock
        limit = conn.socket_timeout
        stretched = wait_s > 0 and limit is not None and limit < wait_s + BLOCKING_GRACE_S
        if stretched:
            sock.settimeout(wait_s + BLOCKING_GRACE_S)
        try:
            sock.sendall(b"".join([hiredis.pack_command(tuple(c)) for c in commands]))
            out: list[Any] = []
            reader = self._reader
            while len(out) < len(commands):
                reply = reader.gets()
                if reply is False:
                    data = sock.recv(65536)
                    if not data:
                        raise redis.ConnectionError("Redis closed the connection")
                    reader.feed(data)
                    continue
                if isinstance(reply, redis.ResponseError):
                    if str(reply).startswith("NOSCRIPT"):
                        reply = redis.exceptions.NoScriptError(str(reply))
                    elif str(reply).startswith("LOADING"):
                        # Restarted and reading its dataset back: Redis runs no command yet.
                        raise redis.BusyLoadingError(str(reply))
                out.append(reply)
            self._used_at = time.monotonic()
            if stretched:
                sock.settimeout(limit)
            return out
        except BaseException as exc:
            conn.disconnect()  # unknown state: the next call reconnects
            self._conn = None
            if isinstance(exc, OSError):
                raise redis.ConnectionError(f"Redis connection lost: {exc}") from exc
            raise


class PendingReply:
    """One blocking command kept waiting on a connection of its own: ``send`` writes it,
    ``receive`` waits for its reply as long as the caller likes (not as long as Redis
    holds the command), and leaves it pending when that time passes first.

    Redis times a blocked command out on its clock tick (100 ms at the default ``hz 10``),
    so a wait shorter than a few ticks cannot be a BLPOP's timeout: it is this, a BLPOP
    that Redis may hold far longer, and a local wait on its socket. ``client_id`` names the
    connection, for a ``CLIENT UNBLOCK`` sent on another one (the waiter gave up; a BLPOP
    left pending would take what another waiter should get).
    """

    def __init__(self, client: redis.Redis, name: str) -> None:
        self._link = RedisLink(client)
        self._conn: Any = None  # the connection client_id names
        self.name = name  # the connection's name in Redis (CLIENT LIST), no spaces
        self.client_id = 0
        self.pending = False  # a command was sent and its reply not yet read

    def send(self, command: Sequence[Any]) -> None:
        """Write ``command``; its reply is ``receive``'s."""
        link = self._link
        conn = link._connection()
        try:
            if conn is not self._conn:  # a new connection: named, its id read, one round trip
                got = link.pipeline([("CLIENT", "SETNAME", self.name), ("CLIENT", "ID")])
                self.client_id, self._conn = int(got[1]), conn
            conn._sock.sendall(hiredis.pack_command(tuple(command)))
        except BaseException as exc:
            self._lose(exc)
        self.pending = True

    def receive(self, timeout: float) -> tuple[bool, Any]:
        """(True, the reply) once it comes within ``timeout`` seconds, else (False, None)
        with the command still pending. Errors come back as ResponseError values."""
        link = self._link
        try:
            reply = link._reader.gets()
            if reply is False:
                sock = self._conn._sock
                buffered = getattr(sock, "pending", None)  # TLS: bytes read and decrypted
                ready = buffered is not None and buffered() > 0
                if not ready and not select.select([sock], [], [], max(0.0, timeout))[0]:
                    return False, None
                data = sock.recv(65536)
                if not data:
                    raise redis.ConnectionError("Redis closed the connection")
                link._reader.feed(data)
                reply = link._reader.gets()
                while reply is False:  # the rest of a reply split across reads
                    data = sock.recv(65536)
                    if not data:
                        raise redis.ConnectionError("Redis closed the connection")
                    link._reader.feed(data)
                    reply = link._reader.gets()
        except BaseException as exc:
            self._lose(exc)
        self.pending = False
        link._used_at = time.monotonic()
        return True, reply

    def _lose(self, exc: BaseException) -> None:
        """The connection is in an unknown state: drop it, the next send reconnects."""
        self.pending = False
        self._conn = None
        if self._link._conn is not None:
            self._link._conn.disconnect()
            self._link._conn = None
        if isinstance(exc, OSError):
            raise redis.ConnectionError(f"Redis connection lost: {exc}") from exc
        raise exc


def _closed(sock: Any) -> bool:
    """Whether the peer has closed ``sock`` (a peek that never blocks, nor yields to gevent)."""
    timeout = sock.gettimeout()
    sock.settimeout(0.0)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False  # open, nothing to read: as an idle connection should be
    except OSError:
        return True
    except ValueError:  # TLS sockets take no flags: the next round trip will tell
        return False
    finally:
        sock.settimeout(timeout)
