"""conch.server_log: Triton's log line heads, and each severity on or off by its flag."""

from __future__ import annotations

import calendar
import logging
import os
import re
import sys
from pathlib import Path

import pytest

from conch import server_log
from conch.settings import LogFormat, Settings

# 2024-03-04 10:22:33.012345 UTC
WHEN = calendar.timegm((2024, 3, 4, 10, 22, 33)) + 0.012345


def record(level: int, msg: str = "hello %s", args: tuple = ("world",)) -> logging.LogRecord:
    r = logging.LogRecord("conch.test", level, "/src/conch/x.py", 42, msg, args, None)
    r.created = WHEN
    return r


@pytest.mark.parametrize(
    ("level", "letter"),
    [
        (logging.DEBUG, "I"),  # Triton's verbose lines are I lines
        (logging.INFO, "I"),
        (logging.WARNING, "W"),
        (logging.ERROR, "E"),
        (logging.CRITICAL, "E"),
    ],
)
def test_default_format_is_tritons(level: int, letter: str) -> None:
    line = server_log.TritonFormatter().format(record(level))
    assert line == f"{letter}0304 10:22:33.012345 {os.getpid()} x.py:42] hello world"


def test_iso8601_format_puts_the_time_first() -> None:
    line = server_log.TritonFormatter(LogFormat.ISO8601).format(record(logging.WARNING))
    assert line == f"2024-03-04T10:22:33Z W {os.getpid()} x.py:42] hello world"


def test_a_traceback_follows_the_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        r = logging.LogRecord("t", logging.ERROR, "/a/b.py", 1, "failed", (), sys.exc_info())
    r.created = WHEN
    text = server_log.TritonFormatter().format(r)
    assert text.startswith("E0304 10:22:33.012345 ")
    assert "failed\nTraceback" in text and "RuntimeError: boom" in text


@pytest.mark.parametrize(
    ("flags", "passes"),
    [
        ({}, {"INFO", "WARNING", "ERROR"}),
        ({"log_verbose": 1}, {"DEBUG", "INFO", "WARNING", "ERROR"}),
        ({"log_info": False}, {"WARNING", "ERROR"}),
        ({"log_warning": False}, {"INFO", "ERROR"}),  # each severity alone, no threshold
        ({"log_error": False, "log_info": False}, {"WARNING"}),
    ],
)
def test_each_severity_has_its_own_switch(flags: dict, passes: set[str]) -> None:
    f = server_log.SeverityFilter(Settings(**flags))
    levels = ("DEBUG", "INFO", "WARNING", "ERROR")
    assert {name for name in levels if f.filter(record(getattr(logging, name)))} == passes


def test_configure_writes_to_the_log_file(tmp_path: Path, monkeypatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    path = tmp_path / "conch.log"
    path.write_text("earlier line\n")  # appended to: serve and its children share it
    handler = server_log.configure(
        Settings(log_file=str(path), log_format=LogFormat.ISO8601, log_info=False)
    )
    try:
        logging.getLogger("conch.t").info("not this")
        logging.getLogger("conch.t").warning("but this")
    finally:
        handler.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "earlier line" and len(lines) == 2
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ W \d+ test_server_log\.py:\d+\] but this", lines[1]
    )
