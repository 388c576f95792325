"""The data plane's construction, shared by every frontend process.

The HTTP gateway (``frontend.http.app``) and the gRPC server (``frontend.grpc.server``)
each run one ``DataPlane`` built here, the same way: one Redis client, the model view
following the repository (with the repository's auto-completer, the one edge from a
frontend to backend code), the dispatcher and the response cache (``--cache-config``);
and the process follows the logging API's changes (``conch.wire.log_control``) and
sends its spans where ``--trace-config`` says, sampled as the trace extension last
said (``conch.core.tracing``, ``conch.wire.trace_control``).
"""

from __future__ import annotations

from conch import server_log
from conch.backends import completion
from conch.core import tracing
from conch.frontend import response_cache
from conch.frontend.dataplane import DataPlane
from conch.frontend.model_view import ModelView
from conch.frontend.producer import Dispatcher
from conch.settings import Settings
from conch.wire import log_control, trace_control
from conch.wire.redis_client import open_client


def build_dataplane(settings: Settings) -> DataPlane:
    """A data plane over ``settings.redis_url``, its model view following the repository."""
    tracing.start(settings.trace_config, "conch-gateway")
    client = open_client(settings.redis_url)
    view = ModelView(settings, client, complete=completion.complete)
    cache = response_cache.open_cache(settings.cache_config, client)
    plane = DataPlane(settings, view, Dispatcher(client), cache)
    view.follow()
    plane.followers = [
        log_control.follow(client, server_log.apply),
        trace_control.TRACING.follow(client, tracing.apply),
    ]
    return plane
