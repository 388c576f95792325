"""Hosts for tests, made on one machine: Linux network namespaces joined by a switch.

A test that spreads conch over machines (Redis, the gateway, workers, each on its own)
makes a ``Network`` and adds hosts to it. Each host is a network namespace with its own
loopback and one address on a /24 of the network's own, cabled (a veth pair) to a switch
(a bridge, in a namespace of its own). Processes started on a host (``Host.command``) also
get the host's name as their hostname (a UTS namespace each, so ``socket.gethostname()``
differs per host as it does across machines) and a temporary folder of the host's own
(``TMPDIR``). So a process that reaches for 127.0.0.1, or counts on one hostname or one
/tmp for every part, fails here as it would across machines. The test process itself
reaches every host over one more cable, from its own namespace to the switch, at
``Network.own_address``.

``Network.take_away`` makes a host go as a machine does: its cable is pulled first, so
that no peer hears a goodbye (no FIN, no RST), then every process on it is killed and
the namespace deleted.

Needs Linux, root (CAP_SYS_ADMIN and CAP_NET_ADMIN), iproute2's ``ip`` and util-linux's
``unshare``; ``unavailable()`` says which is missing, for a skip. Every name made carries
this process's id and a random part, so parallel runs never meet; the namespace names a
run left behind when it died (its process gone) are deleted by the next one. ``close``
(also on the way out of ``with``) removes all of it, after a failure too.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["Host", "Network", "unavailable"]

PREFIX = "conch-t"  # every namespace this module makes: conch-t<pid>-<hex>-<host>
_OWNER = re.compile(rf"^{PREFIX}(\d+)-")
SWITCH = "switch"  # the bridge, inside the hub namespace
_BASE = ipaddress.ip_network("10.213.0.0/16")  # each network takes one /24 of it


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


@functools.cache
def unavailable() -> str | None:
    """Why hosts cannot be made here (a skip reason), or None when they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed ({package})"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return (
            f"cannot create a network namespace (`ip netns add`: {made.stderr.strip()}); "
            "this test needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
        )
    try:
        cable = _ip(
            "-n",
            probe,
            "link",
            "add",
            "name",
            "a",
            "type",
            "veth",
            "peer",
            "name",
            "b",
            check=False,
        )
        if cable.returncode:
            return f"cannot create a veth pair: {cable.stderr.strip()}"
        uts = subprocess.run(
            ["ip", "netns", "exec", probe, "unshare", "--uts", "--", "true"],
            capture_output=True,
            text=True,
            check=False,
        )
        if uts.returncode:
            return f"cannot give a host its own hostname (`unshare --uts`): {uts.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _pids(netns: str) -> list[int]:
    """Processes whose network namespace is ``netns`` (never this one)."""
    out = _ip("netns", "pids", netns, check=False).stdout.split()
    return [int(p) for p in out if p.isdigit() and int(p) != os.getpid()]


def _kill_all(netns: str, timeout: float = 10) -> None:
    """SIGKILL every process in ``netns`` (all started by this module's caller), until none
    is left: a namespace lives on, addresses and all, while one process is in it."""
    deadline = time.monotonic() + timeout
    while pids := _pids(netns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # it died meanwhile
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in {netns} did not die")
        time.sleep(0.05)


def _delete_stale() -> None:
    """Delete the namespace names of runs whose process is gone. Their processes, if any
    outlived the run, are not this run's to kill: the namespace lives on unnamed until
    they exit, and its name is free again."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = _OWNER.match(name)
        if owner and not Path(f"/proc/{owner.group(1)}").exists():
            _ip("netns", "del", name, check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.213.0.0/16 that no address or route of this namespace touches, else
    one that only a wider route (a /16, a /8) covers: the /24 wins there while it lasts."""
    used = _ip("-4", "-o", "addr", "show", check=False).stdout
    used += _ip("-4", "route", check=False).stdout
    taken = {
        ipaddress.ip_network(m, strict=False)
        for m in re.findall(r"(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", used)
    }
    subnets = list(_BASE.subnets(new_prefix=24))[1:-1]
    secrets.SystemRandom().shuffle(subnets)
    for allowed in (lambda t: False, lambda t: t.prefixlen < 24):
        for net in subnets:
            if all(allowed(t) or not net.overlaps(t) for t in taken):
                return net
    raise RuntimeError("no free /24 in 10.213.0.0/16 for a test network")


@dataclass
class Host:
    """One machine of a ``Network``: its name (also its hostname), namespace and address."""

    name: str
    netns: str
    address: str
    port: str  # its cable's end in the switch
    tmp: Path  # its own temporary folder (TMPDIR of what runs on it)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host: in its namespace, under its hostname. ``ip netns
        exec``, ``unshare`` and the shell each exec the next, so the process started is
        ``argv`` itself (its pid, its signals)."""
        return [
            *("ip", "netns", "exec", self.netns, "unshare", "--uts", "--"),
            *("sh", "-c", 'hostname "$0" && exec "$@"', self.name),
            *argv,
        ]

    def env(self) -> dict[str, str]:
        return {"TMPDIR": str(self.tmp)}

    def run(self, *argv: str) -> str:
        """Run a command on this host to the end; its standard output."""
        return subprocess.run(self.command(argv), capture_output=True, text=True, check=True).stdout

    def connections(self) -> list[tuple[str, str]]:
        """(local, peer) address:port of each established TCP connection on this host."""
        rows = self.run("ss", "-Htn", "state", "established").splitlines()
        return [(cols[-2], cols[-1]) for cols in (r.split() for r in rows) if len(cols) >= 2]

    def listening(self) -> list[str]:
        """address:port of each TCP socket listening on this host."""
        rows = self.run("ss", "-Htln").splitlines()
        return [cols[3] for cols in (r.split() for r in rows) if len(cols) >= 4]


class Network:
    """A switch and the hosts cabled to it, plus a cable from this process's namespace."""

    def __init__(self, root: Path) -> None:
        """``root``: where the hosts' temporary folders go (one folder each)."""
        _delete_stale()
        self.root = root
        self.id = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.subnet = _free_subnet()
        self.hosts: dict[str, Host] = {}
        self._hub = f"{self.id}-hub"
        self._cable = f"ct{secrets.token_hex(5)}"  # this namespace's end (15 chars at most)
        *addresses, last = self.subnet.hosts()
        self.own_address = str(last)  # this process's, on its cable
        self._addresses = iter(addresses)
        self._ports = itertools.count(1)
        try:
            _ip("netns", "add", self._hub)
            _ip("-n", self._hub, "link", "add", SWITCH, "type", "bridge")
            _ip("-n", self._hub, "link", "set", SWITCH, "up")
            self._plug(self._cable, None, "up0")
            _ip("addr", "add", f"{self.own_address}/{self.subnet.prefixlen}", "dev", self._cable)
            _ip("link", "set", self._cable, "up")
        except BaseException:
            self.close()
            raise

    def _plug(self, end: str, netns: str | None, port: str) -> None:
        """A cable from ``end`` (in ``netns``; None: this process's) to switch ``port``."""
        where = ("netns", netns) if netns else ()
        peer = ("peer", "name", port, "netns", self._hub)
        _ip("link", "add", "name", end, *where, "type", "veth", *peer)
        _ip("-n", self._hub, "link", "set", port, "master", SWITCH, "up")

    def add_host(self, name: str) -> Host:
        """A new host called ``name`` (a hostname: letters, digits, '-'), up and cabled."""
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", name) or name in self.hosts:
            raise ValueError(f"host name {name!r}: taken, or not a short lowercase hostname")
        host = Host(
            name=name,
            netns=f"{self.id}-{name}",
            address=str(next(self._addresses)),
            port=f"p{next(self._ports)}",
            tmp=self.root / name / "tmp",
        )
        host.tmp.mkdir(parents=True, exist_ok=True)
        _ip("netns", "add", host.netns)
        self.hosts[name] = host  # from here on, close removes it
        self._plug("eth0", host.netns, host.port)
        cidr = f"{host.address}/{self.subnet.prefixlen}"
        _ip("-n", host.netns, "addr", "add", cidr, "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        return host

    def take_away(self, host: Host) -> None:
        """The host goes as a machine dies: cable pulled, processes killed, namespace gone."""
        _ip("-n", self._hub, "link", "set", host.port, "down", check=False)
        try:
            _kill_all(host.netns)
        finally:
            _ip("netns", "del", host.netns, check=False)
            self.hosts.pop(host.name, None)

    def close(self) -> None:
        """Every host taken away, then the switch and this process's cable."""
        errors: list[BaseException] = []
        for host in list(self.hosts.values()):
            try:
                self.take_away(host)
            except Exception as exc:  # remove the rest anyway
                errors.append(exc)
        _ip("link", "del", self._cable, check=False)
        _ip("netns", "del", self._hub, check=False)
        if errors:
            raise errors[0]

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
