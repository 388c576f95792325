"""conch.server_log: Triton's log line heads, conch's JSON lines, the requests' ids on
lines about them, each severity on or off by its flag, and the logging API's checks."""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import sys
from pathlib import Path

import pytest

from conch import server_log
from conch.core.request_scope import RequestTag, about
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
    f = server_log.SeverityFilter(server_log.LogSettings.from_settings(Settings(**flags)))
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


def stamped(level: int = logging.INFO, msg: str = "hello %s") -> logging.LogRecord:
    """A record as the handler sees it: its requests stamped by the request filter."""
    r = record(level, msg)
    server_log.RequestFilter().filter(r)
    return r


def test_a_line_about_a_request_names_its_ids() -> None:
    with about(RequestTag("client-7", "c0ffee")):
        line = server_log.TritonFormatter().format(stamped())
    assert line.endswith("x.py:42] [request id: client-7] [conch id: c0ffee] hello world")
    # Outside the block the ids are gone; a request without an id says so as Triton does.
    assert "request id" not in server_log.TritonFormatter().format(stamped())
    with about(RequestTag("", "c0ffee"), RequestTag("b", "d00d")):
        line = server_log.TritonFormatter(LogFormat.ISO8601).format(stamped())
    assert "] [request id: <id_unknown>, b] [conch id: c0ffee, d00d] hello" in line


def test_json_lines_carry_the_same_facts_as_fields() -> None:
    with about(RequestTag("client-7", "c0ffee")):
        one = json.loads(server_log.JsonFormatter().format(stamped(logging.WARNING)))
    assert one == {
        "time": "2024-03-04T10:22:33.012345Z",
        "level": "WARNING",
        "pid": os.getpid(),
        "file": "x.py",
        "line": 42,
        "logger": "conch.test",
        "message": "hello world",
        "request_id": "client-7",
        "conch_id": "c0ffee",
    }
    with about(RequestTag("a", "1"), RequestTag("b", "2")):
        batch = json.loads(server_log.JsonFormatter().format(stamped(logging.DEBUG)))
    assert batch["level"] == "VERBOSE"
    assert (batch["request_id"], batch["conch_id"]) == (["a", "b"], ["1", "2"])
    plain = json.loads(server_log.JsonFormatter().format(stamped()))
    assert "request_id" not in plain and plain["level"] == "INFO"


def test_a_json_line_holds_its_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        r = logging.LogRecord("t", logging.ERROR, "/a/b.py", 1, "failed", (), sys.exc_info())
    line = server_log.JsonFormatter().format(r)
    assert len(line.splitlines()) == 1
    assert "RuntimeError: boom" in json.loads(line)["exception"]


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ([], "must be a JSON object"),
        ({"log_level": 1}, "unknown log setting 'log_level'"),
        ({"log_info": "false"}, "'log_info' must be a boolean"),
        ({"log_error": 0}, "'log_error' must be a boolean"),
        ({"log_verbose_level": -1}, "'log_verbose_level' must be an integer >= 0"),
        ({"log_verbose_level": True}, "'log_verbose_level' must be an integer >= 0"),
        ({"log_verbose_level": 1.5}, "'log_verbose_level' must be an integer >= 0"),
        ({"log_format": "iso8601"}, "invalid log_format 'iso8601'"),
        ({"log_file": "/tmp/elsewhere.log"}, "log_file cannot be changed"),
        ({"log_file": 3}, "'log_file' must be a string"),
    ],
)
def test_a_wrong_change_is_refused_whole(changes: object, error: str) -> None:
    before = server_log.LogSettings()
    with pytest.raises(ValueError, match=error):
        before.updated(changes)


def test_a_change_keeps_what_it_does_not_name() -> None:
    before = server_log.LogSettings(log_file="/var/log/conch.log")
    after = before.updated(
        {
            "log_info": False,
            "log_verbose_level": 2,
            "log_format": "json",
            "log_file": before.log_file,
        }
    )
    assert after.to_json() == {
        "log_file": "/var/log/conch.log",
        "log_info": False,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 2,
        "log_format": "json",
    }


def test_update_switches_this_process_at_once(tmp_path: Path, monkeypatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(server_log, "_PROCESS", None)
    path = tmp_path / "conch.log"
    handler = server_log.configure(Settings(log_file=str(path)))
    try:
        logging.getLogger("conch.t").debug("not this")
        server_log.update({"log_verbose_level": 1, "log_format": "json"})
        logging.getLogger("conch.t").debug("but this")
        server_log.apply({"log_info": "no"})  # another process's bad change: left out
        logging.getLogger("conch.t").info("and this")
    finally:
        handler.close()
    lines = path.read_text().splitlines()
    messages = [json.loads(x)["message"] for x in lines]
    assert messages[0] == "but this"
    assert "log settings change not applied" in messages[1] and messages[2] == "and this"
    assert server_log.current().log_verbose_level == 1
