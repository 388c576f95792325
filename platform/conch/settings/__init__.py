"""Runtime settings shared by the gateway, the worker and ``conch serve``.

This package is the one reader of conch's configuration. Flags win over environment
variables, which win over the defaults. Each setting is declared once, as a field of
``Settings`` made by ``setting()``: its type, its default, the environment variables that
can set it (``CONCH_*``, ``REDIS_URL``, ``AWS_DEFAULT_REGION``/``AWS_REGION``), and its
command-line flags (``Flag``: Triton's names where Triton has them, the subcommands that
take it, its help, and the check its value must pass). What a flag does with its value
follows from the field's type unless the flag says otherwise: a ``bool`` takes Triton's
``--flag=true|false`` (on/off/1/0 too, any case; bare ``--flag`` is true), an ``int`` or ``float`` is parsed as one, a ``StrEnum`` gives the
choices, and a config class with ``parse`` and ``items`` takes a repeatable flag's values
together and writes them back. A help text shows the field's default, never a copy of it: ``{default}`` in the
text, or ``(default X)`` added when the text does not speak of a default.

``FLAGS`` is every flag, in declaration order, bound to its field.
``Settings.from_env()`` reads the environment; ``Settings.from_args(namespace)`` adds the
flags a command line gave (argparse defaults are all None, so only given flags count);
``settings.to_args(role)`` writes the flags that reproduce a Settings for one subcommand,
which is how ``conch serve`` starts its worker and gateway. Settings that have no flag
(the visibility timeout, attempts, job limits, the HTTP worker class, the local Redis
probe, the S3 region) reach those children through the environment they inherit.

The package has one concept a module, each importing only those before it:
``values`` (the types a setting holds), ``flags`` (``Flag``, ``setting()`` and how a flag
reads and writes its field) and ``declarations`` (``Settings``, ``FLAGS``). Of conch, it
imports only the core's parsers of Triton's flag values (``restricted_apis``,
``cache_config``, ``metrics_config``, ``trace_config``, ``byte_sizes``) and one bound of
``inference``, which import nothing but the standard library: the gateway reads its
Settings before gevent patches the process, and that must happen before redis is imported
(a contract in pyproject.toml keeps it so).
"""

from __future__ import annotations

from conch.settings.declarations import (
    FLAGS,
    Settings,
    add_arguments,
)
from conch.settings.flags import (
    ALL_ROLES,
    Flag,
    declared_flags,
    env_parsers,
    setting,
    shown_default,
)
from conch.settings.values import (
    GEVENT_WORKER,
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

__all__ = [
    "ALL_ROLES",
    "FLAGS",
    "GEVENT_WORKER",
    "GRPC_SHARED_PORT_ENV",
    "LOCAL_REDIS_URL",
    "RESTRICTED_API_ENV",
    "RESTRICTED_PROTOCOL_ENV",
    "BackendConfig",
    "CompressionLevel",
    "Flag",
    "GrpcTransport",
    "InstanceForm",
    "LogFormat",
    "ModelControlMode",
    "RateLimitMode",
    "RateLimitResources",
    "Role",
    "Settings",
    "WorkerRange",
    "add_arguments",
    "declared_flags",
    "default_http_workers",
    "env_parsers",
    "is_remote_repository",
    "setting",
    "shown_default",
]
