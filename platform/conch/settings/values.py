"""The values that settings hold, apart from how a command line spells them.

The roles (``Role``), Triton's choices (``ModelControlMode``, ``LogFormat``,
``CompressionLevel``, ``RateLimitMode``) and conch's (``InstanceForm``, ``GrpcTransport``),
the configs a repeatable flag's values make together (``BackendConfig``,
``RateLimitResources``, ``WorkerRange``), and the names every role agrees on (the
environment variables a parent hands its children, the gevent worker class, the local
Redis). Imports nothing of conch: anything that needs a setting's type, and not the flags,
takes it from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class ModelControlMode(StrEnum):
    """Triton's ``--model-control-mode``: which models a server serves, and when it looks again.

    none: every model at start, never again; poll: follow the repository as it changes;
    explicit: only what ``--load-model`` and the load/unload API ask for.
    """

    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"

    @property
    def explicit(self) -> bool:
        """Models are loaded and unloaded through the API (and ``--load-model``)."""
        return self is ModelControlMode.EXPLICIT

    @property
    def polls(self) -> bool:
        """The repository is rescanned and followed as it changes."""
        return self is ModelControlMode.POLL

    @property
    def follows_changes(self) -> bool:
        """Anything after start can change what is served (poll or explicit)."""
        return self is not ModelControlMode.NONE


class LogFormat(StrEnum):
    """Triton's ``--log-format``: how each log line starts (``conch.server_log``)."""

    DEFAULT = "default"  # I0304 10:22:33.123456 <pid> <file>:<line>] ...
    ISO8601 = "ISO8601"  # 2024-03-04T10:22:33Z I <pid> <file>:<line>] ...
    JSON = "json"  # conch's: one JSON object a line, for log shippers (Loki, Elasticsearch)


class InstanceForm(StrEnum):
    """``--instance-form``: how a worker runs each instance of a model's ``instance_group``.

    thread: a drain loop on a thread of the worker process, every instance sharing its
    interpreter (and its GIL); process: a child process per instance, each with its own
    copy of the model, its own interpreter and its own drain loop on the model's queue,
    as Triton's Python backend runs a stub process per instance. A model's config may
    choose for itself (``parameters { key: "instance_form" }``).
    """

    THREAD = "thread"
    PROCESS = "process"


class CompressionLevel(StrEnum):
    """Triton's ``--grpc-infer-response-compression-level``: how infer responses are
    compressed on the wire (``frontend.grpc.transport`` picks the algorithm)."""

    NONE = "none"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class GrpcTransport(StrEnum):
    """``--grpc-transport``: what serves ``conch grpc``'s HTTP/2. grpcio: grpcio's
    synchronous server (``frontend.grpc.server``); h2: the ``h2`` library on gevent
    (``frontend.grpc.h2_server``). The same services answer on both."""

    GRPCIO = "grpcio"
    H2 = "h2"


class Role(StrEnum):
    """The subcommands that run a part of the server, each with its own flags."""

    SERVE = "serve"  # Redis if needed, a worker, the gateway and the gRPC server
    GATEWAY = "gateway"
    GRPC = "grpc"  # the gRPC frontend (Triton's GRPCInferenceService)
    WORKER = "worker"
    AUTOSCALE = "autoscale"  # starts and retires workers on the work their models owe


GEVENT_WORKER = "conch.frontend.http.gevent_worker.GatewayWorker"
RESTRICTED_API_ENV = "CONCH_HTTP_RESTRICTED_API"
RESTRICTED_PROTOCOL_ENV = "CONCH_GRPC_RESTRICTED_PROTOCOL"
CACHE_CONFIG_ENV = "CONCH_CACHE_CONFIG"
GRPC_SHARED_PORT_ENV = "CONCH_GRPC_SHARED_PORT"
# Triton's gRPC metadata key of a restricted protocol: this prefix, then the flag's key.
GRPC_RESTRICTED_HEADER_PREFIX = "triton-grpc-protocol-"
MAX_BATCH_SIZE_KEY = "default-max-batch-size"  # the one --backend-config setting conch applies
LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


def default_http_workers(cpus: int | None) -> int:
    """Gateway processes when ``--http-workers`` is not given (and gRPC server processes
    when ``--grpc-workers`` is not): half the cores, 1 to 2."""
    return min(2, max(1, (cpus or 1) // 2))


@dataclass
class BackendConfig:
    """What conch applies of Triton's ``--backend-config``: ``default-max-batch-size``, the
    max_batch_size that auto-complete gives a model that can batch (0: leave it at 0).

    As in Triton it is set for every backend (``default-max-batch-size=N``) or for one
    (``onnxruntime,default-max-batch-size=N``), a backend's own value winning over the
    global one. Triton's backends take many other settings that
    mean nothing here; ``parse`` keeps them in ``ignored`` for the CLI to warn about, so a
    Triton launch line starts unchanged, and ``items`` never writes them back.
    """

    # backend name -> size; "" for every backend not named. Neither: the repository's
    # default (Triton's 4, core.repository.DEFAULT_MAX_BATCH_SIZE).
    max_batch_sizes: dict[str, int] = field(default_factory=dict)
    ignored: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, items: Iterable[str]) -> BackendConfig:
        """``--backend-config`` values, in Triton's forms: ``<backend>,<setting>=<value>``
        or ``<setting>=<value>``. Raises ValueError for a malformed one."""
        sizes: dict[str, int] = {}
        ignored: list[str] = []
        for item in items:
            backend, setting, value = _backend_setting(item)
            if setting != MAX_BATCH_SIZE_KEY:
                ignored.append(item)
                continue
            try:
                size = int(value)
            except ValueError:
                raise ValueError(f"--backend-config {item!r}: not an integer") from None
            if size < 0:
                raise ValueError(f"--backend-config {item!r}: must be 0 or more")
            sizes[backend] = size
        return cls(sizes, tuple(ignored))

    def items(self) -> list[str]:
        """The ``--backend-config`` values that reproduce what is applied."""
        return [
            f"{backend},{MAX_BATCH_SIZE_KEY}={size}" if backend else f"{MAX_BATCH_SIZE_KEY}={size}"
            for backend, size in self.max_batch_sizes.items()
        ]


def _backend_setting(item: str) -> tuple[str, str, str]:
    """(backend or "" for every backend, setting, value) of one ``--backend-config``."""
    form = "<backend>,<setting>=<value> or <setting>=<value>"
    backend, comma, rest = item.partition(",")
    if not comma or "=" in backend:  # the global form (a value may hold a comma)
        backend, rest = "", item
    elif not backend:
        raise ValueError(f"--backend-config {item!r}: no backend before ','; the form is {form}")
    setting, equals, value = rest.partition("=")
    if not equals or not setting or not value:
        raise ValueError(f"--backend-config {item!r}: the form is {form}")
    return backend, setting, value


@dataclass(frozen=True)
class WorkerRange:
    """``--workers MIN:MAX``: how many worker processes an autoscaler keeps (MIN may be 0:
    scale to zero)."""

    minimum: int
    maximum: int

    @classmethod
    def parse(cls, text: str) -> WorkerRange:
        """``MIN:MAX``, or ``N`` for a fixed N. Raises ValueError for anything else."""
        low, colon, high = text.partition(":")
        try:
            minimum, maximum = int(low), int(high if colon else low)
        except ValueError:
            raise ValueError(f"--workers {text!r}: the form is MIN:MAX (e.g. 1:4)") from None
        if minimum < 0 or maximum < 1 or minimum > maximum:
            raise ValueError(f"--workers {text!r}: needs 0 <= MIN <= MAX and MAX >= 1")
        return cls(minimum, maximum)

    def __str__(self) -> str:
        return f"{self.minimum}:{self.maximum}"


class RateLimitMode(StrEnum):
    """Triton's ``--rate-limit``: off runs a request on an instance as soon as one is free;
    execution_count picks instances by priority and use, each waiting for the resources
    its config's ``rate_limiter`` asks for, counted across the fleet
    (``conch.worker.rate_limiter``)."""

    OFF = "off"
    EXECUTION_COUNT = "execution_count"


RESOURCE_FORM = "<name>:<count> or <name>:<count>:<device>"


@dataclass
class RateLimitResources:
    """Triton's ``--rate-limit-resource NAME:COUNT[:DEVICE]`` values: how many of each
    resource there are, on every device (``None``; Triton's ``-1``) or on one.

    As in Triton, a resource given again for the same device keeps the smaller count (so
    ``R:2`` and ``R:3:-1``, two spellings of one thing, leave ``R`` at 2 on every device);
    names are kept as written, as Triton's core compares them.
    """

    counts: dict[tuple[str, int | None], int] = field(default_factory=dict)

    @classmethod
    def parse(cls, items: Iterable[str]) -> RateLimitResources:
        """Raises ValueError naming the malformed value and the form it should have."""
        counts: dict[tuple[str, int | None], int] = {}
        for item in items:
            name, *numbers = item.split(":")
            bad = f"--rate-limit-resource option format is {RESOURCE_FORM}; got {item!r}"
            if not name or len(numbers) not in (1, 2):
                raise ValueError(bad)
            try:
                count = int(numbers[0])
                device = int(numbers[1]) if len(numbers) == 2 else -1
            except ValueError:
                raise ValueError(f"{bad}: count and device are whole numbers") from None
            if count < 0 or device < -1:
                raise ValueError(f"{bad}: count is 0 or more, device 0 or more (-1: every one)")
            key = (name, None if device == -1 else device)
            counts[key] = min(count, counts.get(key, count))
        return cls(counts)

    def items(self) -> list[str]:
        """The ``--rate-limit-resource`` values that reproduce these counts."""
        return [
            f"{name}:{count}" if device is None else f"{name}:{count}:{device}"
            for (name, device), count in self.counts.items()
        ]


# The schemes of object storage that --model-repository takes, as Triton spells them.
REPOSITORY_SCHEMES = ("s3://", "gs://", "as://")


def is_remote_repository(spec: Path | str) -> bool:
    return isinstance(spec, str) and spec.startswith(REPOSITORY_SCHEMES)
