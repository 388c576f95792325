"""Triton's system shared-memory extension in the frontends: regions a client registers,
and infer inputs read from them and outputs written into them.

A client creates a POSIX shared-memory object (``shm_open``: ``/dev/shm/<key>``),
registers a *region* of it under a name (``key``, ``offset``, ``byte_size``), then names
the region in an input's or output's parameters (``shared_memory_region``,
``shared_memory_byte_size``, ``shared_memory_offset``) instead of sending the bytes. This
module is protocol-neutral: the HTTP routes and the gRPC service call ``register``,
``unregister`` and ``status``; the codecs call ``input_bytes`` while decoding and
``output_slot`` for an output to be written, then ``OutputSlot.write`` with the answer.

Where the registrations live. A gateway is several gunicorn processes, and the gRPC
server another: the process that takes an infer call is seldom the one that took the
register call. So a registration is kept in Redis, in one hash per host
(``wire.keys.SHM_REGIONS_PREFIX`` + the host name: ``/dev/shm`` is the host's, so a
region means nothing to a gateway on another machine): name -> JSON key, offset,
byte_size. A process maps a region when it first needs it and keeps the mapping while
the registration it read stays the same; each use reads the registration again (one
HMGET for all the regions a call names), so a region unregistered or registered anew
elsewhere is never used stale. ``unregister`` removes it from the hash at once (for
every process) and unmaps this process's mapping; another process drops its own the
next time the name comes up.

Where zero-copy ends: at the frontend. An input's bytes are copied out of the region
into the request, which crosses Redis to a worker like any other; an output's bytes come
back the same way and are copied into its region. What the client saves is the HTTP or
gRPC body (and its encoding), not the trip through Redis.

What is checked, each a 400 (INVALID_ARGUMENT) and never a crash: a key is a POSIX
shared-memory name (one leading ``/``, then up to 255 safe characters, no other ``/``,
not ``.`` or ``..``), opened with no symbolic link followed and only as a regular file;
the region lies inside the object; an input's or output's offset and size lie inside
the region; an input's size is its tensor's; an output's region holds its answer.

CUDA shared memory is not built: registering a CUDA region is refused with the reason
(Triton's CPU-only build refuses the same way, INVALID_ARG); its status lists no region
and unregistering finds nothing to do, as there, so that clients that clear both kinds
(perf_analyzer does) work.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import socket
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conch.core import tensors
from conch.core.errors import AlreadyExists, Forbidden, InvalidArgument, NotFound
from conch.core.inference import RequestedOutput
from conch.wire import keys

SHM_ROOT = Path("/dev/shm")  # where Linux keeps POSIX shared-memory objects
FLAG = "--allow-client-shm"
# Triton's parameter names, on an input or a requested output.
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
PARAMETERS = frozenset({REGION, BYTE_SIZE, OFFSET})

MAX_KEY_CHARS = 255  # NAME_MAX: a file name in /dev/shm
MAX_NAME_CHARS = 1024  # a region's name (Triton sets none; a bound keeps Redis tidy)
_KEY = re.compile(rf"/[A-Za-z0-9_.:+@=,~-]{{1,{MAX_KEY_CHARS}}}")

DISABLED = (
    f"client shared memory is disabled: start the server with {FLAG}=true to register "
    "regions and to give inputs and outputs in them"
)
CUDA_REFUSED = (
    "CUDA shared memory is not supported by conch (not yet built and tested on a GPU); "
    "use system shared memory"
)


def check_key(key: Any) -> str:
    """``key`` if it is a POSIX shared-memory name conch opens, else a 400 saying why."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument("shared memory key must be a non-empty string")
    if not _KEY.fullmatch(key) or key in ("/.", "/.."):
        raise InvalidArgument(
            f"invalid shared memory key '{key[: MAX_KEY_CHARS + 2]}': expected '/' followed "
            f"by 1 to {MAX_KEY_CHARS} characters from A-Z a-z 0-9 and _.:+@=,~- (a POSIX "
            "shared-memory name, no other '/')"
        )
    return key


def check_name(name: Any) -> str:
    """A region's name: a non-empty string of bounded length with no control characters."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("shared memory region name must be a non-empty string")
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise InvalidArgument(
            f"invalid shared memory region name: at most {MAX_NAME_CHARS} printable characters"
        )
    return name


def _uint(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidArgument(f"{what} must be a non-negative integer")
    return value


@dataclass(frozen=True)
class Region:
    """A registration: a region of the object ``key``, as status shows it."""

    name: str
    key: str
    offset: int
    byte_size: int

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "offset": self.offset, "byte_size": self.byte_size})

    @classmethod
    def from_json(cls, name: str, text: str | bytes) -> Region:
        doc = json.loads(text)
        return cls(name, doc["key"], int(doc["offset"]), int(doc["byte_size"]))


class _Mapping:
    """A region mapped into this process: its bytes at ``start`` of ``map``."""

    def __init__(self, region: Region, root: Path) -> None:
        self.region = region
        fd = _open(region, root)
        try:
            size = os.fstat(fd).st_size
            if region.byte_size == 0 or region.offset + region.byte_size > size:
                raise InvalidArgument(
                    f"failed to register shared memory region '{region.name}': invalid args"
                )
            aligned = region.offset - region.offset % mmap.ALLOCATIONGRANULARITY
            self.start = region.offset - aligned
            self.map = mmap.mmap(fd, self.start + region.byte_size, offset=aligned)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.map.close()


def _open(region: Region, root: Path) -> int:
    """The object's descriptor, read-write; a symbolic link or anything but a regular
    file is refused as missing (Triton's words)."""
    cannot = InvalidArgument(f"Unable to open shared memory region: '{region.key}'")
    try:
        fd = os.open(root / region.key.lstrip("/"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise cannot from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise cannot
    return fd


@dataclass
class OutputSlot:
    """Where an output's answer goes: ``byte_size`` bytes at ``offset`` of a region."""

    name: str  # the output's
    region: str
    offset: int
    byte_size: int
    mapping: _Mapping

    def write(self, raw: bytes) -> None:
        """``raw`` copied into the region (the response then names the output with no data)."""
        if len(raw) > self.byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{self.name}' "
                f"({self.byte_size} bytes) should be at least {len(raw)} bytes to hold the results"
            )
        start = self.mapping.start + self.offset
        try:
            self.mapping.map[start : start + len(raw)] = raw
        except ValueError:  # unmapped meanwhile: unregistered by this process
            raise InvalidArgument(f"Unable to find shared memory region: '{self.region}'") from None


@dataclass
class RegionOutput(RequestedOutput):
    """A requested output to be written into a shared-memory region, not sent."""

    slot: OutputSlot | None = None


def slot_of(output: Any) -> OutputSlot | None:
    """The region an output (a ``RequestedOutput``) is to be written to, if any."""
    return output.slot if isinstance(output, RegionOutput) else None


def output_slots(outputs: list[RequestedOutput] | None) -> dict[str, OutputSlot]:
    """The outputs of a request that go to regions, by name."""
    return {o.name: o.slot for o in outputs or () if isinstance(o, RegionOutput) and o.slot}


class SharedMemory:
    """The registrations of this host's frontends, and this process's mappings."""

    def __init__(
        self,
        client: Any,
        enabled: bool,
        *,
        root: Path = SHM_ROOT,
        host: str | None = None,
    ) -> None:
        self.client = client  # redis-py's
        self.enabled = enabled
        self.root = root
        self.hash = keys.SHM_REGIONS_PREFIX + (host or socket.gethostname())
        self._mapped: dict[str, _Mapping] = {}
        self._lock = threading.Lock()

    def check_enabled(self) -> None:
        if not self.enabled:
            raise Forbidden(DISABLED)

    # -- the API: register, unregister, status ---------------------------------------

    def register(self, name: Any, key: Any, offset: Any, byte_size: Any) -> None:
        self.check_enabled()
        region = Region(
            check_name(name),
            check_key(key),
            _uint(offset, "'offset'"),
            _uint(byte_size, "'byte_size'"),
        )
        mapping = _Mapping(region, self.root)  # checks the object and the bounds
        if not self.client.hsetnx(self.hash, region.name, region.to_json()):
            mapping.close()
            raise AlreadyExists(f"shared memory region '{region.name}' already in manager")
        self._keep(mapping)

    def unregister(self, name: str = "") -> None:
        """One region, or every one (``name`` ""); a name not registered is no error,
        as in Triton."""
        self.check_enabled()
        if name:
            self.client.hdel(self.hash, name)
            self._drop(name)
            return
        self.client.delete(self.hash)
        with self._lock:
            mapped, self._mapped = self._mapped, {}
        for mapping in mapped.values():
            mapping.close()

    def status(self, name: str = "") -> list[dict[str, Any]]:
        self.check_enabled()
        if name:
            text = self.client.hget(self.hash, name)
            if text is None:
                raise NotFound(f"Unable to find system shared memory region: '{name}'")
            return [Region.from_json(name, text).status()]
        found = self.client.hgetall(self.hash)
        regions = [Region.from_json(_text(n), t) for n, t in found.items()]
        return [r.status() for r in sorted(regions, key=lambda r: r.name)]

    # -- CUDA shared memory: not built ------------------------------------------------

    def cuda_register(self) -> None:
        self.check_enabled()
        raise InvalidArgument(CUDA_REFUSED)

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        self.check_enabled()
        if name:
            raise NotFound(f"Unable to find cuda shared memory region: '{name}'")
        return []

    def cuda_unregister(self, name: str = "") -> None:
        self.check_enabled()  # nothing is ever registered: nothing to do

    # -- infer calls ------------------------------------------------------------------

    def input_bytes(
        self, name: str, datatype: str, shape: tuple[int, ...], params: Mapping[str, Any]
    ) -> bytes:
        """An input's bytes, copied out of the region its parameters name, and checked
        against its datatype and shape."""
        region, offset, size = self._where(f"input '{name}'", params)
        mapping = self._mappings([region])[region]
        _bounded(region, mapping.region, offset, size)
        start = mapping.start + offset
        try:
            raw = mapping.map[start : start + size]
        except ValueError:
            raise InvalidArgument(f"Unable to find shared memory region: '{region}'") from None
        tensors.raw_size_ok(datatype, shape, raw, name)
        return raw

    def output(
        self, name: str, binary: bool, class_count: int, params: Mapping[str, Any]
    ) -> RequestedOutput:
        """A requested output; one whose parameters name a region is a ``RegionOutput``."""
        if REGION not in params:
            if BYTE_SIZE in params or OFFSET in params:
                self._where(f"output '{name}'", params)  # the same error as an input's
            return RequestedOutput(name, binary, class_count)
        region, offset, size = self._where(f"output '{name}'", params)
        mapping = self._mappings([region])[region]
        _bounded(region, mapping.region, offset, size)
        return RegionOutput(
            name, True, class_count, OutputSlot(name, region, offset, size, mapping)
        )

    def _where(self, what: str, params: Mapping[str, Any]) -> tuple[str, int, int]:
        self.check_enabled()
        region, size = params.get(REGION), params.get(BYTE_SIZE)
        if region is None or size is None:
            raise InvalidArgument(
                f"{what}: '{REGION}' and '{BYTE_SIZE}' must be given together "
                f"('{OFFSET}' is optional)"
            )
        if not isinstance(region, str) or not region:
            raise InvalidArgument(f"{what}: '{REGION}' must be a non-empty string")
        size = _uint(size, f"{what}: '{BYTE_SIZE}'")
        offset = _uint(params.get(OFFSET, 0), f"{what}: '{OFFSET}'")
        return region, offset, size

    def _mappings(self, names: list[str]) -> dict[str, _Mapping]:
        """Each region's mapping in this process, as registered now (one round trip)."""
        found = self.client.hmget(self.hash, names)
        out: dict[str, _Mapping] = {}
        for name, text in zip(names, found, strict=True):
            if text is None:
                self._drop(name)
                raise InvalidArgument(f"Unable to find shared memory region: '{name}'")
            region = Region.from_json(name, text)
            with self._lock:
                mapping = self._mapped.get(name)
            if mapping is None or mapping.region != region:
                mapping = self._keep(_Mapping(region, self.root))
            out[name] = mapping
        return out

    def _keep(self, mapping: _Mapping) -> _Mapping:
        with self._lock:
            old = self._mapped.get(mapping.region.name)
            self._mapped[mapping.region.name] = mapping
        if old is not None and old is not mapping:
            old.close()
        return mapping

    def _drop(self, name: str) -> None:
        with self._lock:
            mapping = self._mapped.pop(name, None)
        if mapping is not None:
            mapping.close()


def _bounded(name: str, region: Region, offset: int, size: int) -> None:
    """An offset and size inside the region, in Triton's words."""
    if offset >= region.byte_size:
        raise InvalidArgument(f"Invalid offset for shared memory region: '{name}'")
    if offset + size > region.byte_size:
        raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{name}'")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = [
    "CUDA_REFUSED",
    "DISABLED",
    "PARAMETERS",
    "OutputSlot",
    "Region",
    "RegionOutput",
    "SharedMemory",
    "check_key",
    "check_name",
    "output_slots",
    "slot_of",
]
