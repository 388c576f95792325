"""The worker's half of ``--instance-form process``: start, watch and restart one child.

``InstanceProcess`` stands where a thread instance's drain loop stands in ``ModelHost``
(``start``, ``stop``, ``join``), so loads, reloads, unloads and SIGTERM treat both forms
alike: a new version's children load and warm up beside the serving ones, are told to
``start`` once every one of them is loaded (the switch), and the old ones are told to
``stop`` (finish the batch, hand back, exit). The child itself is
``conch.worker.process_instance``; it is spawned, never forked, since a worker's threads
and Redis connections (and CUDA, which refuses a fork) must not be copied into it.

A child that dies while serving (a crash in a model, the kernel's OOM killer) is started
again after a pause that grows while it keeps dying young, and serves once it has loaded
again. What it held is not lost: nobody touches its tags any more, so the broker's
visibility timeout brings them back to the queue (``conch_redeliveries_total``), as for
a worker that dies. A child that exits cleanly on its own (SIGTERM sent to it alone) is
not restarted.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from conch.core.errors import ModelLoadError
from conch.worker.host_metrics import resident_bytes
from conch.worker.process_instance import Command, Event, InstancePlan, order, read

log = logging.getLogger(__name__)

# The child's entry: the worker's composition root builds its collaborators there.
InstanceMain = Callable[[InstancePlan, Connection], None]

RESTART_PAUSE_S = 1.0  # before a dead child is started again; doubles while it dies young
MAX_RESTART_PAUSE_S = 30.0
YOUNG_S = 30.0  # a child that dies sooner than this after starting "dies young"
KILL_AFTER_S = 5.0  # a child that ignores stop past its join timeout is killed after this

_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True)
class InstanceMemory:
    """One process instance's memory, for the worker's report and ``/metrics``."""

    model: str
    instance: str
    pid: int
    host_bytes: int
    gpu_bytes: int | None  # None: no GPU metrics here

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "instance": self.instance,
            "pid": self.pid,
            "host_bytes": self.host_bytes,
            "gpu_bytes": self.gpu_bytes,
        }


class InstanceProcess:
    """One model instance running in a child process (see the module docstring)."""

    def __init__(
        self,
        plan: InstancePlan,
        main: InstanceMain,
        *,
        on_batch: Callable[[str, dict[str, int]], None] | None = None,
    ) -> None:
        self.plan = plan
        self.main = main
        self.on_batch = on_batch
        self.name = f"instance-{plan.model}-{plan.instance.name}"
        self.restarts = 0
        self._stopping = threading.Event()
        self._process: Any = None  # the live child (multiprocessing's SpawnProcess)
        self._conn: Connection | None = None
        self._watcher: threading.Thread | None = None

    # -- the ModelHost side: what a drain loop offers ------------------------------------
    def launch(self) -> None:
        """Spawn the child; it loads and warms up its backends (``wait_loaded``)."""
        ours, theirs = _SPAWN.Pipe()
        process = _SPAWN.Process(
            target=self.main, args=(self.plan, theirs), name=self.name, daemon=True
        )
        process.start()
        theirs.close()  # the child's end lives in the child: EOF here when it dies
        self._process, self._conn = process, ours

    def wait_loaded(self) -> None:
        """Block until the child has loaded; ModelLoadError with its reason if it failed
        or died first (its exit status then)."""
        while True:
            message = self._next_message()
            if message is None:
                code = self._process.exitcode
                self.join(timeout=0)
                raise ModelLoadError(
                    f"model '{self.plan.model}' instance {self.plan.instance.name} exited "
                    f"while loading (status {code})"
                )
            event = message.get("event")
            if event == Event.LOADED:
                return
            if event == Event.FAILED:
                self.join(timeout=KILL_AFTER_S)
                raise ModelLoadError(str(message.get("reason") or "the instance failed to load"))
            self._take(message)

    def start(self) -> None:
        """Switch to this instance: the child drains, and is watched from now on."""
        self._command(Command.START)
        self._watcher = threading.Thread(target=self._watch, name=self.name, daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stopping.set()
        self._command(Command.STOP)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the child to finish and exit; kill it if it will not."""
        process = self._process
        if process is not None:
            process.join(timeout)
            if process.is_alive():
                log.warning("%s did not stop in time; killing it", self.name)
                process.kill()
                process.join(KILL_AFTER_S)
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=KILL_AFTER_S)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def memory(self, gpu: dict[int, int] | None = None) -> InstanceMemory | None:
        """The child's resident memory (and GPU memory, from ``gpu``: bytes by pid), or
        None while there is no live child."""
        pid = self.pid
        host = resident_bytes(pid) if pid is not None else None
        if pid is None or host is None:
            return None
        return InstanceMemory(
            self.plan.model,
            self.plan.instance.name,
            pid,
            host,
            None if gpu is None else gpu.get(pid, 0),
        )

    # -- watching ------------------------------------------------------------------------
    def _watch(self) -> None:
        """Forward the child's counts until it exits; restart it if it died serving."""
        pause = RESTART_PAUSE_S
        while True:
            started = time.monotonic()
            while (message := self._next_message()) is not None:
                self._take(message)
            self._process.join()
            code = self._process.exitcode
            if self._stopping.is_set() or code == 0:
                if code != 0 and not self._stopping.is_set():
                    log.warning("%s exited on its own (status %s)", self.name, code)
                return
            pause = RESTART_PAUSE_S if time.monotonic() - started > YOUNG_S else pause
            log.error(
                "%s died (status %s); its requests come back after the visibility "
                "timeout; starting it again in %.0f s",
                self.name,
                code,
                pause,
            )
            if self._stopping.wait(pause):
                return
            pause = min(MAX_RESTART_PAUSE_S, pause * 2)
            if not self._restart():
                continue
            self._command(Command.STOP if self._stopping.is_set() else Command.START)

    def _restart(self) -> bool:
        """A new child for the same instance, loaded; False if it could not load."""
        self.restarts += 1
        self.plan = replace(self.plan, generation=self.plan.generation + 1)
        try:
            self.launch()
            self.wait_loaded()
        except ModelLoadError as exc:
            log.error("%s could not start again: %s", self.name, exc.message)
            return False
        log.info("%s started again (pid %s)", self.name, self.pid)
        return True

    def _next_message(self) -> dict[str, Any] | None:
        """The child's next message, or None once its pipe closed (it exited)."""
        conn = self._conn
        while True:
            ready = wait([conn, self._process.sentinel])
            if conn in ready:
                try:
                    return read(conn)
                except (EOFError, OSError):
                    return None
                except ValueError as exc:
                    log.error("%s sent a bad message: %s", self.name, exc)
                    continue
            if not conn.poll():  # exited, with nothing left to read
                return None

    def _take(self, message: dict[str, Any]) -> None:
        if message.get("event") == Event.COUNTS and self.on_batch is not None:
            counts = message.get("counts")
            if isinstance(counts, dict):
                for model, c in counts.items():
                    self.on_batch(model, c)

    def _command(self, command: Command) -> None:
        try:
            if self._conn is not None:
                order(self._conn, command)
        except OSError:  # the child is gone; the watcher restarts it, or it was stopping
            pass
