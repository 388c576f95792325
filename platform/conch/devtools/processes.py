"""Child processes for the tests and the benchmark (bench/): the argv that runs conch,
waiting on a condition while the processes it depends on stay up, and a bounded run.

Each caller keeps what is its own: the tests fail with an assertion and the service's log,
the benchmark with the log tails of its process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1


def conch(*args: str) -> list[str]:
    """The argv of ``conch <args>`` run by this interpreter (``python -m conch``)."""
    return [sys.executable, "-m", "conch", *args]


def wait_until(
    pred: Callable[[], bool],
    timeout: float,
    *,
    watch: Callable[[], None] | None = None,
    every: float = 0.1,
) -> bool:
    """Ask ``pred`` every ``every`` seconds: True once it holds, False when ``timeout``
    seconds pass first. ``watch`` runs after each no: it raises to fail fast, when a
    process the condition depends on has died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if watch is not None:
            watch()
        time.sleep(every)
    return False


def die_with_parent() -> None:
    """A ``preexec_fn``: the kernel sends the child SIGTERM when its parent dies
    (``PR_SET_PDEATHSIG``), so not even a SIGKILLed parent leaves it behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn(
    cmd: Sequence[str],
    log_file: IO[bytes],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen:
    """``cmd`` started in a session of its own (a terminal's Ctrl-C reaches only its
    parent), its output to ``log_file``, dying with its parent (``die_with_parent``)."""
    return subprocess.Popen(
        list(cmd),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
    )


def run_bounded(
    cmd: Sequence[str],
    *,
    timeout_s: float,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[int | None, str]:
    """Run a command to completion in its own session, output to ``log_path``.

    Returns (exit status or None on timeout, output). On timeout or interruption the
    whole process group is killed before this returns or re-raises.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:
        proc = spawn(cmd, log_file, env=env, cwd=cwd)
        code: int | None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return code, log_path.read_text(errors="replace")
