"""Running the gateway app under gunicorn, configured in code."""

from __future__ import annotations

from typing import Any

from gunicorn import glogging
from gunicorn.app.base import BaseApplication

from conch.frontend.http import parse_errors
from conch.settings import Settings


class RootLogger(glogging.Logger):
    """gunicorn's error log through the root logger, so that it follows Triton's log
    flags (``conch.server_log``: file, format, severities) like the rest of the gateway.
    gunicorn's own handlers are dropped; the access log stays off, as it is by default."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in list(self.error_log.handlers):
            self.error_log.removeHandler(handler)
        self.error_log.propagate = True


class _Gunicorn(BaseApplication):
    def __init__(self, settings: Settings, options: dict[str, Any]) -> None:
        self.settings = settings
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            if key in self.cfg.settings:  # older gunicorns lack some settings
                self.cfg.set(key, value)

    def load(self) -> Any:
        from conch.frontend.http.app import create_app

        return create_app(self.settings)


def run(settings: Settings, *, bind: str, workers: int, threads: int) -> None:
    binds = [bind]
    if settings.allow_metrics:
        address = settings.metrics_address or bind.rsplit(":", 1)[0]
        binds.append(f"{address}:{settings.metrics_port}")
    _Gunicorn(
        settings,
        {
            "bind": binds,
            "workers": workers,
            "worker_class": parse_errors.worker_class(settings.http_worker_class),
            "worker_connections": max(threads, 1000),
            "threads": threads,
            "keepalive": 75,  # perf_analyzer and tritonclient hold connections open
            "timeout": 120,
            # Triton's --exit-timeout-secs: requests in flight at SIGTERM get this long.
            "graceful_timeout": settings.exit_timeout_secs,
            "loglevel": "debug" if settings.log_verbose else "info",
            "logger_class": RootLogger,
            "proc_name": "conch-gateway",
            # One gateway per port may share a host: no shared control socket.
            "control_socket_disable": True,
        },
    ).run()
