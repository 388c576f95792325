"""The flag machinery: what a command line can say about a setting.

``setting()`` declares a field of ``Settings`` with its default, its ``Flag``s and its
environment variables. What a flag does with its value follows from the field's type
unless the flag says otherwise (``Flag.bound``), and its help shows the field's default
(``shown_default``), never a copy of it. ``declared_flags`` and ``env_parsers`` read a
dataclass of such fields; the role sets say which subcommands take a flag. Knows no
setting by name: the declarations are ``conch.settings.declarations``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields, replace
from enum import StrEnum
from types import UnionType
from typing import Any, get_type_hints

from conch.settings.values import Role

# --- flags: what a command line can say about a setting ------------------------------------

ALL_ROLES = frozenset(Role)
HTTP_ROLES = frozenset({Role.SERVE, Role.GATEWAY})
GRPC_ROLES = frozenset({Role.SERVE, Role.GRPC})
FRONTEND_ROLES = HTTP_ROLES | GRPC_ROLES  # what both frontends apply alike
# Roles that run workers: the autoscaler takes every worker flag, to start its workers with.
WORKER_ROLES = frozenset({Role.SERVE, Role.WORKER, Role.AUTOSCALE})
SCALE_ROLES = frozenset({Role.SERVE, Role.AUTOSCALE})
SERVE_ONLY = frozenset({Role.SERVE})


def _value(name: str, value: Any) -> list[str]:
    return [] if value is None or value == "" else [name, str(value)]


def repeated_args(name: str, values: Iterable[str]) -> list[str]:
    """A repeatable flag written back: ``name`` before each of ``values``."""
    return [arg for v in values for arg in (name, v)]


def _is_config(kind: type) -> bool:
    """A config that a repeatable flag's values make together (``parse(values)``) and that
    writes them back (``items()``): Triton's ``--backend-config``, ``--trace-config``..."""
    return callable(getattr(kind, "parse", None)) and callable(getattr(kind, "items", None))


def _config_args(name: str, config: Any) -> list[str]:
    """A repeatable ``KEY=VALUE`` flag written back from its config's ``items()``."""
    return repeated_args(name, config.items())


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


def no_args(name: str, value: Any) -> list[str]:
    """Writes nothing back: for a flag whose value another flag writes (an older spelling),
    or one that conch ignores."""
    return []


def at_least(low: float, *, inclusive: bool = True) -> Callable[[str, Any], Any]:
    """A number flag's check: refused below ``low`` (or at it, when not ``inclusive``)."""

    def check(flag: str, value: Any) -> Any:
        if value < low or (value == low and not inclusive):
            raise ValueError(
                f"{flag} {value}: must be {'at least' if inclusive else 'above'} {low}"
            )
        return value

    return check


def between(low: float, high: float) -> Callable[[str, Any], Any]:
    """A number flag's check: refused outside ``low`` to ``high`` (both included)."""

    def check(flag: str, value: Any) -> Any:
        if not low <= value <= high:
            raise ValueError(f"{flag} {value}: must be from {low} to {high}")
        return value

    return check


def shown_default(value: Any) -> str | None:
    """A default as a flag would spell it, or None for one that has no short spelling."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int | str) and value != "":
        return str(value)
    return None


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a setting: its argparse arguments, how to read a parsed
    value into the field (None: leave the field as it is) and how to write the field back
    as arguments.

    Declared inside ``setting()``; ``Settings`` binds it to its field, filling in from the
    field's type what the declaration left out (``bound``). ``check(flag, value)`` refuses
    a value (ValueError) after ``read``. ``ignored``: a Triton flag taken so that a Triton
    launch line starts, but with no effect here; the CLI warns once with this reason when
    its field is away from the default, and it is never written back for children.
    """

    name: str
    roles: frozenset[Role]
    help: str | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    # or "append", or "store_true": a switch, which Triton's --flag=true|false also spell
    action: str = "store"
    nargs: str | None = None  # "?": the value may be left out, and then is ``const``
    const: Any = None
    choices: tuple[str, ...] | None = None
    required: bool = False
    read: Callable[[Any], Any] | None = None
    check: Callable[[str, Any], Any] | None = None
    as_args: Callable[[str, Any], list[str]] | None = None
    # A secret: written for children as the text of its field's environment variable,
    # never as arguments.
    to_env: Callable[[Any], str] | None = None
    ignored: str | None = None
    field: str = ""  # the Settings field it sets, filled in by ``bound``

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def value(self, given: Any) -> Any:
        """The field's new value from what argparse parsed, or None to leave it."""
        value = self.read(given) if self.read else given
        if value is not None and self.check is not None:
            value = self.check(self.name, value)
        return value

    def write(self, settings: Any) -> list[str]:
        return (self.as_args or _value)(self.name, getattr(settings, self.field))

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        # default None everywhere: a flag not given leaves the environment's value.
        kwargs: dict[str, Any] = {"action": self.action, "default": None, "help": self.help}
        kwargs.update(type=self.type, metavar=self.metavar, choices=self.choices)
        if self.action == "store_true":  # a switch: bare, or with Triton's =true|false forms
            kwargs.update(action="store", nargs="?", const=True, type=self.type or _bool)
        if self.nargs is not None:
            kwargs.update(nargs=self.nargs, const=self.const)
        if self.required:
            kwargs["required"] = True
        parser.add_argument(self.name, **kwargs)

    def bound(self, name: str, kind: Any, default: Any) -> Flag:
        """This flag set on field ``name`` of type ``kind``, its help showing ``default``."""
        typed: dict[str, Any] = {}
        plain = _plain(kind)
        if plain is bool:  # Triton's forms, and bare for true: --flag, --flag=false, --flag 0
            typed = {"type": _bool, "metavar": "BOOL", "nargs": "?", "const": True}
            if self.action == "store":
                typed["as_args"] = _bool_arg
        elif plain in (int, float):
            typed = {"type": plain}
        elif isinstance(kind, type) and issubclass(kind, StrEnum):
            typed = {"choices": tuple(kind), "read": kind}
        elif self.action == "append" and isinstance(kind, type) and _is_config(kind):
            typed = {"read": kind.parse, "as_args": _config_args}
        if self.ignored:  # never written back: conch serve's children do not warn again
            typed["as_args"] = no_args
        filled = {k: v for k, v in typed.items() if getattr(self, k) is None}
        return replace(self, field=name, help=self._help(default), **filled)

    def _help(self, default: Any) -> str | None:
        if self.help is None or self.help == argparse.SUPPRESS or self.required:
            return self.help
        if self.action != "store" or self.ignored:  # a switch, or a value nothing reads
            return self.help
        shown = shown_default(default)
        if "{default}" in self.help:
            if shown is None:
                raise ValueError(f"{self.name}: its help shows a default it does not have")
            return self.help.replace("{default}", shown)
        if shown is None or "default" in self.help:
            return self.help
        return f"{self.help} (default {shown})"


def setting(
    default: Any = MISSING,
    *flags: Flag,
    env: str | tuple[str, ...] = (),
    parse: Callable[[str], Any] | None = None,
    factory: Callable[[], Any] | None = None,
    help: str | None = None,
) -> Any:
    """One setting: its default (or the ``factory`` that makes it), its flags, and the
    environment variables that set it (the first one set wins), read with ``parse`` or
    by the field's type. ``help`` says what a setting with no flag does (a flag's own
    help says it for the others), for the flags page (``conch.devtools.flags_doc``)."""
    if isinstance(default, Flag):  # no default value: the factory makes it
        default, flags = MISSING, (default, *flags)
    metadata = {
        "env": (env,) if isinstance(env, str) else env,
        "parse": parse,
        "flags": flags,
        "help": help,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _plain(kind: Any) -> Any:
    """``T`` of ``T | None``; any other type as it is."""
    if isinstance(kind, UnionType):
        args = [a for a in kind.__args__ if a is not type(None)]
        return args[0] if len(args) == 1 else kind
    return kind


def _env_parser(name: str, kind: Any, parse: Callable[[str], Any] | None) -> Callable[[str], Any]:
    """How an environment variable's text becomes field ``name``'s value."""
    if parse is not None:
        return parse
    plain = _plain(kind)
    if plain is bool:
        return _bool
    if plain in (str, int, float) or (isinstance(plain, type) and issubclass(plain, StrEnum)):
        return plain
    raise TypeError(f"Settings.{name}: give setting() a parse for its environment variable")


def declared_flags(cls: type) -> tuple[Flag, ...]:
    """The flags that the ``setting()`` fields of dataclass ``cls`` declare, in declaration
    order, each bound to its field: its type fills in what the flag left out, and its help
    shows the field's default."""
    kinds, defaults = get_type_hints(cls), cls()
    return tuple(
        flag.bound(f.name, kinds[f.name], getattr(defaults, f.name))
        for f in fields(cls)
        for flag in f.metadata["flags"]
    )


def env_parsers(cls: type) -> dict[str, Callable[[str], Any]]:
    """How each environment variable's text becomes its field's value, by field name."""
    kinds = get_type_hints(cls)
    return {
        f.name: _env_parser(f.name, kinds[f.name], f.metadata["parse"])
        for f in fields(cls)
        if f.metadata["env"]
    }
