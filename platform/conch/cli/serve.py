"""``conch serve``: the whole stack in one command: Redis if needed, one worker, the
gateway and the gRPC server (``--allow-http`` / ``--allow-grpc`` leave either out).

With ``--workers MIN:MAX`` an autoscaler (``conch autoscale``) runs in the worker's place
and starts and retires workers on the work owed; with MIN 0 the frontends are told that
the models may have no worker (``--scale-to-zero``, unless it was given), so they read
ready and take requests while the group is at zero. Its one group runs the batch jobs
too (but with ``--batch-jobs=false``), so the autoscaler counts their queue (``conch
autoscale --jobs``): a job submitted at zero starts a worker.

The worker (or autoscaler) and the frontends run as ``python -m conch <role>`` children, started
with ``settings.to_args(role)`` (and the secrets in ``settings.child_env(role)``, out of
the process list): the same settings, the broker URL resolved once here (a private
redis-server, if this command started one, is shared by all). Settings that have no
flag reach them through the environment they inherit.
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
from conch.settings import Role, Settings

log = logging.getLogger("conch.serve")


def run(settings: Settings) -> int:
    """Start the children, stop all of them when one exits or on SIGTERM/SIGINT."""
    from conch.devtools import redis_server

    # A private Redis serves this host's worker and gateway alone: a Unix socket.
    url, private = redis_server.resolve(
        settings.redis_url, settings.local_redis_url, unix_socket=True
    )
    log.info("broker: %s%s", url, " (private redis-server)" if private else "")
    settings = dataclasses.replace(settings, redis_url=url)
    if settings.workers:  # one group: it runs the batch jobs too, unless told not to
        settings = dataclasses.replace(settings, scale_on_jobs=settings.batch_jobs)
    if settings.workers and settings.workers.minimum == 0 and not settings.scale_to_zero:
        settings = dataclasses.replace(settings, scale_to_zero=settings.models or ["*"])
    roles = [Role.AUTOSCALE if settings.workers else Role.WORKER]
    roles += [Role.GATEWAY] if settings.allow_http else []
    roles += [Role.GRPC] if settings.allow_grpc else []
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "conch", role.value, *settings.to_args(role)],
            env={**os.environ, **settings.child_env(role)},
        )
        for role in roles
    ]
    if settings.allow_http:
        log.info(
            "serving %s on http://%s:%d",
            ", ".join(map(str, settings.model_repository)),
            settings.http_address,
            settings.http_port,
        )
    if settings.allow_grpc:
        log.info(
            "serving %s over gRPC on %s:%d",
            ", ".join(map(str, settings.model_repository)),
            settings.grpc_address,
            settings.grpc_port,
        )

    stop = StopSignal()
    code = 0
    try:
        while not stop.requested:
            for c in children:
                if c.poll() is not None:
                    log.error("%s exited with %s; stopping", c.args[3], c.returncode)
                    stop.requested, code = True, c.returncode or 1
            time.sleep(0.2)
    finally:
        # Each has --exit-timeout-secs to finish its work in flight; an autoscaler gives
        # its workers that and a margin (as conch grpc does its --grpc-workers), so it
        # gets a second margin.
        margins = (
            2 if settings.workers or (settings.allow_grpc and settings.grpc_workers > 1) else 1
        )
        stop_processes(children, settings.exit_timeout_secs + margins * EXIT_MARGIN_S)
        if private is not None:
            private.stop()
    return code
