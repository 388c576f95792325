"""``conch grpc --grpc-workers N`` (N > 1): N gRPC server processes on one port.

A gRPC server, on grpcio or on h2, is bound by its process's GIL (bench/README.md, "Served
on the H100"), so, as gunicorn does for the gateway, more processes serve the port: each a
``conch grpc`` child of its own (a fresh interpreter, on the same ``--grpc-transport``: its
own grpcio core or gevent hub, and Redis connections), binding
with SO_REUSEPORT so that the kernel spreads new connections among them. This process
only supervises: it checks first that no other process listens on the port (a port in
use stays an error), forwards SIGTERM and SIGINT, restarts none, and stops the rest when
one exits, with its exit status.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time

from conch.autoscale.pool import EXIT_MARGIN_S, stop_processes
from conch.cli.stop_signal import StopSignal
from conch.frontend.grpc.transport import vacant_port
from conch.settings import GRPC_SHARED_PORT_ENV, Role, Settings

log = logging.getLogger("conch.grpc")


def run(settings: Settings) -> int:
    """Start ``settings.grpc_workers`` servers; return once they have all exited."""
    port = vacant_port(settings.grpc_address, settings.grpc_port)  # --grpc-port 0: one for all
    child = dataclasses.replace(settings, grpc_port=port, grpc_workers=1, grpc_shared_port=True)
    argv = [sys.executable, "-m", "conch", Role.GRPC.value, *child.to_args(Role.GRPC)]
    # child_env carries the secret flags; the shared port has no flag, only its variable.
    env = {**os.environ, **child.child_env(Role.GRPC), GRPC_SHARED_PORT_ENV: "1"}
    stop = StopSignal()
    children = [subprocess.Popen(argv, env=env) for _ in range(settings.grpc_workers)]
    log.info(
        "%d gRPC server processes on %s:%d: %s",
        len(children),
        settings.grpc_address,
        port,
        " ".join(str(c.pid) for c in children),
    )
    code = 0
    try:
        while not stop.requested:
            for c in children:
                if c.poll() is not None:
                    log.error(
                        "gRPC server process %d exited with %s; stopping", c.pid, c.returncode
                    )
                    stop.requested, code = True, c.returncode or 1
                    break
            time.sleep(0.2)
    finally:
        stop_processes(children, settings.exit_timeout_secs + EXIT_MARGIN_S)
    return code or int(any(c.returncode for c in children))
