"""The server log as Triton writes it, for every conch process (serve, gateway, worker).

Triton's log flags decide it, read from ``Settings``:

- ``--log-format``: each line starts with the severity letter (E, W or I), the UTC time,
  the process id and the source ``file:line``, then ``]``; ``default`` puts the letter
  first and the time as ``MMDD hh:mm:ss.uuuuuu``, ``ISO8601`` the time first as
  ``YYYY-MM-DDThh:mm:ssZ``.
- ``--log-info``, ``--log-warning``, ``--log-error``: each severity on or off by itself,
  not a threshold; ``--log-verbose N`` (N > 0) adds the debug lines, lettered I as
  Triton's verbose lines are.
- ``--log-file``: the lines go to that file instead of stderr. It is appended to, since
  ``conch serve`` and its worker and gateway (and gunicorn's processes) share it.

``configure`` sets this up on the root logger, before a role starts; the gateway's
gunicorn and the worker's Celery log through the root logger rather than their own
handlers (``frontend.http.server``, ``worker.app``).
"""

from __future__ import annotations

import logging
import sys
import time

from conch.settings import LogFormat, Settings

_LETTERS = {logging.ERROR: "E", logging.WARNING: "W"}


class TritonFormatter(logging.Formatter):
    """Triton's line head, then the message (and a traceback, if any)."""

    def __init__(self, log_format: LogFormat = LogFormat.DEFAULT) -> None:
        super().__init__("%(message)s")
        self.iso8601 = log_format is LogFormat.ISO8601

    def format(self, record: logging.LogRecord) -> str:
        letter = next((v for k, v in _LETTERS.items() if record.levelno >= k), "I")
        utc = time.gmtime(record.created)
        where = f"{record.process} {record.filename}:{record.lineno}]"
        if self.iso8601:
            head = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', utc)} {letter} {where}"
        else:
            micros = int(record.created % 1 * 1_000_000)
            head = f"{letter}{time.strftime('%m%d %H:%M:%S', utc)}.{micros:06d} {where}"
        return f"{head} {super().format(record)}"


class SeverityFilter(logging.Filter):
    """Lets through the severities that are on: error, warning and info each by its own
    flag, debug only with --log-verbose."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.on = (
            (logging.ERROR, settings.log_error),
            (logging.WARNING, settings.log_warning),
            (logging.INFO, settings.log_info),
            (logging.NOTSET, settings.log_verbose > 0),
        )

    def filter(self, record: logging.LogRecord) -> bool:
        return next(on for level, on in self.on if record.levelno >= level)


def configure(settings: Settings) -> logging.Handler:
    """Make the root logger write Triton's lines where the flags say; returns its handler."""
    handler: logging.Handler = (
        logging.FileHandler(settings.log_file, mode="a", encoding="utf-8")
        if settings.log_file
        else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(TritonFormatter(settings.log_format))
    handler.addFilter(SeverityFilter(settings))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if settings.log_verbose > 0 else logging.INFO)
    return handler


__all__ = ["SeverityFilter", "TritonFormatter", "configure"]
