"""Restricted API groups: which parts of the server need a shared-secret header.

Triton's ``--http-restricted-api <api>[,<api>...]:<header>=<value>`` (and gRPC's
``--grpc-restricted-protocol``, same syntax) names groups of endpoints that a request
may reach only when it carries ``<header>: <value>``. This module is the protocol-neutral
half: the groups, parsing the flag's values (with Triton's errors) and comparing a
supplied value. A frontend maps each of its routes to a group and reads the header in
its own way (an HTTP header; a gRPC metadata key, which Triton prefixes with
``triton-grpc-protocol-``), and answers a refusal in its protocol's form.

Secrets: a ``Restriction``'s value never shows in its repr or in an error message, and
is compared in constant time.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


class ApiGroup(StrEnum):
    """A group of endpoints that one restriction covers: Triton's, then conch's own."""

    HEALTH = "health"  # liveness, readiness, model readiness
    METADATA = "metadata"  # server and model metadata
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"  # index, load, unload
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"
    JOBS = "jobs"  # conch: async jobs (submit, status, result, cancel)
    BATCH = "batch"  # conch: offline batch jobs, which read and write S3


# An RFC 9110 field-name: a header that a client can actually send.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(frozen=True)
class Restriction:
    """The header a restricted group needs, and the value it must carry."""

    header: str
    value: str = field(repr=False)

    def allows(self, supplied: str | None) -> bool:
        """Whether ``supplied`` (the header's value, None when absent) is the secret.

        Compared as bytes, in constant time for the secret's contents (timing tells
        nothing about it): the header's bytes as servers decode them (latin-1), the
        secret's as the command line gave them (UTF-8).
        """
        if supplied is None:
            return False
        try:
            given = supplied.encode("latin-1")
        except UnicodeEncodeError:
            return False
        return hmac.compare_digest(given, self.value.encode("utf-8", "surrogateescape"))


@dataclass(frozen=True)
class RestrictedApis:
    """Each restricted group's restriction; a group not in ``rules`` is open."""

    rules: Mapping[ApiGroup, Restriction] = field(default_factory=lambda: MappingProxyType({}))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def __reduce__(self) -> tuple[type, tuple[Mapping[ApiGroup, Restriction]]]:
        """Pickled as a plain dict (a read-only view cannot be): ``Settings`` travel
        whole to a worker's process instances."""
        return _restricted_apis, (dict(self.rules),)

    def get(self, group: ApiGroup) -> Restriction | None:
        return self.rules.get(group)

    @classmethod
    def parse(
        cls,
        values: Iterable[str],
        *,
        option: str = "http-restricted-api",
        feature: str = "api",
        header_prefix: str = "",
    ) -> RestrictedApis:
        """Every value of the repeatable flag ``--<option>``, Triton's way: each is
        ``<group>[,<group>...]:<header>=<value>``, and a group may be named only once
        over all of them. ``feature`` names a group in errors ("api" for HTTP,
        "protocol" for gRPC); ``header_prefix`` is put before each header name.

        Raises ValueError with Triton's message, never with the secret in it.
        """
        rules: dict[ApiGroup, Restriction] = {}
        for value in values:
            groups, header, secret = _split(value, option, feature)
            if not _TOKEN.fullmatch(header):
                raise ValueError(f"--{option}: '{header}' is not a valid header name")
            restriction = Restriction(header_prefix + header, secret)
            for name in groups.split(","):
                try:
                    group = ApiGroup(name)
                except ValueError:
                    raise ValueError(f"unknown restricted {feature} '{name}'") from None
                if group in rules:
                    raise ValueError(
                        f"restricted {feature} '{name}' can not be specified in multiple config groups"
                    )
                rules[group] = restriction
        return cls(MappingProxyType(rules))

    def to_values(self, header_prefix: str = "") -> list[str]:
        """The flag values that ``parse`` reads back into these rules: one per
        restriction, with all its groups, in ``ApiGroup`` order."""
        by_rule: dict[Restriction, list[str]] = {}
        for group in ApiGroup:
            rule = self.rules.get(group)
            if rule is not None:
                by_rule.setdefault(rule, []).append(group.value)
        return [
            f"{','.join(groups)}:{rule.header.removeprefix(header_prefix)}={rule.value}"
            for rule, groups in by_rule.items()
        ]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RestrictedApis) and dict(self.rules) == dict(other.rules)

    def __hash__(self) -> int:
        return hash(frozenset(self.rules.items()))


def _split(value: str, option: str, feature: str) -> tuple[str, str, str]:
    """``<groups>:<header>=<secret>``: the first ':', then the first '=' after it (so
    the secret may hold either). The error repeats only the groups: the value up to
    its first ':' or '=', which no group name holds."""
    groups, colon, rest = value.partition(":")
    header, equals, secret = rest.partition("=")
    if not (colon and equals and groups and header and secret):
        shown = re.split("[:=]", value, maxsplit=1)[0] + (
            "..." if ":" in value or "=" in value else ""
        )
        raise ValueError(
            f"--{option} option format is '<{feature}>[,<{feature}>...]:<key>=<value>'. Got {shown}"
        )
    return groups, header, secret


def group_names() -> str:
    """The groups, as a flag's help lists them."""
    return ", ".join(g.value for g in ApiGroup)


__all__ = ["ApiGroup", "RestrictedApis", "Restriction", "group_names"]


def _restricted_apis(rules: dict[ApiGroup, Restriction]) -> RestrictedApis:
    """``RestrictedApis.__reduce__``'s rebuild: the rules behind a read-only view again."""
    return RestrictedApis(MappingProxyType(rules))
