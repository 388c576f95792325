"""Runtime settings shared by the gateway, the worker and ``conch serve``.

This module is the one reader of conch's configuration. Flags win over environment
variables, which win over the defaults here:

- each field of ``Settings`` holds its default, and the environment variable that can set
  it, if any (``CONCH_*``, ``REDIS_URL``, ``AWS_DEFAULT_REGION``/``AWS_REGION``);
- ``FLAGS`` lists every command-line flag of ``conch serve|gateway|worker`` (Triton's names
  where Triton has them), with the field it sets and the subcommands that take it.

``Settings.from_env()`` reads the environment; ``Settings.from_args(namespace)`` adds the
flags a command line gave (argparse defaults are all None, so only given flags count);
``settings.to_args(role)`` writes the flags that reproduce a Settings for one subcommand,
which is how ``conch serve`` starts its worker and gateway. Settings that have no flag
(the visibility timeout, attempts, job limits, the HTTP worker class, the local Redis
probe, the S3 region) reach those children through the environment they inherit.

This module imports only the standard library (and ``conch.core.restricted_apis`` and
``conch.core.cache_config``, which import nothing else): the gateway reads its Settings before gevent patches the process,
and that must happen before redis is imported.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from conch.core.cache_config import CacheConfig
from conch.core.metrics_config import MetricsConfig
from conch.core.restricted_apis import RestrictedApis, group_names
from conch.core.trace_config import TraceConfig


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


class CompressionLevel(StrEnum):
    """Triton's ``--grpc-infer-response-compression-level``: how infer responses are
    compressed on the wire (``frontend.grpc.transport`` picks the algorithm)."""

    NONE = "none"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


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


def _env(*names: str, parse: Callable[[str], Any] = str) -> dict[str, Any]:
    """A field's metadata: the environment variables that set it (the first one set wins)."""
    return {"env": names, "parse": parse}


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


@dataclass
class Settings:
    model_repository: Path = Path("functions")
    # The broker. Empty: a Redis answering on local_redis_url, else a private redis-server.
    redis_url: str = field(default="", metadata=_env("REDIS_URL"))
    # Requests with no "timeout" parameter wait this long for their reply.
    request_timeout_s: float = field(
        default=60.0, metadata=_env("CONCH_REQUEST_TIMEOUT_S", parse=float)
    )
    # Triton's --http-max-input-size default: 64 MiB.
    max_input_bytes: int = field(
        default=64 * 1024 * 1024, metadata=_env("CONCH_MAX_INPUT_BYTES", parse=int)
    )
    # A message a dead worker held comes back after this long (kombu's default is an hour).
    visibility_timeout_s: float = field(
        default=6.0, metadata=_env("CONCH_VISIBILITY_TIMEOUT_S", parse=float)
    )
    max_attempts: int = field(default=3, metadata=_env("CONCH_MAX_ATTEMPTS", parse=int))
    # How long an async job's result (and its record) is kept: Celery's result_expires.
    job_ttl_s: int = field(default=86_400, metadata=_env("CONCH_JOB_TTL_S", parse=int))
    # Async jobs a model's queue may hold before submissions get a 503 (Redis memory).
    max_queued_jobs: int = field(default=100_000, metadata=_env("CONCH_MAX_QUEUED_JOBS", parse=int))
    auto_complete: bool = True
    # Triton's --backend-config: what conch applies of it (default-max-batch-size).
    backend_config: BackendConfig = field(default_factory=lambda: BackendConfig())
    models: list[str] | None = None  # the worker serves these; None = all
    # Triton's model control: none (load all at start), poll (follow the repository),
    # explicit (load and unload through the API; --load-model at start).
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    repository_poll_secs: float = 15.0
    load_models: list[str] = field(default_factory=list)
    log_verbose: int = 0
    # Triton's log flags: a file instead of stderr, the line format, each severity on/off.
    log_file: str = ""
    log_format: LogFormat = LogFormat.DEFAULT
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    # Triton's --exit-timeout-secs: on SIGTERM, how long in-flight work may take to finish
    # (the gateway's graceful timeout; the worker's warm shutdown) before the process exits.
    exit_timeout_secs: int = 30
    # Triton's --strict-readiness: /v2/health/ready also waits for every model that should
    # be loaded to be served by a live worker; false: ready once the broker answers.
    strict_readiness: bool = True
    # Triton's metrics port: GET /metrics there, with Triton's nv_inference_* names.
    allow_metrics: bool = True
    metrics_port: int = 8002
    metrics_address: str | None = None  # None: the HTTP address (--http-address)
    # Workers report their host's CPU and GPU use (nv_cpu_*, nv_gpu_*), sampled at most
    # every metrics_interval_ms.
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_interval_ms: int = 2000
    # Triton's --metrics-config: latency counters, summaries, the first-response histogram.
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    trace_config: TraceConfig = field(default_factory=TraceConfig)
    # The gateway's sockets and processes (gunicorn's bind, workers and threads).
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_thread_count: int = 64  # threads (or gevent connections) per gateway process
    # Gateway processes: half the cores, at most 2. On a 2-core host that also runs the
    # worker (conch serve), one gevent process beat two by 3-13 % (bench/README.md).
    http_workers: int = field(default_factory=lambda: default_http_workers(os.cpu_count()))
    # gunicorn worker class of the gateway (e.g. gthread instead of the gevent worker).
    http_worker_class: str = field(default=GEVENT_WORKER, metadata=_env("CONCH_HTTP_WORKER_CLASS"))
    # The Redis tried when no redis_url is given (tests point it at nothing).
    local_redis_url: str = field(default=LOCAL_REDIS_URL, metadata=_env("CONCH_LOCAL_REDIS_URL"))
    # Triton's --http-restricted-api: the API groups a request reaches only with a header.
    # Its environment variable holds the flag's values one per line: conch serve hands the
    # secrets to its gateway that way, out of the process list.
    http_restricted_api: RestrictedApis = field(
        default_factory=RestrictedApis,
        metadata=_env(
            RESTRICTED_API_ENV, parse=lambda text: RestrictedApis.parse(text.splitlines())
        ),
    )
    # The gRPC frontend (Triton's GRPCInferenceService) and which frontends serve start.
    allow_http: bool = True
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    # Triton's --grpc-infer-thread-count, with conch's default: each call holds its thread
    # while its request waits in the queue, so the pool bounds the calls in flight.
    grpc_infer_thread_count: int = 64
    # gRPC server processes sharing the port (SO_REUSEPORT), as --http-workers for the
    # gateway: grpcio's server is bound by its process's GIL (bench/README.md).
    grpc_workers: int = field(default_factory=lambda: default_http_workers(os.cpu_count()))
    # Set by ``conch grpc`` for the processes it starts when --grpc-workers > 1: they bind
    # the port with SO_REUSEPORT, after it checked that the port was free.
    grpc_shared_port: bool = field(
        default=False, metadata=_env(GRPC_SHARED_PORT_ENV, parse=lambda text: _bool(text))
    )
    # Triton's --grpc-restricted-protocol: as --http-restricted-api, with gRPC metadata
    # keys (GRPC_RESTRICTED_HEADER_PREFIX + key); a secret, so handed over in the environment.
    grpc_restricted_protocol: RestrictedApis = field(
        default_factory=RestrictedApis,
        metadata=_env(
            RESTRICTED_PROTOCOL_ENV, parse=lambda text: _parse_protocols(text.splitlines())
        ),
    )
    # Triton's gRPC TLS: --grpc-use-ssl (server cert and key), --grpc-use-ssl-mutual (which
    # wins, and also asks clients for a certificate signed by the root cert). PEM files.
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
    grpc_infer_response_compression_level: CompressionLevel = CompressionLevel.NONE
    # Triton's gRPC keepalive flags (milliseconds), with Triton's (and gRPC core's) defaults.
    grpc_keepalive_time_ms: int = 7_200_000
    grpc_keepalive_timeout_ms: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data_ms: int = 300_000
    grpc_http2_max_ping_strikes: int = 2
    # 0: no limit (Triton's default, "undefined").
    grpc_max_connection_age_ms: int = 0
    grpc_max_connection_age_grace_ms: int = 0
    # Sizes of Triton's own reuse pools of request and response objects: taken so that a
    # Triton launch line starts, and named as ignored (grpcio keeps its own).
    grpc_infer_allocation_pool_size: int = 0
    grpc_max_response_pool_size: int = 0
    # Triton's --cache-config: the response cache of the frontends (none: no caching).
    # Its environment variable holds the flag's values one per line (a Redis password
    # reaches conch serve's children that way, out of the process list).
    cache_config: CacheConfig | None = field(
        default=None,
        metadata=_env(CACHE_CONFIG_ENV, parse=lambda text: CacheConfig.parse(text.splitlines())),
    )
    # Beyond Triton: the load API's file: parameters (model code and weights from the
    # client) are refused unless this is on.
    allow_model_upload: bool = False
    # The local autoscaler (conch autoscale, conch serve --workers): how many workers, and
    # the formula it shares with the chart (conch.wire.work_owed.desired_workers).
    # None: conch serve runs one worker and no autoscaler.
    workers: WorkerRange | None = None
    target_work_per_worker: float = 10.0  # owed work (waiting + in flight) one worker takes
    activation_work: int = 0  # at MIN 0, the owed work that wakes the first worker
    scale_down_cooldown_secs: float = 300.0  # fewer workers only once wanted this long
    scale_poll_secs: float = 2.0  # how often the autoscaler reads the queues
    # The autoscaler counts the batch jobs queue too (conch.jobs): the one group whose
    # workers take the jobs (batch_jobs). conch serve --workers turns it on.
    scale_on_jobs: bool = False
    # The worker takes batch jobs (consumes conch.jobs). false: it never runs a job's
    # driver, for a group whose scaler does not count the jobs (it could be scaled down
    # mid-job). Triton has no batch jobs, so no such flag.
    batch_jobs: bool = True
    # Jobs one worker's drivers run at once (Celery's thread pool on conch.jobs): batch
    # jobs, and ensembles' async jobs, which must not wait for a long batch job to end.
    job_concurrency: int = 4
    # Models whose workers may all be gone by design (scaled to zero): with no live worker
    # they read as ready and take requests, which wait in the queue for one to start.
    # ["*"]: every model.
    scale_to_zero: list[str] = field(default_factory=list)
    # Batch jobs' S3 region; boto3 reads the rest of the AWS settings itself.
    s3_region: str | None = field(default=None, metadata=_env("AWS_DEFAULT_REGION", "AWS_REGION"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The defaults, with what the environment sets (an empty variable counts as unset)."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            for name in f.metadata.get("env", ()):
                raw = environ.get(name)
                if raw:
                    try:
                        values[f.name] = f.metadata["parse"](raw)
                    except ValueError as exc:
                        raise ValueError(f"${name}={raw!r}: {exc}") from None
                    break
        return cls(**values)

    @classmethod
    def from_args(
        cls, namespace: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """``from_env``, then every flag of ``FLAGS`` that ``namespace`` has a value for.

        Raises ValueError for a flag value argparse cannot check (``--backend-config``,
        a negative ``--exit-timeout-secs``) and for flags that contradict each other.
        """
        settings = cls.from_env(environ)
        for flag in FLAGS:
            given = getattr(namespace, flag.dest, None)
            value = None if given is None else flag.read(given)
            if value is not None:
                setattr(settings, flag.field, value)
        if settings.scale_on_jobs and not settings.batch_jobs:
            raise ValueError(
                "--jobs counts batch jobs that --batch-jobs=false keeps this group's workers "
                "from running: count them in the group that runs them"
            )
        return settings

    def to_args(self, role: Role | str) -> list[str]:
        """The flags of subcommand ``role`` that reproduce these settings (those it has),
        but for secrets: those are in ``child_env(role)``."""
        return [
            arg
            for flag in FLAGS
            if role in flag.roles and flag.to_env is None
            for arg in flag.write(self)
        ]

    def child_env(self, role: Role | str) -> dict[str, str]:
        """The environment variables that carry the secret flags of subcommand ``role``
        to a child process: any user of the host can read a command line."""
        env_names = {f.name: f.metadata.get("env", ()) for f in fields(self)}
        env: dict[str, str] = {}
        for flag in FLAGS:
            if role in flag.roles and flag.to_env is not None:
                text = flag.to_env(getattr(self, flag.field))
                if text:
                    env[env_names[flag.field][0]] = text
        return env

    def scales_to_zero(self, model: str) -> bool:
        """``--scale-to-zero`` names ``model`` (or every model)."""
        return "*" in self.scale_to_zero or model in self.scale_to_zero

    @property
    def http_worker_uses_gevent(self) -> bool:
        """The gateway runs under gevent: the process must be patched before redis loads."""
        return self.http_worker_class == GEVENT_WORKER or "gevent" in self.http_worker_class


# --- command-line flags -------------------------------------------------------------------

ALL_ROLES = frozenset(Role)
HTTP_ROLES = frozenset({Role.SERVE, Role.GATEWAY})
GRPC_ROLES = frozenset({Role.SERVE, Role.GRPC})
FRONTEND_ROLES = HTTP_ROLES | GRPC_ROLES  # what both frontends apply alike
# Roles that run workers: the autoscaler takes every worker flag, to start its workers with.
WORKER_ROLES = frozenset({Role.SERVE, Role.WORKER, Role.AUTOSCALE})
SCALE_ROLES = frozenset({Role.SERVE, Role.AUTOSCALE})


def _value(name: str, value: Any) -> list[str]:
    return [] if value is None or value == "" else [name, str(value)]


def _each(name: str, values: Iterable[str]) -> list[str]:
    return [arg for v in values for arg in (name, v)]


def _model_list(text: str) -> list[str] | None:
    """A comma-separated list of models; ``\\,`` is a comma inside a name (Triton's model
    names may hold commas; no name holds a backslash or a NUL)."""
    names = [n.replace("\0", ",") for n in text.replace("\\,", "\0").split(",")]
    return [n for n in names if n] or None


def _model_list_args(name: str, values: list[str] | None) -> list[str]:
    return [name, ",".join(v.replace(",", "\\,") for v in values)] if values else []


def _parse_protocols(values: Iterable[str]) -> RestrictedApis:
    """``--grpc-restricted-protocol`` values, with Triton's option name and metadata keys."""
    return RestrictedApis.parse(
        values,
        option="grpc-restricted-protocol",
        feature="protocol",
        header_prefix=GRPC_RESTRICTED_HEADER_PREFIX,
    )


def _bool(text: str) -> bool:
    """A boolean flag's value, as Triton reads one: true/on/1 or false/off/0, any case."""
    word = text.strip().lower()
    if word in ("true", "on", "1"):
        return True
    if word in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {text!r}")


def _bool_arg(name: str, on: bool) -> list[str]:
    return [f"{name}={str(on).lower()}"]


def _bool_flag(name: str, setting: str, roles: frozenset[Role], help: str) -> Flag:
    """A Triton boolean flag: ``--name=true|false`` (or on/off, 1/0), written back so."""
    return Flag(name, setting, roles, help, type=_bool, metavar="BOOL", as_args=_bool_arg)


def _config_flag(
    name: str,
    setting: str,
    roles: frozenset[Role],
    help: str,
    metavar: str,
    parse: Callable[[list[str]], Any],
) -> Flag:
    """A repeatable Triton ``KEY=VALUE`` flag: its values parsed together into one
    config, which writes them back with its ``items()``."""
    return Flag(
        name,
        setting,
        roles,
        help,
        metavar=metavar,
        action="append",
        read=parse,
        as_args=lambda flag, config: _each(flag, config.items()),
    )


def _choice_flag(name: str, setting: str, help: str, choices: type[StrEnum]) -> Flag:
    """A flag whose values are an enum's, for every role."""
    return Flag(name, setting, ALL_ROLES, help, choices=tuple(choices), read=choices)


def _file_flag(name: str, setting: str, help: str) -> Flag:
    """A gRPC TLS file flag (read only when TLS is on)."""
    return Flag(name, setting, GRPC_ROLES, help, metavar="FILE", read=_given)


def _millis_flag(name: str, setting: str, help: str) -> Flag:
    """A gRPC transport duration, in milliseconds as Triton takes it."""
    return Flag(name, setting, GRPC_ROLES, help, type=int, metavar="MS")


# Triton flags that mean nothing here (sizes of Triton's own pools of request and response
# objects; grpcio keeps its own): taken, so a Triton launch line starts, and named as
# ignored when given. Each sets the field of its own name.
IGNORED_GRPC_FLAGS = ("--grpc-infer-allocation-pool-size", "--grpc-max-response-pool-size")


def flag_field(name: str) -> str:
    """The Settings field a flag of that name sets, when it is named after it."""
    return name.removeprefix("--").replace("-", "_")


def _ignored_flag(name: str) -> Flag:
    return Flag(
        name,
        flag_field(name),
        GRPC_ROLES,
        "Triton's; ignored (grpcio keeps its own pools)",
        type=int,
        metavar="N",
        read=_given,
        as_args=lambda flag, n: [flag, str(n)] if n else [],
    )


def _count_flag(name: str, setting: str, roles: Any, help: str) -> Flag:
    """A flag that counts something there must be at least one of."""
    return _bounded_flag(name, setting, roles, help, 1)


def _bounded_flag(
    name: str,
    setting: str,
    roles: Any,
    help: str,
    low: float,
    *,
    kind: type = int,
    metavar: str = "N",
    inclusive: bool = True,
) -> Flag:
    """A number flag with a lower bound (``inclusive`` or not), refused below it."""
    return Flag(
        name,
        setting,
        roles,
        help,
        type=kind,
        metavar=metavar,
        read=lambda n: _at_least(n, low, name, inclusive=inclusive),
    )


def _seconds(value: int) -> int:
    if value < 0:
        raise ValueError(f"--exit-timeout-secs {value}: must be 0 or more")
    return value


def _at_least(value: Any, low: Any, flag: str, *, inclusive: bool = True) -> Any:
    if value < low or (value == low and not inclusive):
        raise ValueError(f"{flag} {value}: must be {'at least' if inclusive else 'above'} {low}")
    return value


def _same(value: Any) -> Any:
    return value


def _given(value: Any) -> Any:
    """Empty text or 0 counts as not given."""
    return value or None


@dataclass(frozen=True)
class Flag:
    """One command-line flag: its argparse arguments, the field it sets, how to read a
    parsed value into the field (None: leave the field as it is) and how to write the
    field back as arguments."""

    name: str
    field: str
    roles: frozenset[Role]
    help: str | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    action: str = "store"  # or "append", "store_true"
    nargs: str | None = None  # "?": the value may be left out, and then is ``const``
    const: Any = None
    choices: tuple[str, ...] | None = None
    required: bool = False
    read: Callable[[Any], Any] = _same
    as_args: Callable[[str, Any], list[str]] = _value
    # A secret: written for children as the text of its field's environment variable,
    # never as arguments.
    to_env: Callable[[Any], str] | None = None

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def write(self, settings: Settings) -> list[str]:
        return self.as_args(self.name, getattr(settings, self.field))

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        # default None everywhere: a flag not given leaves the environment's value.
        kwargs: dict[str, Any] = {"action": self.action, "default": None, "help": self.help}
        if self.action != "store_true":
            kwargs.update(type=self.type, metavar=self.metavar, choices=self.choices)
        if self.nargs is not None:
            kwargs.update(nargs=self.nargs, const=self.const)
        if self.required:
            kwargs["required"] = True
        parser.add_argument(self.name, **kwargs)


FLAGS: tuple[Flag, ...] = (
    Flag(
        "--model-repository",
        "model_repository",
        ALL_ROLES,
        "the Triton-layout model repository to serve",
        type=Path,
        metavar="DIR",
        required=True,
        read=lambda path: path.resolve(),
    ),
    Flag(
        "--redis-url",
        "redis_url",
        ALL_ROLES,
        "the broker (default: $REDIS_URL)",
        read=_given,
    ),
    Flag(
        "--log-verbose",
        "log_verbose",
        ALL_ROLES,
        "verbose logging when N > 0",
        type=int,
        metavar="N",
    ),
    _bool_flag("--log-info", "log_info", ALL_ROLES, "log info lines (default true)"),
    _bool_flag("--log-warning", "log_warning", ALL_ROLES, "log warnings (default true)"),
    _bool_flag("--log-error", "log_error", ALL_ROLES, "log errors (default true)"),
    _choice_flag(
        "--log-format",
        "log_format",
        "default: lines start 'I0304 10:22:33.123456 <pid> <file>:<line>]'; "
        "ISO8601: '2024-03-04T10:22:33Z I <pid> <file>:<line>]' (UTC, as Triton); "
        "json (conch's): one JSON object a line",
        LogFormat,
    ),
    Flag(
        "--log-file",
        "log_file",
        ALL_ROLES,
        "append the log to this file instead of writing it to stderr",
        metavar="FILE",
        read=_given,
    ),
    Flag(
        "--exit-timeout-secs",
        "exit_timeout_secs",
        ALL_ROLES,
        "on SIGTERM, in-flight work gets this long to finish before the process exits (default 30)",
        type=int,
        metavar="S",
        read=_seconds,
    ),
    Flag(
        "--disable-auto-complete-config",
        "auto_complete",
        ALL_ROLES,
        "do not complete configs from the models themselves",
        action="store_true",
        read=lambda on: False if on else None,
        as_args=lambda name, auto_complete: [] if auto_complete else [name],
    ),
    Flag(  # Triton's older spelling of the same switch; written back as the one above
        "--strict-model-config",
        "auto_complete",
        ALL_ROLES,
        argparse.SUPPRESS,
        action="store_true",
        read=lambda on: False if on else None,
        as_args=lambda name, auto_complete: [],
    ),
    _config_flag(
        "--backend-config",
        "backend_config",
        ALL_ROLES,
        "Triton's form: [BACKEND,]default-max-batch-size=N is applied (for every backend, "
        "or for one); other settings are logged and ignored; repeatable",
        "[BACKEND,]SETTING=VALUE",
        BackendConfig.parse,
    ),
    Flag(
        "--request-timeout-secs",
        "request_timeout_s",
        ALL_ROLES,
        "deadline of requests that set no 'timeout' parameter",
        type=float,
    ),
    _choice_flag(
        "--model-control-mode",
        "model_control_mode",
        "none: load everything at start; poll: follow repository changes; "
        "explicit: load and unload through the repository API",
        ModelControlMode,
    ),
    Flag(
        "--repository-poll-secs",
        "repository_poll_secs",
        ALL_ROLES,
        "poll mode: how often to look for repository changes",
        type=float,
        metavar="S",
    ),
    Flag(
        "--load-model",
        "load_models",
        ALL_ROLES,
        "explicit mode: load this model at start ('*' for all); repeatable",
        metavar="MODEL",
        action="append",
        read=list,
        as_args=_each,
    ),
    _bool_flag(
        "--strict-readiness",
        "strict_readiness",
        FRONTEND_ROLES,
        "/v2/health/ready waits for every model that should be loaded to be served by a "
        "live worker (default true; false: ready once the broker answers)",
    ),
    Flag(
        "--metrics-port",
        "metrics_port",
        HTTP_ROLES,
        "GET /metrics here (Triton's 8002)",
        type=int,
    ),
    _bool_flag(
        "--allow-metrics",
        "allow_metrics",
        HTTP_ROLES,
        "serve metrics (default true; --allow-metrics=false to turn them off)",
    ),
    Flag(
        "--metrics-address",
        "metrics_address",
        HTTP_ROLES,
        "the address the metrics port binds (default: --http-address's)",
        read=_given,
    ),
    _bool_flag(
        "--allow-cpu-metrics",
        "allow_cpu_metrics",
        WORKER_ROLES,
        "workers report their host's CPU use and memory (nv_cpu_*; default true)",
    ),
    _bool_flag(
        "--allow-gpu-metrics",
        "allow_gpu_metrics",
        WORKER_ROLES,
        "workers report their GPUs' use, memory and power through NVML (nv_gpu_*; default "
        "true; needs the gpu extra, nvidia-ml-py, and a GPU)",
    ),
    _config_flag(
        "--trace-config",
        "trace_config",
        ALL_ROLES,
        "Triton's: mode=opentelemetry, opentelemetry,url=<host:port/path> (OTLP/HTTP), "
        "rate=<N> (one trace in N), count=<N> (-1: no limit), level=OFF|TIMESTAMPS; "
        "repeatable; give it to workers too (they send the queue and batch spans)",
        "KEY=VALUE",
        TraceConfig.parse,
    ),
    _config_flag(
        "--metrics-config",
        "metrics_config",
        ALL_ROLES,
        "Triton's: counter_latencies=<bool>, summary_latencies=<bool>, "
        "summary_quantiles=<q>:<error>,..., histogram_latencies=<bool>; repeatable; give it "
        "to workers too (they keep the samples summaries are computed from)",
        "KEY=VALUE",
        MetricsConfig.parse,
    ),
    _bounded_flag(
        "--metrics-interval-ms",
        "metrics_interval_ms",
        WORKER_ROLES,
        "how often workers sample CPU and GPU use (at most; they report it with each "
        "heartbeat; default 2000)",
        1,
        metavar="MS",
    ),
    Flag(
        "--http-restricted-api",
        "http_restricted_api",
        HTTP_ROLES,
        "requests to these APIs need header HEADER with value VALUE (403 otherwise); "
        f"repeatable, each API in one flag at most. APIs: {group_names()}",
        metavar="API,...:HEADER=VALUE",
        action="append",
        read=RestrictedApis.parse,
        as_args=lambda name, rules: _each(name, rules.to_values()),
        to_env=lambda rules: "\n".join(rules.to_values()),
    ),
    Flag(
        "--cache-config",
        "cache_config",
        FRONTEND_ROLES,
        "Triton's response cache, for models whose config sets response_cache { enable: true }: "
        "local,size=BYTES (each frontend process its own) or redis,host=H,port=P[,password=..]"
        "[,db=N][,size=BYTES] (one cache shared by every frontend); repeatable, keys add up",
        metavar="CACHE,KEY=VALUE",
        action="append",
        read=CacheConfig.parse,
        to_env=lambda config: "\n".join(config.to_values()) if config else "",
    ),
    Flag(
        "--allow-model-upload",
        "allow_model_upload",
        FRONTEND_ROLES,
        "let the load API take model files ('file:' parameters) from the client: "
        "code the workers will run (default false)",
        type=_bool,
        metavar="BOOL",
        nargs="?",
        const=True,
        as_args=lambda name, on: [name] if on else [],
    ),
    Flag("--http-port", "http_port", HTTP_ROLES, type=int),
    Flag("--http-address", "http_address", HTTP_ROLES, read=_given),
    Flag(
        "--http-thread-count",
        "http_thread_count",
        HTTP_ROLES,
        "threads per gateway process",
        type=int,
    ),
    Flag("--http-workers", "http_workers", HTTP_ROLES, "gateway processes", type=int),
    Flag(
        "--http-max-input-size",
        "max_input_bytes",
        FRONTEND_ROLES,
        "the largest request body (and gRPC request message) taken, in bytes (64 MiB)",
        type=int,
        metavar="BYTES",
        read=_given,
    ),
    _bool_flag(
        "--allow-http",
        "allow_http",
        frozenset({Role.SERVE}),
        "serve the HTTP frontend (default true)",
    ),
    _bool_flag(
        "--allow-grpc",
        "allow_grpc",
        frozenset({Role.SERVE}),
        "serve the gRPC frontend (default true)",
    ),
    Flag("--grpc-port", "grpc_port", GRPC_ROLES, "the gRPC port (Triton's 8001)", type=int),
    Flag("--grpc-address", "grpc_address", GRPC_ROLES, read=_given),
    Flag(
        "--grpc-infer-thread-count",
        "grpc_infer_thread_count",
        GRPC_ROLES,
        "calls (a stream counts as one) the gRPC server runs at once; each holds its "
        "thread while its request is queued (default 64; Triton's is 2)",
        type=int,
    ),
    _count_flag(
        "--grpc-workers",
        "grpc_workers",
        GRPC_ROLES,
        "gRPC server processes, sharing the port (SO_REUSEPORT); conch's own flag, Triton "
        "has none (default: as --http-workers)",
    ),
    Flag(
        "--grpc-restricted-protocol",
        "grpc_restricted_protocol",
        GRPC_ROLES,
        "RPCs of these groups need gRPC metadata triton-grpc-protocol-KEY with value "
        f"VALUE (UNAVAILABLE otherwise); repeatable. Groups: {group_names()}",
        metavar="PROTOCOL,...:KEY=VALUE",
        action="append",
        read=_parse_protocols,
        as_args=lambda name, rules: _each(name, rules.to_values(GRPC_RESTRICTED_HEADER_PREFIX)),
        to_env=lambda rules: "\n".join(rules.to_values(GRPC_RESTRICTED_HEADER_PREFIX)),
    ),
    _bool_flag(
        "--grpc-use-ssl",
        "grpc_use_ssl",
        GRPC_ROLES,
        "serve gRPC over TLS with --grpc-server-cert and --grpc-server-key (default false)",
    ),
    _bool_flag(
        "--grpc-use-ssl-mutual",
        "grpc_use_ssl_mutual",
        GRPC_ROLES,
        "TLS that also requires a client certificate signed by --grpc-root-cert; "
        "wins over --grpc-use-ssl (default false)",
    ),
    _file_flag("--grpc-server-cert", "grpc_server_cert", "PEM server certificate"),
    _file_flag("--grpc-server-key", "grpc_server_key", "PEM server key"),
    _file_flag(
        "--grpc-root-cert", "grpc_root_cert", "PEM root certificate that client certificates need"
    ),
    Flag(
        "--grpc-infer-response-compression-level",
        "grpc_infer_response_compression_level",
        GRPC_ROLES,
        "compress infer responses: none (default), low, medium or high",
        type=str.lower,
        choices=tuple(CompressionLevel),
        read=CompressionLevel,
    ),
    _millis_flag(
        "--grpc-keepalive-time",
        "grpc_keepalive_time_ms",
        "ping an idle connection after this long (default 7200000)",
    ),
    _millis_flag(
        "--grpc-keepalive-timeout",
        "grpc_keepalive_timeout_ms",
        "close the connection when a ping is not answered in this long (default 20000)",
    ),
    _bool_flag(
        "--grpc-keepalive-permit-without-calls",
        "grpc_keepalive_permit_without_calls",
        GRPC_ROLES,
        "keepalive pings also when no call is in flight (default false)",
    ),
    Flag(
        "--grpc-http2-max-pings-without-data",
        "grpc_http2_max_pings_without_data",
        GRPC_ROLES,
        "pings sent with no data frame between them; 0: no limit (default 2)",
        type=int,
        metavar="N",
    ),
    _millis_flag(
        "--grpc-http2-min-recv-ping-interval-without-data",
        "grpc_http2_min_recv_ping_interval_without_data_ms",
        "a client ping sooner than this after the last, with no data, is a strike (default 300000)",
    ),
    Flag(
        "--grpc-http2-max-ping-strikes",
        "grpc_http2_max_ping_strikes",
        GRPC_ROLES,
        "strikes before the connection is closed (GOAWAY); 0: no limit (default 2)",
        type=int,
        metavar="N",
    ),
    _millis_flag(
        "--grpc-max-connection-age",
        "grpc_max_connection_age_ms",
        "close a connection this old, gracefully (default: no limit)",
    ),
    _millis_flag(
        "--grpc-max-connection-age-grace",
        "grpc_max_connection_age_grace_ms",
        "calls still running on a connection past its age get this long (default: no limit)",
    ),
    *(_ignored_flag(name) for name in IGNORED_GRPC_FLAGS),
    _bool_flag(
        "--batch-jobs",
        "batch_jobs",
        WORKER_ROLES,
        "run batch jobs' drivers (default true). false: never, for the workers of a group "
        "whose autoscaler does not count the jobs (no --jobs) and so could retire one "
        "mid-job. conch's own: Triton has no batch jobs",
    ),
    _count_flag(
        "--job-concurrency",
        "job_concurrency",
        WORKER_ROLES,
        "jobs this worker's drivers run at once: batch jobs and ensembles' async jobs "
        "(default 4). conch's own: Triton has no jobs",
    ),
    Flag(
        "--models",
        "models",
        WORKER_ROLES,
        "comma-separated models this worker serves (default: all); '\\,' is a comma inside a name",
        read=_model_list,
        as_args=_model_list_args,
    ),
    Flag(
        "--workers",
        "workers",
        SCALE_ROLES,
        "run MIN to MAX workers, started and retired on the work their models owe "
        "(conch serve: instead of one worker; MIN 0 scales to zero)",
        metavar="MIN:MAX",
        read=WorkerRange.parse,
        as_args=lambda name, workers: [name, str(workers)] if workers else [],
    ),
    _bounded_flag(
        "--target-work-per-worker",
        "target_work_per_worker",
        SCALE_ROLES,
        "workers wanted = ceil(owed work / N), owed work being the group's requests waiting "
        "plus those in flight on a worker (default 10)",
        0.0,
        kind=float,
        inclusive=False,
    ),
    _bounded_flag(
        "--activation-work",
        "activation_work",
        SCALE_ROLES,
        "with MIN 0: the first worker starts once owed work is above N (default 0)",
        0,
    ),
    _bounded_flag(
        "--scale-down-cooldown-secs",
        "scale_down_cooldown_secs",
        SCALE_ROLES,
        "retire a worker only once fewer have been wanted for this long (default 300)",
        0.0,
        kind=float,
        metavar="S",
    ),
    _bounded_flag(
        "--scale-poll-secs",
        "scale_poll_secs",
        SCALE_ROLES,
        "how often the autoscaler reads the queues (default 2)",
        0.0,
        kind=float,
        metavar="S",
        inclusive=False,
    ),
    Flag(
        "--jobs",
        "scale_on_jobs",
        frozenset({Role.AUTOSCALE}),
        "count the batch jobs queue (jobs waiting and running) in the work owed: for the "
        "one group that runs batch jobs (the others' workers get --batch-jobs=false), so "
        "jobs wake it at zero (conch serve --workers: unless --batch-jobs=false)",
        action="store_true",
        read=lambda on: True if on else None,
        as_args=lambda name, on: [name] if on else [],
    ),
    Flag(
        "--scale-to-zero",
        "scale_to_zero",
        FRONTEND_ROLES,
        "these models (all when no list is given) may have no worker by design: with none "
        "live they read as ready and their requests wait in the queue, within their "
        "timeout, for an autoscaler to start one; '\\,' is a comma inside a name",
        metavar="MODEL,...",
        nargs="?",
        const="*",
        read=_model_list,
        as_args=_model_list_args,
    ),
)


def add_arguments(parser: argparse.ArgumentParser, role: Role | str) -> None:
    """The flags of subcommand ``role``, in ``FLAGS`` order."""
    for flag in FLAGS:
        if role in flag.roles:
            flag.add_to(parser)


__all__ = [
    "FLAGS",
    "GEVENT_WORKER",
    "IGNORED_GRPC_FLAGS",
    "BackendConfig",
    "CompressionLevel",
    "Flag",
    "LogFormat",
    "ModelControlMode",
    "Role",
    "Settings",
    "WorkerRange",
    "add_arguments",
    "flag_field",
]
