"""Triton's logging extension across processes: a change made through one gateway
reaches every gateway, gRPC server and worker (``conch.wire.shared_settings``).

The process that takes a ``POST v2/logging`` checks it and applies it to itself
(``conch.server_log``), then publishes what it changed; every process follows. The log
file is not among the shared settings: it is each process's own (``--log-file``).
"""

from __future__ import annotations

from conch.wire.keys import LOG_COMMANDS, LOG_SETTINGS
from conch.wire.shared_settings import SharedSettings

LOGGING = SharedSettings(LOG_SETTINGS, LOG_COMMANDS, "conch-log-settings")
publish = LOGGING.publish
stored = LOGGING.stored
follow = LOGGING.follow

__all__ = ["LOGGING", "follow", "publish", "stored"]
