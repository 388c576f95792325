"""The server log as Triton writes it, for every conch process (serve, gateway, worker).

Triton's log flags decide it, read from ``Settings``:

- ``--log-format``: each line starts with the severity letter (E, W or I), the UTC time,
  the process id and the source ``file:line``, then ``]``; ``default`` puts the letter
  first and the time as ``MMDD hh:mm:ss.uuuuuu``, ``ISO8601`` the time first as
  ``YYYY-MM-DDThh:mm:ssZ``. conch adds ``json``: one JSON object a line, for log
  shippers, with the same facts as named fields.
- ``--log-info``, ``--log-warning``, ``--log-error``: each severity on or off by itself,
  not a threshold; ``--log-verbose N`` (N > 0) adds the debug lines, lettered I as
  Triton's verbose lines are.
- ``--log-file``: the lines go to that file instead of stderr. It is appended to, since
  ``conch serve`` and its worker and gateway (and gunicorn's processes) share it.

A line written while the code works on requests (``conch.core.request_scope``) names
them: Triton's ``[request id: <id>]`` before the message, and conch's message id
(``[conch id: <id>]``), the same id in the gateway's and the worker's lines; in JSON,
the fields ``request_id`` and ``conch_id`` (a string for one request, a list for a
batch's lines). A traced request's lines name its OpenTelemetry trace too
(``[trace id: <hex>]``, ``trace_id``), so a trace leads to its log lines.

``configure`` sets this up on the root logger, before a role starts; the gateway's
gunicorn and the worker's Celery log through the root logger rather than their own
handlers (``frontend.http.server``, ``worker.app``). Triton's logging extension
(``GET/POST v2/logging``) changes it at run time: ``update`` checks and applies a change
here, and ``conch.wire.log_control`` carries it to every other process, which
``apply``s it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conch.core import request_scope
from conch.settings import LogFormat, Settings

_LETTERS = {logging.ERROR: "E", logging.WARNING: "W"}
_LEVEL_NAMES = {"E": "ERROR", "W": "WARNING", "I": "INFO"}
_NO_ID = "<id_unknown>"  # Triton's word for a request that has no id
_MAX_VERBOSE = 2**32 - 1  # Triton's log_verbose_level is a uint32


@dataclass(frozen=True)
class LogSettings:
    """A process's log settings under Triton's names (the logging extension's keys)."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: LogFormat = LogFormat.DEFAULT

    @classmethod
    def from_settings(cls, settings: Settings) -> LogSettings:
        return cls(
            log_file=settings.log_file,
            log_info=settings.log_info,
            log_warning=settings.log_warning,
            log_error=settings.log_error,
            log_verbose_level=settings.log_verbose,
            log_format=settings.log_format,
        )

    def to_json(self) -> dict[str, Any]:
        """Triton's log settings response."""
        return {**dataclasses.asdict(self), "log_format": str(self.log_format)}

    def updated(self, changes: Any) -> LogSettings:
        """These settings with ``changes`` (a logging request's JSON object) applied;
        ``ValueError`` saying what is wrong with any of them, nothing applied then."""
        if not isinstance(changes, Mapping):
            raise ValueError("the log settings request must be a JSON object")
        new: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in _FIELDS:
                raise ValueError(
                    f"unknown log setting '{key}'; the settings are {', '.join(_FIELDS)}"
                )
            new[key] = _checked(key, value, self)
        return dataclasses.replace(self, **new)


_FIELDS = tuple(f.name for f in dataclasses.fields(LogSettings))


def _checked(key: str, value: Any, now: LogSettings) -> Any:
    if key in ("log_info", "log_warning", "log_error"):
        if not isinstance(value, bool):
            raise ValueError(f"log setting '{key}' must be a boolean, not {value!r}")
        return value
    if key == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_VERBOSE:
            raise ValueError(
                f"log setting 'log_verbose_level' must be an integer >= 0, not {value!r}"
            )
        return value
    if key == "log_format":
        if value not in tuple(LogFormat):
            choices = ", ".join(str(f) for f in LogFormat)
            raise ValueError(f"invalid log_format {value!r}: it must be one of {choices}")
        return LogFormat(value)
    if not isinstance(value, str):
        raise ValueError(f"log setting 'log_file' must be a string, not {value!r}")
    if value != now.log_file:
        # A path from the network, opened by every process on every host: refused. Each
        # process's file is its own --log-file.
        raise ValueError(
            "log_file cannot be changed through the logging API: start each process with --log-file"
        )
    return value


def _letter(record: logging.LogRecord) -> str:
    return next((v for k, v in _LETTERS.items() if record.levelno >= k), "I")


def _ids(
    tags: tuple[request_scope.RequestTag, ...],
) -> tuple[list[str], list[str], list[str]]:
    return [t.request_id for t in tags], [t.conch_id for t in tags], [t.trace_id for t in tags]


class RequestFilter(logging.Filter):
    """Stamps each record with the requests the code that logged it works on
    (``conch.core.request_scope``), in the thread that logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.conch_requests = request_scope.current()
        return True


class TritonFormatter(logging.Formatter):
    """Triton's line head, the requests' ids, then the message (and a traceback)."""

    def __init__(self, log_format: LogFormat = LogFormat.DEFAULT) -> None:
        super().__init__("%(message)s")
        self.iso8601 = log_format is LogFormat.ISO8601

    def format(self, record: logging.LogRecord) -> str:
        letter = _letter(record)
        utc = time.gmtime(record.created)
        where = f"{record.process} {record.filename}:{record.lineno}]"
        if self.iso8601:
            head = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', utc)} {letter} {where}"
        else:
            micros = int(record.created % 1 * 1_000_000)
            head = f"{letter}{time.strftime('%m%d %H:%M:%S', utc)}.{micros:06d} {where}"
        return f"{head} {_about(record)}{super().format(record)}"


def _about(record: logging.LogRecord) -> str:
    """``[request id: a] [conch id: m] `` for a line about requests, else nothing."""
    tags = getattr(record, "conch_requests", ())
    if not tags:
        return ""
    request_ids, conch_ids, trace_ids = _ids(tags)
    text = f"[request id: {', '.join(i or _NO_ID for i in request_ids)}] "
    if any(conch_ids):
        text += f"[conch id: {', '.join(conch_ids)}] "
    if any(trace_ids):
        text += f"[trace id: {', '.join(trace_ids)}] "
    return text


class JsonFormatter(logging.Formatter):
    """conch's ``--log-format json``: one object a line (time in UTC, microseconds)."""

    def format(self, record: logging.LogRecord) -> str:
        utc = time.gmtime(record.created)
        micros = int(record.created % 1 * 1_000_000)
        line: dict[str, Any] = {
            "time": f"{time.strftime('%Y-%m-%dT%H:%M:%S', utc)}.{micros:06d}Z",
            "level": "VERBOSE" if record.levelno < logging.INFO else _LEVEL_NAMES[_letter(record)],
            "pid": record.process,
            "file": record.filename,
            "line": record.lineno,
            "logger": record.name,
            "message": record.getMessage(),
        }
        tags = getattr(record, "conch_requests", ())
        if tags:
            request_ids, conch_ids, trace_ids = _ids(tags)
            one = len(tags) == 1
            line["request_id"] = request_ids[0] if one else request_ids
            line["conch_id"] = conch_ids[0] if one else conch_ids
            if any(trace_ids):  # only lines about traced requests name a trace
                line["trace_id"] = trace_ids[0] if one else trace_ids
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)


def formatter(log_format: LogFormat) -> logging.Formatter:
    """The formatter of a ``--log-format``."""
    return JsonFormatter() if log_format is LogFormat.JSON else TritonFormatter(log_format)


class SeverityFilter(logging.Filter):
    """Lets through the severities that are on: error, warning and info each by its own
    flag, debug only with a verbose level above 0. ``settings`` may be swapped at run time."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        s = self.settings
        if record.levelno >= logging.ERROR:
            return s.log_error
        if record.levelno >= logging.WARNING:
            return s.log_warning
        if record.levelno >= logging.INFO:
            return s.log_info
        return s.log_verbose_level > 0


class ServerLog:
    """The process's log handler and the settings it follows now."""

    def __init__(self, settings: LogSettings) -> None:
        self.settings = settings
        self.handler: logging.Handler = (
            logging.FileHandler(settings.log_file, mode="a", encoding="utf-8")
            if settings.log_file
            else logging.StreamHandler(sys.stderr)
        )
        self.severities = SeverityFilter(settings)
        self.handler.addFilter(self.severities)
        self.handler.addFilter(RequestFilter())
        self.apply(settings)

    def apply(self, settings: LogSettings) -> None:
        """Follow ``settings`` from the next line on (the file stays the process's own)."""
        settings = dataclasses.replace(settings, log_file=self.settings.log_file)
        self.handler.setFormatter(formatter(settings.log_format))
        self.severities.settings = settings
        logging.getLogger().setLevel(logging.DEBUG if settings.log_verbose_level else logging.INFO)
        self.settings = settings


_PROCESS: ServerLog | None = None


def configure(settings: Settings) -> logging.Handler:
    """Make the root logger write Triton's lines where the flags say; returns its handler."""
    global _PROCESS
    server_log = ServerLog(LogSettings.from_settings(settings))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(server_log.handler)
    _PROCESS = server_log
    return server_log.handler


def current() -> LogSettings:
    """This process's log settings now (its flags' until the logging API changes them)."""
    return _PROCESS.settings if _PROCESS is not None else LogSettings()


def update(changes: Any) -> LogSettings:
    """Check a logging request's changes and apply them in this process; the settings
    that follow. ``ValueError`` (nothing applied) when one is wrong."""
    new = current().updated(changes)
    if _PROCESS is not None:
        _PROCESS.apply(new)
    return new


def apply(changes: Mapping[str, Any]) -> None:
    """Another process's change (``conch.wire.log_control``), applied here; one that does
    not check out here (another version of conch's) is logged and left out."""
    try:
        update({k: v for k, v in changes.items() if k != "log_file"})
    except ValueError as exc:
        logging.getLogger(__name__).warning("log settings change not applied: %s", exc)


__all__ = [
    "JsonFormatter",
    "LogSettings",
    "RequestFilter",
    "ServerLog",
    "SeverityFilter",
    "TritonFormatter",
    "apply",
    "configure",
    "current",
    "formatter",
    "update",
]
