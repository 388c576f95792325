"""Triton's trace extension across processes: a change of sampling made through one
gateway reaches every gateway, gRPC server and worker (``conch.wire.shared_settings``;
each applies it with ``conch.core.tracing.apply``). A model's own settings are stored as
``<model>/<key>``, beside the settings for every model.
"""

from __future__ import annotations

from conch.wire.keys import TRACE_COMMANDS, TRACE_SETTINGS
from conch.wire.shared_settings import SharedSettings

TRACING = SharedSettings(TRACE_SETTINGS, TRACE_COMMANDS, "conch-trace-settings")

__all__ = ["TRACING"]
