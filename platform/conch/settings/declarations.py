"""``Settings``: every setting of every role, each declared once with ``setting()``.

The field-specific readers and writers of flag values (model lists, repositories, byte
sizes, Triton's ignored flags) sit beside the one field that uses each; ``FLAGS`` and
``add_arguments`` are bound from these declarations once, at import.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from conch.core.byte_sizes import parse_byte_size
from conch.core.cache_config import CacheConfig
from conch.core.inference import MAX_STREAM_KEEP_S
from conch.core.metrics_config import MetricsConfig
from conch.core.restricted_apis import RestrictedApis, group_names
from conch.core.trace_config import TraceConfig
from conch.settings.flags import (
    ALL_ROLES,
    FRONTEND_ROLES,
    GRPC_ROLES,
    HTTP_ROLES,
    SCALE_ROLES,
    SERVE_ONLY,
    WORKER_ROLES,
    Flag,
    at_least,
    between,
    declared_flags,
    env_parsers,
    no_args,
    repeated_args,
    setting,
)
from conch.settings.values import (
    CACHE_CONFIG_ENV,
    GEVENT_WORKER,
    GRPC_RESTRICTED_HEADER_PREFIX,
    GRPC_SHARED_PORT_ENV,
    LOCAL_REDIS_URL,
    RESTRICTED_API_ENV,
    RESTRICTED_PROTOCOL_ENV,
    BackendConfig,
    CompressionLevel,
    GrpcTransport,
    InstanceForm,
    LogFormat,
    ModelControlMode,
    RateLimitMode,
    RateLimitResources,
    Role,
    WorkerRange,
    default_http_workers,
    is_remote_repository,
)

NO_SAGEMAKER = "conch serves no SageMaker endpoint"
NO_VERTEX_AI = "conch serves no Vertex AI endpoint"


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


def _repositories(values: Iterable[str]) -> tuple[Path | str, ...]:
    """``--model-repository`` values: a URL of object storage kept as given, a folder made
    absolute; one given twice is refused, as it would serve each of its models twice."""
    out: list[Path | str] = []
    for value in values:
        spec: Path | str = value if is_remote_repository(value) else Path(value).resolve()
        if spec in out:
            raise ValueError(f"--model-repository {value} is given twice")
        out.append(spec)
    return tuple(out)


def _byte_size(text: str) -> int:
    try:
        return parse_byte_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _verbosity(text: str) -> int:
    """``--log-verbose``'s value: a level, or true/false (1/0), any case, as Triton reads it."""
    word = text.strip().lower()
    if word in ("true", "false"):
        return int(word == "true")
    try:
        return int(word)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value for --log-verbose: {text!r}") from None


def _switch_args(name: str, on: bool) -> list[str]:
    """A switch written back only when on."""
    return [name] if on else []


def _cache_byte_size(size: int) -> CacheConfig | None:
    """``--response-cache-byte-size N``: Triton's older spelling of a local cache of N bytes."""
    if size < 0:
        raise ValueError(f"--response-cache-byte-size {size}: must be 0 or more")
    return CacheConfig.parse([f"local,size={size}"]) if size else None


def _ignored(name: str, reason: str, metavar: str | None = None, **kwargs: Any) -> Flag:
    """A tritonserver flag that tunes what conch does not have (Triton's memory pools, its
    shared libraries' folders, endpoints conch does not serve): any subcommand takes it, so
    that a Triton launch line starts unchanged, and the CLI names it once with ``reason``."""
    return Flag(
        name, ALL_ROLES, f"Triton's; ignored: {reason}", metavar=metavar, ignored=reason, **kwargs
    )


def _seconds(flag: str, value: int) -> int:
    """A duration in whole seconds, 0 included."""
    if value < 0:
        raise ValueError(f"{flag} {value}: must be 0 or more")
    return value


def _given(value: Any) -> Any:
    """Empty text or 0 counts as not given."""
    return value or None


def _millis(name: str, help: str) -> Flag:
    """A gRPC transport duration, in milliseconds as Triton takes it."""
    return Flag(name, GRPC_ROLES, help, metavar="MS")


def _tls_file(name: str, help: str) -> Flag:
    """A gRPC TLS file flag (read only when TLS is on)."""
    return Flag(name, GRPC_ROLES, help, metavar="FILE", read=_given)


def _pool_size(name: str) -> Flag:
    """One of Triton's sizes of its own pools of request and response objects."""
    return Flag(
        name,
        GRPC_ROLES,
        "Triton's; ignored (grpcio keeps its own pools)",
        metavar="N",
        read=_given,
        as_args=lambda flag, n: [flag, str(n)] if n else [],
        ignored="grpcio keeps its own pools of requests and responses",
    )


@dataclass
class Settings:
    """Every setting of every role, each declared once (see the module's docstring)."""

    # What Triton takes: folders, or object storage, which the CLI mirrors into local
    # caches (conch.cli.repository_mirror) before a role starts, so the roles read folders.
    model_repository: tuple[Path | str, ...] = setting(
        (Path("functions"),),
        Flag(
            "--model-repository",
            ALL_ROLES,
            "a Triton-layout model repository to serve: a folder, s3://bucket/path, "
            "s3://host:port/bucket/path, gs://bucket/path or as://account/container/path; "
            "repeat it for several",
            metavar="DIR|URL",
            action="append",
            read=_repositories,
            as_args=lambda name, values: repeated_args(name, [str(v) for v in values]),
        ),
        # Triton's older name of the same flag; written back as the one above.
        Flag(
            "--model-store",
            ALL_ROLES,
            argparse.SUPPRESS,
            action="append",
            read=_repositories,
            as_args=no_args,
        ),
    )
    # Where object storage repositories are mirrored; empty: $XDG_CACHE_HOME/conch/repositories
    # (~/.cache/conch/repositories).
    model_repository_cache: str = setting(
        "",
        Flag(
            "--model-repository-cache",
            ALL_ROLES,
            "the folder where a --model-repository in object storage is mirrored "
            "(default: ~/.cache/conch/repositories)",
            metavar="DIR",
            read=_given,
        ),
        env="CONCH_MODEL_REPOSITORY_CACHE",
    )
    # Empty: a Redis answering on local_redis_url, else a private redis-server.
    redis_url: str = setting(
        "",
        Flag("--redis-url", ALL_ROLES, "the broker (default: $REDIS_URL)", read=_given),
        env="REDIS_URL",
    )
    # Tests point it at nothing.
    local_redis_url: str = setting(
        LOCAL_REDIS_URL,
        env="CONCH_LOCAL_REDIS_URL",
        help="the Redis tried when no --redis-url or $REDIS_URL is given, before a private "
        "redis-server is started",
    )
    log_verbose: int = setting(
        0,
        Flag(
            "--log-verbose", ALL_ROLES, "verbose logging when N > 0", metavar="N", type=_verbosity
        ),
    )
    log_info: bool = setting(True, Flag("--log-info", ALL_ROLES, "log info lines"))
    log_warning: bool = setting(True, Flag("--log-warning", ALL_ROLES, "log warnings"))
    log_error: bool = setting(True, Flag("--log-error", ALL_ROLES, "log errors"))
    log_format: LogFormat = setting(
        LogFormat.DEFAULT,
        Flag(
            "--log-format",
            ALL_ROLES,
            "default: lines start 'I0304 10:22:33.123456 <pid> <file>:<line>]'; "
            "ISO8601: '2024-03-04T10:22:33Z I <pid> <file>:<line>]' (UTC, as Triton); "
            "json (conch's): one JSON object a line",
        ),
    )
    log_file: str = setting(
        "",
        Flag(
            "--log-file",
            ALL_ROLES,
            "append the log to this file instead of writing it to stderr",
            metavar="FILE",
            read=_given,
        ),
    )
    # Triton's: on SIGTERM, the gateway's graceful timeout and the worker's warm shutdown.
    exit_timeout_secs: int = setting(
        30,
        Flag(
            "--exit-timeout-secs",
            ALL_ROLES,
            "on SIGTERM, in-flight work gets this long to finish before the process exits",
            metavar="S",
            check=_seconds,
        ),
    )
    auto_complete: bool = setting(
        True,
        # Triton's older spelling, inverted: =true is no auto-complete, =false (what Triton
        # launch lines say) is auto-complete. Written back as the one below, which is read
        # after it and so wins when both are given, as in Triton.
        Flag(
            "--strict-model-config",
            ALL_ROLES,
            argparse.SUPPRESS,
            action="store_true",
            read=lambda strict: not strict,
            as_args=no_args,
        ),
        Flag(
            "--disable-auto-complete-config",
            ALL_ROLES,
            "do not complete configs from the models themselves",
            action="store_true",
            read=lambda on: False if on else None,
            as_args=lambda name, auto_complete: [] if auto_complete else [name],
        ),
    )
    backend_config: BackendConfig = setting(
        Flag(
            "--backend-config",
            ALL_ROLES,
            "Triton's form: [BACKEND,]default-max-batch-size=N is applied (for every "
            "backend, or for one); other settings are logged and ignored; repeatable",
            metavar="[BACKEND,]SETTING=VALUE",
            action="append",
        ),
        factory=BackendConfig,
    )
    # Requests with no "timeout" parameter wait this long for their reply.
    request_timeout_s: float = setting(
        60.0,
        Flag(
            "--request-timeout-secs",
            ALL_ROLES,
            "deadline of requests that set no 'timeout' parameter",
        ),
        env="CONCH_REQUEST_TIMEOUT_S",
    )
    # conch's own: a decoupled model's SSE stream is kept this long for a client that
    # reconnects with Last-Event-ID (conch.wire.stream_log); Triton has no such thing.
    stream_keep_s: int = setting(
        300,
        Flag(
            "--stream-keep-secs",
            FRONTEND_ROLES,
            "how long a streamed (SSE) request's responses are kept for a client that "
            "reconnects with Last-Event-ID; 0 keeps none (conch's own flag)",
            check=between(0, MAX_STREAM_KEEP_S),
        ),
        env="CONCH_STREAM_KEEP_S",
    )
    stream_grace_s: float = setting(
        10.0,
        Flag(
            "--stream-grace-secs",
            FRONTEND_ROLES,
            "how long a streamed request outlives its client's connection before it is "
            "cancelled, unless the client reconnects (conch's own flag)",
            check=at_least(2.0),
        ),
        env="CONCH_STREAM_GRACE_S",
    )
    # kombu's default is an hour.
    visibility_timeout_s: float = setting(
        6.0,
        env="CONCH_VISIBILITY_TIMEOUT_S",
        help="seconds after which the messages a dead worker held come back to their queue",
    )
    max_attempts: int = setting(
        3,
        env="CONCH_MAX_ATTEMPTS",
        help="tries of a request that keeps killing its workers before it is dead-lettered",
    )
    # Celery's result_expires; the job's record goes with its result.
    job_ttl_s: int = setting(86_400, env="CONCH_JOB_TTL_S", help="seconds a job's result is kept")
    # Bounds Redis's memory.
    max_queued_jobs: int = setting(
        100_000,
        env="CONCH_MAX_QUEUED_JOBS",
        help="async jobs one model's queue (or conch.jobs) may hold before a submission gets a 503",
    )
    model_control_mode: ModelControlMode = setting(
        ModelControlMode.NONE,
        Flag(
            "--model-control-mode",
            ALL_ROLES,
            "none: load everything at start; poll: follow repository changes; "
            "explicit: load and unload through the repository API",
        ),
    )
    repository_poll_secs: float = setting(
        15.0,
        Flag(
            "--repository-poll-secs",
            ALL_ROLES,
            "poll mode: how often to look for repository changes",
            metavar="S",
        ),
    )
    load_models: list[str] = setting(
        Flag(
            "--load-model",
            ALL_ROLES,
            "explicit mode: load this model at start ('*' for all); repeatable",
            metavar="MODEL",
            action="append",
            read=list,
            as_args=repeated_args,
        ),
        factory=list,
    )
    strict_readiness: bool = setting(
        True,
        Flag(
            "--strict-readiness",
            FRONTEND_ROLES,
            "/v2/health/ready waits for every model that should be loaded to be served by a "
            "live worker (default {default}; false: ready once the broker answers)",
        ),
    )
    bundle_requests: bool = setting(
        True,
        Flag(
            "--bundle-requests",
            FRONTEND_ROLES,
            "requests for one dynamically batched model that a process publishes in the "
            "same instant go to its queue as one message, a bundle (default {default}). "
            "conch's own",
        ),
        env="CONCH_BUNDLE_REQUESTS",
    )
    # Triton's metrics port: GET /metrics there, with Triton's nv_inference_* names.
    metrics_port: int = setting(
        8002, Flag("--metrics-port", HTTP_ROLES, "GET /metrics here (default {default}, Triton's)")
    )
    allow_metrics: bool = setting(
        True,
        Flag(
            "--allow-metrics",
            HTTP_ROLES,
            "serve metrics (default {default}; --allow-metrics=false to turn them off)",
        ),
    )
    metrics_address: str | None = setting(
        None,
        Flag(
            "--metrics-address",
            HTTP_ROLES,
            "the address the metrics port binds (default: --http-address's)",
            read=_given,
        ),
    )
    allow_cpu_metrics: bool = setting(
        True,
        Flag(
            "--allow-cpu-metrics",
            WORKER_ROLES,
            "workers report their host's CPU use and memory (nv_cpu_*; default {default})",
        ),
    )
    allow_gpu_metrics: bool = setting(
        True,
        Flag(
            "--allow-gpu-metrics",
            WORKER_ROLES,
            "workers report their GPUs' use, memory and power through NVML (nv_gpu_*; "
            "default {default}; needs the gpu extra, nvidia-ml-py, and a GPU)",
        ),
    )
    trace_config: TraceConfig = setting(
        Flag(
            "--trace-config",
            ALL_ROLES,
            "Triton's: mode=opentelemetry, opentelemetry,url=<host:port/path> (OTLP/HTTP), "
            "rate=<N> (one trace in N), count=<N> (-1: no limit), level=OFF|TIMESTAMPS; "
            "repeatable; give it to workers too (they send the queue and batch spans)",
            metavar="KEY=VALUE",
            action="append",
        ),
        factory=TraceConfig,
    )
    # Triton's: latency counters, summaries, the first-response histogram.
    metrics_config: MetricsConfig = setting(
        Flag(
            "--metrics-config",
            ALL_ROLES,
            "Triton's: counter_latencies=<bool>, summary_latencies=<bool>, "
            "summary_quantiles=<q>:<error>,..., histogram_latencies=<bool>; repeatable; "
            "give it to workers too (they keep the samples summaries are computed from)",
            metavar="KEY=VALUE",
            action="append",
        ),
        factory=MetricsConfig,
    )
    metrics_interval_ms: int = setting(
        2000,
        Flag(
            "--metrics-interval-ms",
            WORKER_ROLES,
            "how often workers sample CPU and GPU use (at most; they report it with each "
            "heartbeat; default {default})",
            metavar="MS",
            check=at_least(1),
        ),
    )
    # Triton's shared-memory extension (conch.frontend.shared_memory): off unless asked for.
    allow_client_shm: bool = setting(
        False,
        Flag(
            "--allow-client-shm",
            FRONTEND_ROLES,
            "let clients register system shared-memory regions (/dev/shm) and give infer "
            "inputs and outputs in them, over HTTP and gRPC (default {default}, as Triton's "
            "flag of that name; its APIs form the restricted group 'shared-memory'). Zero-copy "
            "ends at the frontend: tensors still cross Redis to the worker",
        ),
        env="CONCH_ALLOW_CLIENT_SHM",
    )
    # Its environment variable holds the flag's values one per line: conch serve hands the
    # secrets to its gateway that way, out of the process list.
    http_restricted_api: RestrictedApis = setting(
        Flag(
            "--http-restricted-api",
            HTTP_ROLES,
            "requests to these APIs need header HEADER with value VALUE (403 otherwise); "
            f"repeatable, each API in one flag at most. APIs: {group_names()}",
            metavar="API,...:HEADER=VALUE",
            action="append",
            read=RestrictedApis.parse,
            as_args=lambda name, rules: repeated_args(name, rules.to_values()),
            to_env=lambda rules: "\n".join(rules.to_values()),
        ),
        factory=RestrictedApis,
        env=RESTRICTED_API_ENV,
        parse=lambda text: RestrictedApis.parse(text.splitlines()),
    )
    # Its environment variable holds the flag's values one per line (a Redis password
    # reaches conch serve's children that way, out of the process list).
    cache_config: CacheConfig | None = setting(
        None,
        Flag(
            "--cache-config",
            FRONTEND_ROLES,
            "Triton's response cache, for models whose config sets response_cache { enable: "
            "true }: local,size=BYTES (each frontend process its own) or redis,host=H,port=P"
            "[,password=..][,db=N][,size=BYTES] (one cache shared by every frontend); "
            "repeatable, keys add up",
            metavar="CACHE,KEY=VALUE",
            action="append",
            read=CacheConfig.parse,
            to_env=lambda config: "\n".join(config.to_values()) if config else "",
        ),
        # Triton's older spelling of a local cache; refused beside --cache-config, as in
        # Triton. It reaches children as the --cache-config above (in the environment).
        Flag(
            "--response-cache-byte-size",
            FRONTEND_ROLES,
            "Triton's older form of --cache-config local,size=BYTES (0: no cache)",
            metavar="BYTES",
            type=int,
            read=_cache_byte_size,
            as_args=no_args,
        ),
        env=CACHE_CONFIG_ENV,
        parse=lambda text: CacheConfig.parse(text.splitlines()),
    )
    # Beyond Triton: the load API's file: parameters (model code and weights from the
    # client) are refused unless this is on.
    allow_model_upload: bool = setting(
        False,
        Flag(
            "--allow-model-upload",
            FRONTEND_ROLES,
            "let the load API take model files ('file:' parameters) from the client: "
            "code the workers will run (default {default})",
            nargs="?",
            const=True,
            as_args=_switch_args,
        ),
    )
    # The gateway's sockets and processes (gunicorn's bind, workers and threads).
    http_port: int = setting(8000, Flag("--http-port", HTTP_ROLES, "the HTTP port"))
    http_address: str = setting(
        "0.0.0.0",
        Flag("--http-address", HTTP_ROLES, "the address the HTTP port binds", read=_given),
    )
    http_thread_count: int = setting(
        64, Flag("--http-thread-count", HTTP_ROLES, "threads per gateway process")
    )
    # On a 2-core host that also runs the worker (conch serve), one gevent process beat
    # two (bench/README.md).
    http_workers: int = setting(
        Flag(
            "--http-workers",
            HTTP_ROLES,
            "gateway processes (default: half the cores, 1 to 2)",
        ),
        factory=lambda: default_http_workers(os.cpu_count()),
    )
    http_worker_class: str = setting(
        GEVENT_WORKER,
        env="CONCH_HTTP_WORKER_CLASS",
        help="the gateway's gunicorn worker class (gthread, say, instead of conch's gevent worker)",
    )
    # Triton's --http-max-input-size: the largest body, and gRPC message, taken.
    max_input_bytes: int = setting(
        64 * 1024 * 1024,
        Flag(
            "--http-max-input-size",
            FRONTEND_ROLES,
            "the largest request body (and gRPC request message) taken, in bytes",
            metavar="BYTES",
            read=_given,
        ),
        env="CONCH_MAX_INPUT_BYTES",
    )
    allow_http: bool = setting(True, Flag("--allow-http", SERVE_ONLY, "serve the HTTP frontend"))
    allow_grpc: bool = setting(True, Flag("--allow-grpc", SERVE_ONLY, "serve the gRPC frontend"))
    grpc_port: int = setting(8001, Flag("--grpc-port", GRPC_ROLES, "the gRPC port"))
    grpc_address: str = setting(
        "0.0.0.0",
        Flag("--grpc-address", GRPC_ROLES, "the address the gRPC port binds", read=_given),
    )
    # conch's default, not Triton's: each call holds its thread while its request waits in
    # the queue, so the pool bounds the calls in flight.
    grpc_infer_thread_count: int = setting(
        64,
        Flag(
            "--grpc-infer-thread-count",
            GRPC_ROLES,
            "unary calls the gRPC server runs at once (on grpcio a stream counts as one), "
            "and each stream's requests at once; each holds its thread while its request "
            "is queued (default {default}; Triton's is 2)",
        ),
    )
    # grpcio's server is bound by its process's GIL (bench/README.md).
    grpc_workers: int = setting(
        Flag(
            "--grpc-workers",
            GRPC_ROLES,
            "gRPC server processes, sharing the port (SO_REUSEPORT); conch's own flag, "
            "Triton has none (default: as --http-workers)",
            metavar="N",
            check=at_least(1),
        ),
        factory=lambda: default_http_workers(os.cpu_count()),
    )
    grpc_transport: GrpcTransport = setting(
        GrpcTransport.H2,
        Flag(
            "--grpc-transport",
            GRPC_ROLES,
            "what serves gRPC's HTTP/2: grpcio, grpcio's server with a thread per call; or "
            "h2, the h2 library on gevent with a greenlet per call (default {default}). "
            "conch's own",
        ),
        env="CONCH_GRPC_TRANSPORT",
    )
    # They bind the port with SO_REUSEPORT, after conch grpc checked that it was free.
    grpc_shared_port: bool = setting(
        False,
        env=GRPC_SHARED_PORT_ENV,
        help="set by conch grpc for the processes it starts when --grpc-workers is above 1; "
        "not for users",
    )
    # A secret, so handed to children in the environment, as --http-restricted-api.
    grpc_restricted_protocol: RestrictedApis = setting(
        Flag(
            "--grpc-restricted-protocol",
            GRPC_ROLES,
            "RPCs of these groups need gRPC metadata triton-grpc-protocol-KEY with value "
            f"VALUE (UNAVAILABLE otherwise); repeatable. Groups: {group_names()}",
            metavar="PROTOCOL,...:KEY=VALUE",
            action="append",
            read=_parse_protocols,
            as_args=lambda name, rules: repeated_args(
                name, rules.to_values(GRPC_RESTRICTED_HEADER_PREFIX)
            ),
            to_env=lambda rules: "\n".join(rules.to_values(GRPC_RESTRICTED_HEADER_PREFIX)),
        ),
        factory=RestrictedApis,
        env=RESTRICTED_PROTOCOL_ENV,
        parse=lambda text: _parse_protocols(text.splitlines()),
    )
    grpc_use_ssl: bool = setting(
        False,
        Flag(
            "--grpc-use-ssl",
            GRPC_ROLES,
            "serve gRPC over TLS with --grpc-server-cert and --grpc-server-key",
        ),
    )
    grpc_use_ssl_mutual: bool = setting(
        False,
        Flag(
            "--grpc-use-ssl-mutual",
            GRPC_ROLES,
            "TLS that also requires a client certificate signed by --grpc-root-cert; "
            "wins over --grpc-use-ssl",
        ),
    )
    grpc_server_cert: str = setting("", _tls_file("--grpc-server-cert", "PEM server certificate"))
    grpc_server_key: str = setting("", _tls_file("--grpc-server-key", "PEM server key"))
    grpc_root_cert: str = setting(
        "", _tls_file("--grpc-root-cert", "PEM root certificate that client certificates need")
    )
    grpc_infer_response_compression_level: CompressionLevel = setting(
        CompressionLevel.NONE,
        Flag(
            "--grpc-infer-response-compression-level",
            GRPC_ROLES,
            "compress infer responses: none, low, medium or high",
            type=str.lower,  # Triton lower-cases the level
        ),
    )
    # Triton's keepalive flags, with Triton's (and gRPC core's) defaults.
    grpc_keepalive_time_ms: int = setting(
        7_200_000, _millis("--grpc-keepalive-time", "ping an idle connection after this long")
    )
    grpc_keepalive_timeout_ms: int = setting(
        20_000,
        _millis(
            "--grpc-keepalive-timeout",
            "close the connection when a ping is not answered in this long",
        ),
    )
    grpc_keepalive_permit_without_calls: bool = setting(
        False,
        Flag(
            "--grpc-keepalive-permit-without-calls",
            GRPC_ROLES,
            "keepalive pings also when no call is in flight",
        ),
    )
    grpc_http2_max_pings_without_data: int = setting(
        2,
        Flag(
            "--grpc-http2-max-pings-without-data",
            GRPC_ROLES,
            "pings sent with no data frame between them; 0: no limit",
            metavar="N",
        ),
    )
    grpc_http2_min_recv_ping_interval_without_data_ms: int = setting(
        300_000,
        _millis(
            "--grpc-http2-min-recv-ping-interval-without-data",
            "a client ping sooner than this after the last, with no data, is a strike",
        ),
    )
    grpc_http2_max_ping_strikes: int = setting(
        2,
        Flag(
            "--grpc-http2-max-ping-strikes",
            GRPC_ROLES,
            "strikes before the connection is closed (GOAWAY); 0: no limit",
            metavar="N",
        ),
    )
    # 0: no limit (Triton's default, "undefined").
    grpc_max_connection_age_ms: int = setting(
        0,
        _millis(
            "--grpc-max-connection-age",
            "close a connection this old, gracefully (default: no limit)",
        ),
    )
    grpc_max_connection_age_grace_ms: int = setting(
        0,
        _millis(
            "--grpc-max-connection-age-grace",
            "calls still running on a connection past its age get this long (default: no limit)",
        ),
    )
    grpc_infer_allocation_pool_size: int = setting(
        0, _pool_size("--grpc-infer-allocation-pool-size")
    )
    grpc_max_response_pool_size: int = setting(0, _pool_size("--grpc-max-response-pool-size"))
    batch_jobs: bool = setting(
        True,
        Flag(
            "--batch-jobs",
            WORKER_ROLES,
            "run batch jobs' drivers (default {default}). false: never, for the workers of a "
            "group whose autoscaler does not count the jobs (no --jobs) and so could retire "
            "one mid-job. conch's own: Triton has no batch jobs",
        ),
    )
    # Celery's thread pool on conch.jobs: ensembles' async jobs must not wait for a long
    # batch job to end.
    job_concurrency: int = setting(
        4,
        Flag(
            "--job-concurrency",
            WORKER_ROLES,
            "jobs this worker's drivers run at once: batch jobs and ensembles' async jobs "
            "(default {default}). conch's own: Triton has no jobs",
            metavar="N",
            check=at_least(1),
        ),
    )
    instance_form: InstanceForm = setting(
        InstanceForm.THREAD,
        Flag(
            "--instance-form",
            WORKER_ROLES,
            "how each model instance runs: thread (a drain loop in the worker process) or "
            "process (a child process per instance, with its own interpreter); a model's "
            "config parameter instance_form wins (default {default}). conch's own",
        ),
        env="CONCH_INSTANCE_FORM",
    )
    # None: every model.
    models: list[str] | None = setting(
        None,
        Flag(
            "--models",
            WORKER_ROLES,
            "comma-separated models this worker serves (default: all); '\\,' is a comma "
            "inside a name",
            read=_model_list,
            as_args=_model_list_args,
        ),
    )
    # The local autoscaler, and the formula it shares with the chart
    # (conch.wire.work_owed.desired_workers). None: conch serve runs one worker.
    workers: WorkerRange | None = setting(
        None,
        Flag(
            "--workers",
            SCALE_ROLES,
            "run MIN to MAX workers, started and retired on the work their models owe "
            "(conch serve: instead of one worker; MIN 0 scales to zero)",
            metavar="MIN:MAX",
            read=WorkerRange.parse,
            as_args=lambda name, workers: [name, str(workers)] if workers else [],
        ),
    )
    target_work_per_worker: float = setting(
        10.0,
        Flag(
            "--target-work-per-worker",
            SCALE_ROLES,
            "workers wanted = ceil(owed work / N), owed work being the group's requests "
            "waiting plus those in flight on a worker (default {default})",
            metavar="N",
            check=at_least(0.0, inclusive=False),
        ),
    )
    activation_work: int = setting(
        0,
        Flag(
            "--activation-work",
            SCALE_ROLES,
            "with MIN 0: the first worker starts once owed work is above N (default {default})",
            metavar="N",
            check=at_least(0),
        ),
    )
    scale_down_cooldown_secs: float = setting(
        300.0,
        Flag(
            "--scale-down-cooldown-secs",
            SCALE_ROLES,
            "retire a worker only once fewer have been wanted for this long (default {default})",
            metavar="S",
            check=at_least(0.0),
        ),
    )
    scale_poll_secs: float = setting(
        2.0,
        Flag(
            "--scale-poll-secs",
            SCALE_ROLES,
            "how often the autoscaler reads the queues (default {default})",
            metavar="S",
            check=at_least(0.0, inclusive=False),
        ),
    )
    # conch serve --workers turns it on (unless --batch-jobs=false).
    scale_on_jobs: bool = setting(
        False,
        Flag(
            "--jobs",
            frozenset({Role.AUTOSCALE}),
            "count the batch jobs queue (jobs waiting and running) in the work owed: for the "
            "one group that runs batch jobs (the others' workers get --batch-jobs=false), so "
            "jobs wake it at zero (conch serve --workers: unless --batch-jobs=false)",
            action="store_true",
            read=lambda on: True if on else None,
            as_args=_switch_args,
        ),
    )
    # ["*"]: every model.
    scale_to_zero: list[str] = setting(
        Flag(
            "--scale-to-zero",
            FRONTEND_ROLES,
            "these models (all when no list is given) may have no worker by design: with "
            "none live they read as ready and their requests wait in the queue, within "
            "their timeout, for an autoscaler to start one; '\\,' is a comma inside a name",
            metavar="MODEL,...",
            nargs="?",
            const="*",
            read=_model_list,
            as_args=_model_list_args,
        ),
        factory=list,
    )
    # boto3 reads the rest of the AWS settings itself.
    s3_region: str | None = setting(
        None, env=("AWS_DEFAULT_REGION", "AWS_REGION"), help="batch jobs' S3 region"
    )
    # Triton's rate limiter, with Triton's grammar, applied across the fleet by the workers
    # (conch.worker.rate_limiter, conch.wire.rate_limits).
    rate_limit: RateLimitMode = setting(
        RateLimitMode.OFF,
        Flag(
            "--rate-limit",
            WORKER_ROLES,
            "Triton's rate limiter mode: off, or execution_count (each instance executes "
            "while it holds the resources its rate_limiter asks for, counted across workers)",
            type=str.lower,  # Triton lower-cases the mode
            as_args=lambda name, mode: [] if mode is RateLimitMode.OFF else [name, str(mode)],
        ),
    )
    rate_limit_resources: RateLimitResources = setting(
        Flag(
            "--rate-limit-resource",
            WORKER_ROLES,
            "Triton's: how many of a resource the rate limiter has, on every device or on "
            "the one given; repeatable",
            metavar="NAME:COUNT[:DEVICE]",
            action="append",
        ),
        factory=RateLimitResources,
    )
    # conch's own: a worker keeps its models resident within this many bytes, loading one
    # when work for it waits and unloading the least recently used (conch.worker.residency);
    # 0: every model is loaded at start and stays.
    model_memory_budget: int = setting(
        0,
        Flag(
            "--model-memory-budget",
            WORKER_ROLES,
            "keep models resident within SIZE (e.g. 4G): a model is loaded when work for it "
            "waits, and the least recently used unloaded to make room; 0: all stay loaded",
            type=_byte_size,
            metavar="SIZE",
            as_args=lambda name, size: [name, str(size)] if size else [],
        ),
        env="CONCH_MODEL_MEMORY_BUDGET",
        parse=parse_byte_size,
    )
    # Triton's: a worker exits when a model it serves from its start fails to load
    # (conch.worker.host). conch's default is false where Triton's is true: one worker
    # of a fleet serves many models, and one that exits over one of them takes the others
    # down with it, then fails again each time it is started.
    exit_on_error: bool = setting(
        False,
        Flag(
            "--exit-on-error",
            WORKER_ROLES,
            "Triton's: exit (status 1, 'failed to load all models') when a model fails to "
            "load at start; false: it is unavailable with its reason and the others are "
            "served (default {default}, where Triton's is true)",
        ),
    )
    # Triton's: how many models a worker loads at once at its start (conch.worker.host).
    model_load_thread_count: int = setting(
        4,
        Flag(
            "--model-load-thread-count",
            WORKER_ROLES,
            "Triton's: how many models a worker loads at once at its start (default "
            "{default}, Triton's)",
            metavar="N",
            check=at_least(1),
        ),
    )
    # The rest of tritonserver's flags: what they tune conch does not have, so they are
    # taken (a Triton launch line starts unchanged) and named once as ignored when they
    # ask for something other than what conch does. A bool is named only when true.
    server_id: str | None = setting(
        None, _ignored("--id", "the server metadata's name is conch's", "ID")
    )
    model_config_name: str | None = setting(
        None, _ignored("--model-config-name", "models are read from their config.pbtxt", "NAME")
    )
    model_load_retry_count: int | None = setting(
        None,
        _ignored(
            "--model-load-retry-count",
            "a failed load is tried again when its files change (poll) or it is loaded again",
            "N",
            type=int,
        ),
    )
    model_namespacing: bool = setting(
        False,
        _ignored(
            "--model-namespacing",
            "a model name is served from the first repository that holds it",
        ),
    )
    enable_peer_access: bool | None = setting(
        None, _ignored("--enable-peer-access", "GPU peer access is the frameworks' to set up")
    )
    reuse_http_port: bool = setting(
        False,
        _ignored("--reuse-http-port", "the HTTP port is shared by conch's gateway processes only"),
    )
    http_header_forward_pattern: str | None = setting(
        None,
        _ignored(
            "--http-header-forward-pattern",
            "HTTP headers are not forwarded as request parameters",
            "REGEX",
        ),
    )
    reuse_grpc_port: bool = setting(
        False,
        _ignored("--reuse-grpc-port", "the gRPC port is shared by conch's --grpc-workers only"),
    )
    grpc_header_forward_pattern: str | None = setting(
        None,
        _ignored(
            "--grpc-header-forward-pattern",
            "gRPC metadata is not forwarded as request parameters",
            "REGEX",
        ),
    )
    allow_sagemaker: bool = setting(False, _ignored("--allow-sagemaker", NO_SAGEMAKER))
    sagemaker_port: int | None = setting(
        None, _ignored("--sagemaker-port", NO_SAGEMAKER, "PORT", type=int)
    )
    sagemaker_safe_port_range: str | None = setting(
        None, _ignored("--sagemaker-safe-port-range", NO_SAGEMAKER, "LOW-HIGH")
    )
    sagemaker_thread_count: int | None = setting(
        None, _ignored("--sagemaker-thread-count", NO_SAGEMAKER, "N", type=int)
    )
    allow_vertex_ai: bool = setting(False, _ignored("--allow-vertex-ai", NO_VERTEX_AI))
    vertex_ai_port: int | None = setting(
        None, _ignored("--vertex-ai-port", NO_VERTEX_AI, "PORT", type=int)
    )
    vertex_ai_thread_count: int | None = setting(
        None, _ignored("--vertex-ai-thread-count", NO_VERTEX_AI, "N", type=int)
    )
    vertex_ai_default_model: str | None = setting(
        None, _ignored("--vertex-ai-default-model", NO_VERTEX_AI, "MODEL")
    )
    # Triton's deprecated tracing flags; --trace-config says the same and is applied.
    trace_file: str | None = setting(
        None, _ignored("--trace-file", "conch writes no trace files; see --trace-config", "FILE")
    )
    trace_level: list[str] = setting(
        _ignored("--trace-level", "use --trace-config level=...", "LEVEL", action="append"),
        factory=list,
    )
    trace_rate: int | None = setting(
        None, _ignored("--trace-rate", "use --trace-config rate=N", "N", type=int)
    )
    trace_count: int | None = setting(
        None, _ignored("--trace-count", "use --trace-config count=N", "N", type=int)
    )
    trace_log_frequency: int | None = setting(
        None,
        _ignored("--trace-log-frequency", "conch writes no trace files", "N", type=int),
    )
    backend_directory: str | None = setting(
        None,
        _ignored(
            "--backend-directory", "conch's backends are Python modules, not libraries", "DIR"
        ),
    )
    repoagent_directory: str | None = setting(
        None, _ignored("--repoagent-directory", "conch has no repository agents", "DIR")
    )
    cache_directory: str | None = setting(
        None,
        _ignored("--cache-directory", "conch's response caches are its own, not libraries", "DIR"),
    )
    pinned_memory_pool_byte_size: int | None = setting(
        None,
        _ignored(
            "--pinned-memory-pool-byte-size",
            "the frameworks allocate their own pinned host memory",
            "BYTES",
            type=int,
        ),
    )
    cuda_memory_pool_byte_size: list[str] = setting(
        _ignored(
            "--cuda-memory-pool-byte-size",
            "the frameworks allocate their own GPU memory",
            "DEVICE:BYTES",
            action="append",
        ),
        factory=list,
    )
    cuda_virtual_address_size: list[str] = setting(
        _ignored(
            "--cuda-virtual-address-size",
            "conch keeps implicit sequence state in Redis, not in GPU memory",
            "DEVICE:BYTES",
            action="append",
        ),
        factory=list,
    )
    min_supported_compute_capability: float | None = setting(
        None,
        _ignored(
            "--min-supported-compute-capability",
            "a backend uses the GPUs its framework can use",
            "CC",
            type=float,
        ),
    )
    buffer_manager_thread_count: int | None = setting(
        None,
        _ignored(
            "--buffer-manager-thread-count",
            "conch has no pool of tensor-copy threads",
            "N",
            type=int,
        ),
    )
    host_policy: list[str] = setting(
        _ignored(
            "--host-policy",
            "NUMA nodes and CPU cores are the deployment's to pin (taskset, a cpuset)",
            "POLICY,SETTING=VALUE",
            action="append",
        ),
        factory=list,
    )
    model_load_gpu_limit: list[str] = setting(
        _ignored(
            "--model-load-gpu-limit",
            "a load is not refused on the GPU memory in use",
            "DEVICE:FRACTION",
            action="append",
        ),
        factory=list,
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The defaults, with what the environment sets (an empty variable counts as unset)."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            for name in f.metadata["env"]:
                raw = environ.get(name)
                if raw:
                    try:
                        values[f.name] = _ENV_PARSERS[f.name](raw)
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
        parsed = vars(namespace)
        if parsed.get("response_cache_byte_size") is not None and parsed.get("cache_config"):
            raise ValueError(
                "--response-cache-byte-size and --cache-config are both given: give one or "
                "the other (--response-cache-byte-size N is --cache-config local,size=N)"
            )
        if "model_repository" in parsed:  # a role's parser: a repository is required
            stores = [
                spec
                for given in (parsed.get("model_repository"), parsed.get("model_store"))
                for spec in (given if isinstance(given, list) else [given] if given else [])
            ]
            if not stores:
                raise ValueError(
                    "--model-repository is required: a folder, or s3://, gs:// or as:// URL"
                )
            namespace.model_repository = stores
            namespace.model_store = None
        for flag in FLAGS:
            given = getattr(namespace, flag.dest, None)
            value = None if given is None else flag.value(given)
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
        env_names = {f.name: f.metadata["env"] for f in fields(self)}
        env: dict[str, str] = {}
        for flag in FLAGS:
            if role in flag.roles and flag.to_env is not None:
                text = flag.to_env(getattr(self, flag.field))
                if text:
                    env[env_names[flag.field][0]] = text
        return env

    def __post_init__(self) -> None:
        # One repository may be given alone (Settings(model_repository=path)), or a list.
        if isinstance(self.model_repository, str | Path):
            self.model_repository = (self.model_repository,)
        self.model_repository = tuple(self.model_repository)

    @property
    def repository_folders(self) -> tuple[Path, ...]:
        """The model repositories as folders: every role reads these (a URL is mirrored
        into a folder before a role starts, ``conch.cli.repository_mirror``)."""
        remote = [str(r) for r in self.model_repository if not isinstance(r, Path)]
        if remote:
            raise ValueError(f"--model-repository {remote[0]} is not mirrored into a folder")
        return tuple(Path(r) for r in self.model_repository)

    def model_folder(self, name: str) -> Path:
        """Model ``name``'s folder: in the first repository that has it, else where the
        first repository would hold it."""
        folders = self.repository_folders
        return next((f / name for f in folders if (f / name).is_dir()), folders[0] / name)

    def scales_to_zero(self, model: str) -> bool:
        """``--scale-to-zero`` names ``model`` (or every model)."""
        return "*" in self.scale_to_zero or model in self.scale_to_zero

    @property
    def http_worker_uses_gevent(self) -> bool:
        """The gateway runs under gevent: the process must be patched before redis loads."""
        return self.http_worker_class == GEVENT_WORKER or "gevent" in self.http_worker_class


FLAGS = declared_flags(Settings)
_ENV_PARSERS = env_parsers(Settings)


def add_arguments(parser: argparse.ArgumentParser, role: Role | str) -> None:
    """The flags of subcommand ``role``, in ``FLAGS`` order."""
    for flag in FLAGS:
        if role in flag.roles:
            flag.add_to(parser)
