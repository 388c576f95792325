"""conch.settings: each setting is one declaration, and its help shows the declared default."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from conch.settings import (
    ALL_ROLES,
    FLAGS,
    Flag,
    LogFormat,
    Settings,
    declared_flags,
    env_parsers,
    setting,
    shown_default,
)


@dataclasses.dataclass
class _Tiny:
    """A settings class of three declarations, as a new flag would be added."""

    port: int = setting(7, Flag("--port", ALL_ROLES, "the port"), env="TINY_PORT")
    on: bool = setting(True, Flag("--on", ALL_ROLES, "switched on or not (default {default})"))
    fmt: LogFormat = setting(LogFormat.JSON, Flag("--fmt", ALL_ROLES, "line format"))


def test_one_declaration_gives_the_flag_its_field_type_help_and_variable():
    port, on, fmt = declared_flags(_Tiny)
    assert (port.field, port.type, port.help) == ("port", int, "the port (default 7)")
    assert on.field == "on" and on.help == "switched on or not (default true)"
    assert on.metavar == "BOOL" and on.value(on.type("off")) is False
    assert on.write(_Tiny(on=False)) == ["--on=false"]
    assert fmt.choices == tuple(LogFormat) and fmt.value("ISO8601") is LogFormat.ISO8601
    assert fmt.help == "line format (default json)"
    assert env_parsers(_Tiny) == {"port": int}


def test_a_changed_default_changes_the_help():
    @dataclasses.dataclass
    class Changed(_Tiny):
        port: int = setting(9, Flag("--port", ALL_ROLES, "the port"))
        on: bool = setting(False, Flag("--on", ALL_ROLES, "switched on or not (default {default})"))

    port, on, _ = declared_flags(Changed)
    assert port.help == "the port (default 9)" and on.help == "switched on or not (default false)"


def test_every_help_that_can_show_its_default_shows_the_declared_one():
    defaults = Settings()
    shown = 0
    for flag in FLAGS:
        value = shown_default(getattr(defaults, flag.field))
        plain = flag.action == "store" and not (flag.required or flag.ignored)
        if value is None or not plain or flag.help is None or "default:" in flag.help:
            continue
        assert re.search(rf"default {re.escape(value)}\b", flag.help), (flag.name, flag.help)
        shown += 1
    assert shown > 30  # not a vacuous loop


def test_no_help_repeats_a_default_by_hand():
    defaults = Settings()
    for f in dataclasses.fields(Settings):
        value = shown_default(getattr(defaults, f.name))
        for flag in f.metadata["flags"]:
            if value is None or not flag.help:
                continue
            by_hand = rf"(default:? |\(|Triton's ){re.escape(value)}\b"
            assert not re.search(by_hand, flag.help), (flag.name, flag.help)


def test_each_flag_and_variable_is_declared_once():
    names = Counter(flag.name for flag in FLAGS)
    variables = Counter(v for f in dataclasses.fields(Settings) for v in f.metadata["env"])
    assert max(names.values()) == 1 and max(variables.values()) == 1
    # Every flag sets the field that declares it.
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    for flag in FLAGS:
        assert flag.name in {raw.name for raw in fields[flag.field].metadata["flags"]}
