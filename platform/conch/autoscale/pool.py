"""The worker processes an autoscaler runs: started from one command line, retired by SIGTERM.

A worker retired by SIGTERM does what it does on any warm shutdown (``conch.worker``): it
stops taking messages, finishes the batch in progress, hands every message it holds back
to the head of its queue, and exits. So a scale-down fails no request; the pool only has
to wait for the worker, and kill it if it outlives its grace (the worker's own
``--exit-timeout-secs`` plus a margin: what it held then comes back after the visibility
timeout). The newest worker is retired first: it may still be loading its models.

Workers run in their own session, so the signal that stops the autoscaler (Ctrl-C in a
terminal included) reaches each worker once, from here. A worker that exits on its own is
replaced on the next resize, after a backoff that grows while workers keep dying young
(a broken broker URL, a model that crashes its process), so they are not restarted in a
tight loop.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

EXIT_MARGIN_S = 5.0  # past a child's own exit timeout, before it is killed
YOUNG_S = 30.0  # a worker that exits sooner than this after it started died young
MAX_BACKOFF_S = 30.0  # the longest wait before a worker that died young is replaced


def stop_processes(procs: Iterable[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every process still running, give each until ``grace_s`` from now to
    exit, then SIGKILL it."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    _wait_all(procs, time.monotonic() + grace_s)


def _wait_all(procs: Iterable[subprocess.Popen], deadline: float) -> None:
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("process %d still running past its exit grace; killing it", p.pid)
            p.kill()
            p.wait()


@dataclass
class _Retiring:
    proc: subprocess.Popen
    kill_at: float  # monotonic time past which it is killed


class WorkerPool:
    """Worker processes, grown and shrunk to a count (``resize``)."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.command = list(command)
        self.env = dict(env) if env is not None else None
        self.grace_s = grace_s
        self._clock = clock
        self._active: list[tuple[subprocess.Popen, float]] = []  # (process, started at)
        self._retiring: list[_Retiring] = []
        self._backoff_s = 0.0
        self._hold_until = float("-inf")  # no worker is started before this

    @property
    def size(self) -> int:
        """Workers running and not retiring (starting ones included)."""
        return len(self._active)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _ in self._active]

    @property
    def retiring_pids(self) -> list[int]:
        return [r.proc.pid for r in self._retiring]

    def resize(self, count: int) -> None:
        """Start or retire workers until ``count`` run (starts wait out a backoff)."""
        while len(self._active) > count:
            proc, _ = self._active.pop()  # the newest first
            proc.send_signal(signal.SIGTERM)
            self._retiring.append(_Retiring(proc, self._clock() + self.grace_s))
            log.info("retiring worker %d: it finishes its batch and hands back the rest", proc.pid)
        while len(self._active) < count and self._clock() >= self._hold_until:
            proc = subprocess.Popen(self.command, env=self.env, start_new_session=True)
            self._active.append((proc, self._clock()))
            log.info("started worker %d", proc.pid)

    def reap(self) -> None:
        """Forget workers that exited; kill retiring ones past their grace."""
        now = self._clock()
        for proc, started in list(self._active):
            if proc.poll() is None:
                continue
            self._active.remove((proc, started))
            if now - started < YOUNG_S:
                self._backoff_s = min(MAX_BACKOFF_S, max(1.0, 2 * self._backoff_s))
                self._hold_until = now + self._backoff_s
            else:
                self._backoff_s = 0.0
            log.error(
                "worker %d exited with %s after %.0f s; replacing it%s",
                proc.pid,
                proc.returncode,
                now - started,
                f" in {self._hold_until - now:.0f} s" if self._hold_until > now else "",
            )
        for r in list(self._retiring):
            if r.proc.poll() is not None:
                self._retiring.remove(r)
                log.info("worker %d retired (exit status %s)", r.proc.pid, r.proc.returncode)
            elif now > r.kill_at:
                log.error("worker %d still running past its exit grace; killing it", r.proc.pid)
                r.proc.kill()

    def stop(self) -> None:
        """Retire every worker and wait for all of them (killing any past its grace)."""
        self.resize(0)
        left = max((r.kill_at for r in self._retiring), default=0.0) - self._clock()
        _wait_all((r.proc for r in self._retiring), time.monotonic() + max(0.0, left))
        self._retiring = []


__all__ = ["EXIT_MARGIN_S", "WorkerPool", "stop_processes"]
