"""Child processes the benchmark starts, and the guarantee that they all go away.

Every child runs in its own session (so a terminal's Ctrl-C reaches only the benchmark,
which then stops them in order) with its output in a log file, and asks the kernel to
send it SIGTERM if the benchmark itself dies (``PR_SET_PDEATHSIG``), so not even a
SIGKILLed benchmark leaves servers behind. ``Group.close`` stops the children it started,
newest first, by process group: SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from conch.devtools import processes

_GUARD = """
import os, signal, sys
pid, parent = int(sys.argv[1]), int(sys.argv[2])
def stop(*_):
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
if os.getppid() != parent:  # the benchmark died before the death signal was armed
    stop()
while True:
    signal.pause()
"""


class Child:
    def __init__(self, name: str, proc: subprocess.Popen, log_path: Path, log_file) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path
        self._log_file = log_file

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 15.0) -> int | None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        # Whatever is left of the group (forked helpers of a child that already exited).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            self._log_file.close()
        return self.proc.returncode


class Group:
    """The children of one phase; a context manager that stops them all on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []

    def start(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115  (closed in Child.stop)
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = processes.spawn(cmd, log_file, env=full_env, cwd=cwd)
        child = Child(name, proc, log_path, log_file)
        self.children.append(child)
        return child

    def guard(self, name: str, pid: int) -> Child:
        """Make sure process ``pid`` (started by someone else) dies with this group.

        Starts a small watchdog child that sends ``pid`` SIGTERM when the watchdog is
        stopped, which happens when the group closes or, through ``PR_SET_PDEATHSIG``,
        when the benchmark dies without closing it.
        """
        return self.start(
            f"{name}-guard",
            [sys.executable, "-c", _GUARD, str(pid), str(os.getpid())],
        )

    def check_alive(self) -> None:
        for c in self.children:
            if not c.alive():
                raise RuntimeError(
                    f"{c.name} exited with status {c.proc.returncode}; "
                    f"last lines of {c.log_path}:\n{c.log_tail()}"
                )

    def close(self) -> None:
        while self.children:
            self.children.pop().stop()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: str | int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3 is index 0)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pids: Sequence[int] = (), sessions: Sequence[int] = ()) -> dict[int, float]:
    """User+system CPU seconds so far of each pid, and of all live processes of each session.

    Keys are the pids and session ids given. CPU of processes that already exited is not
    counted (the servers' processes live for the whole measurement).
    """
    out: dict[int, float] = dict.fromkeys([*pids, *sessions], 0.0)
    wanted_sessions = set(sessions)
    wanted_pids = set(pids)
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return out
    for entry in entries:
        fields = _stat_fields(entry)
        if fields is None or len(fields) < 13:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime
        session = int(fields[3])
        if session in wanted_sessions:
            out[session] += seconds
        if int(entry) in wanted_pids:
            out[int(entry)] += seconds
    return out


def session_pids(session: int) -> list[int]:
    """The live processes of ``session`` (a child ``Group.start`` began leads its own)."""
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    found = []
    for entry in entries:
        fields = _stat_fields(entry)
        if fields is not None and len(fields) > 3 and int(fields[3]) == session:
            found.append(int(entry))
    return found


def on_cpu_seconds(pids: Sequence[int]) -> float:
    """Seconds the live threads of ``pids`` have run on a CPU, in nanoseconds' detail.

    ``cpu_seconds`` counts clock ticks (10 ms each), too coarse for a process that works
    a few milliseconds per measurement (Redis under one drain loop). The scheduler's own
    count per thread (/proc/<pid>/task/<tid>/schedstat, first field) is exact. Threads
    that already exited are not counted; what is unreadable counts 0.
    """
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def wait_until(predicate, timeout_s: float, group: Group | None = None, what: str = "") -> None:
    """Until ``predicate`` holds; RuntimeError as soon as a child of ``group`` exits,
    TimeoutError with the log tails of its children after ``timeout_s``."""
    watch = group.check_alive if group is not None else None
    if processes.wait_until(predicate, timeout_s, watch=watch, every=0.2):
        return
    tails = ""
    if group is not None:
        tails = "".join(f"\n--- {c.name} ({c.log_path}):\n{c.log_tail(15)}" for c in group.children)
    raise TimeoutError(f"{what or 'condition'} not reached within {timeout_s:.0f} s{tails}")
