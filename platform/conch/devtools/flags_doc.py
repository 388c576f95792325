"""``docs/flags.md``, written from the settings' declarations: every flag and environment
variable with its subcommands, default and help, so that no page copies a default by hand.

``python -m conch.devtools.flags_doc`` writes the page; ``--check`` exits 1 when the page
on disk is not what the declarations give (``tests/unit/test_flags_doc.py`` fails the same
way). Each row comes from ``conch.settings``: the field's default (a default a factory
makes, or that depends on the machine, is said by the help instead), its ``Flag``s (their
roles, metavar and help as declared, ``{default}`` filled in), its environment variables,
and a setting's own ``help`` where it has no flag. The other commands' flags come from the
CLI's parser, their help as written there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, Field, fields
from pathlib import Path

from conch.cli import parser as cli_parser
from conch.core.cache_config import DEFAULT_REDIS_SIZE
from conch.core.metrics_config import MetricsConfig
from conch.core.trace_config import TraceConfig
from conch.settings import ALL_ROLES, FLAGS, Flag, Role, Settings, shown_default
from conch.wire.cache_store import DEFAULT_SOCKET_TIMEOUT_S
from conch.wire.redis_client import CONNECT_TIMEOUT_S

PAGE = Path("docs") / "flags.md"
COMMAND = "python -m conch.devtools.flags_doc"
# Subcommands whose flags are not Settings' (each its own parser in conch.cli or repo_sync).
OTHER_COMMANDS = ("batch", "queue-depth", "analyze", "sync")
NONE = "—"

HEAD = f"""\
# Flags and environment variables

What each flag and environment variable of `conch` sets, which subcommands take it, and its
default: look a setting up here. This page is generated from the settings' declarations
(`platform/conch/settings/declarations.py`) by `{COMMAND}`; do not edit it by hand
(`tests/unit/test_flags_doc.py` fails when it is stale).

A flag wins over its environment variable, which wins over the default. Flags follow
Triton's names where Triton has one. Every boolean flag takes Triton's forms: `--flag`
(true), `--flag=true|false|on|off|1|0` in any case, or the value as the next word
(`--log-info false`); `--log-verbose` also takes true/false. A flag that neither Triton
nor conch has stops the start with an error naming it. Secrets (`--http-restricted-api`,
`--grpc-restricted-protocol`, a `--cache-config` password) reach `conch serve`'s children
in their environment variables, never on a command line, which any user of the host can
read.
"""


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes, angle brackets and stars kept as written."""
    for char in ("\\", "|", "<", "*"):
        text = text.replace(char, "\\" + char)
    return " ".join(text.split())


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def _roles(roles: frozenset[Role]) -> str:
    if roles == ALL_ROLES:
        return "all"
    return ", ".join(role.value for role in Role if role in roles)


def _default(f: Field) -> str:
    """The field's declared default as a flag spells it; none for one a factory makes."""
    if f.default is MISSING:
        return NONE
    shown = shown_default(f.default)
    return NONE if shown is None else _code(shown)


def _usage(flag: Flag) -> str:
    """``--flag VALUE`` as the help would print it."""
    if flag.action == "store_true":
        return flag.name
    if flag.choices:
        value = "|".join(str(c) for c in flag.choices)
    else:
        value = flag.metavar or flag.dest.upper()
    if flag.nargs == "?":
        value = f"[{value}]"
    return f"{flag.name} {value}"


def _help(declared: Flag, default: str) -> str:
    """The help as declared, ``{default}`` filled in (the default has a column of its own)."""
    text = declared.help or ""
    return text.replace("{default}", default.strip("`"))


def _bound(name: str) -> Flag:
    return next(flag for flag in FLAGS if flag.name == name)


def _flag_rows() -> Iterator[str]:
    yield "| flag | subcommands | default | environment | what it sets |"
    yield "|---|---|---|---|---|"
    for f in fields(Settings):
        shown = [fl for fl in f.metadata["flags"] if fl.help != argparse.SUPPRESS]
        hidden = [fl for fl in f.metadata["flags"] if fl.help == argparse.SUPPRESS]
        shown = [fl for fl in shown if not fl.ignored]
        env = ", ".join(_code(name) for name in f.metadata["env"]) or NONE
        for i, declared in enumerate(shown):
            bound = _bound(declared.name)
            flag = _code(_usage(bound))
            if i == 0 and hidden:
                flag += (
                    " (Triton's older spelling: " + ", ".join(_code(h.name) for h in hidden) + ")"
                )
            switch = declared.action == "store_true"  # given or not: its help says which
            default = _default(f) if i == 0 and not switch else NONE
            help_text = _cell(_help(declared, default))
            cells = (flag, _roles(bound.roles), default, env if i == 0 else NONE, help_text)
            yield "| " + " | ".join(cells) + " |"


def _env_rows() -> Iterator[str]:
    yield "| environment | default | what it sets |"
    yield "|---|---|---|"
    for f in fields(Settings):
        if f.metadata["flags"] or not f.metadata["env"]:
            continue
        help_text = f.metadata["help"]
        if not help_text:
            raise ValueError(f"Settings.{f.name}: a setting with no flag needs setting(help=)")
        env = ", ".join(_code(name) for name in f.metadata["env"])
        yield f"| {env} | {_default(f)} | {_cell(help_text)} |"


def _ignored_rows() -> Iterator[str]:
    yield "| flag | why it changes nothing |"
    yield "|---|---|"
    for flag in FLAGS:
        if flag.ignored:
            yield f"| {_code(_usage(flag))} | {_cell(flag.ignored)} |"


def _config_keys() -> Iterator[str]:
    """The defaults of the keys the repeatable config flags take, from their parsers."""
    trace, metrics = TraceConfig(), MetricsConfig()
    quantiles = ",".join(f"{q}:{e}" for q, e in metrics.quantiles)
    rows = (
        ("--trace-config", "opentelemetry,url=", trace.url),
        ("--trace-config", "level=", trace.level),
        ("--trace-config", "rate=", str(trace.rate)),
        ("--trace-config", "count=", str(trace.count)),
        ("--metrics-config", "counter_latencies=", shown_default(metrics.counter_latencies)),
        ("--metrics-config", "summary_latencies=", shown_default(metrics.summary_latencies)),
        ("--metrics-config", "summary_quantiles=", quantiles),
        ("--metrics-config", "histogram_latencies=", shown_default(metrics.histogram_latencies)),
        ("--cache-config", "redis,size=", f"{DEFAULT_REDIS_SIZE} (bytes)"),
        ("--cache-config", "redis,connect_timeout=", f"{CONNECT_TIMEOUT_S * 1000:.0f} (ms)"),
        ("--cache-config", "redis,socket_timeout=", f"{DEFAULT_SOCKET_TIMEOUT_S * 1000:.0f} (ms)"),
    )
    yield "| flag | key | default |"
    yield "|---|---|---|"
    for flag, key, value in rows:
        yield f"| {_code(flag)} | {_code(key)} | {_code(str(value))} |"


def _command_rows(sub: argparse.ArgumentParser) -> Iterator[str]:
    yield "| flag | what it sets |"
    yield "|---|---|"
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(action.option_strings) or (action.metavar or action.dest)
        value = "" if action.nargs == 0 else " " + str(action.metavar or action.dest.upper())
        usage = names + value if action.option_strings else names
        yield f"| {_code(usage)} | {_cell(action.help or '')} |"


def _commands() -> Iterator[str]:
    top = cli_parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for i, name in enumerate(OTHER_COMMANDS):
        if i:
            yield ""
        yield f"### `conch {name}`"
        yield ""
        yield from _command_rows(subs.choices[name])


def _section(title: str, intro: str, rows: Iterable[str]) -> list[str]:
    return ["", f"## {title}", "", intro, "", *rows]


def render() -> str:
    """The page, as the declarations give it now."""
    lines = [HEAD.rstrip("\n")]
    lines += _section(
        "The flags of serve, gateway, grpc, worker and autoscale",
        "One row per flag, in declaration order; `conch <subcommand> --help` prints the same "
        "help. A default of "
        + NONE
        + " is none, or one the help text describes (a flag that is given or not, a "
        "value that depends on the machine).",
        _flag_rows(),
    )
    lines += _section(
        "Environment only",
        "Settings with no flag: the processes `conch serve` starts inherit them.",
        _env_rows(),
    )
    lines += _section(
        "Keys of the repeatable config flags",
        "What a key is when `--trace-config`, `--metrics-config` or a `redis` "
        "`--cache-config` leaves it out.",
        _config_keys(),
    )
    lines += _section(
        "Triton's flags that conch takes and ignores",
        "They tune what conch does not have. Any subcommand takes them, so a tritonserver "
        "launch line starts unchanged, and each is logged once at start, with the reason, "
        "when it asks for something conch does not do (a boolean only when true).",
        _ignored_rows(),
    )
    lines += _section(
        "The other commands",
        "Their flags are their own, not settings; each `conch <command> --help` prints them.",
        _commands(),
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(prog=COMMAND, description=__doc__.partition("\n\n")[0])
    args.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args.add_argument("--root", type=Path, default=Path("."), help="the checkout's root")
    given = args.parse_args(argv)
    page, text = given.root / PAGE, render()
    if given.check:
        if not page.exists() or page.read_text() != text:
            print(f"{PAGE} is stale: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    page.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
