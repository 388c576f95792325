"""gRPC's standard health service (``grpc.health.v1.Health/Check``), for Kubernetes probes.

Kubernetes' ``grpc`` probe and ``grpc_health_probe`` call ``Check``. Service "" (or the
inference service's full name) is the server, SERVING when it is ready, as Triton
answers; any other service name is a model, SERVING when its latest version is ready.
An unknown model is NOT_FOUND, as the health protocol has it. Under
``--grpc-restricted-protocol`` it is in the health group, as in Triton.
"""

from __future__ import annotations

from typing import Any

from conch.core.errors import ConchError, InvalidArgument, NotFound
from conch.core.restricted_apis import ApiGroup
from conch.frontend.grpc.call_context import ServicerContext
from conch.frontend.grpc.grpc_framing import Status
from conch.frontend.grpc.protos import health_messages
from conch.frontend.grpc.service import InferenceService, status_code

SERVER_SERVICES = ("", "inference.GRPCInferenceService")
_Response = health_messages().HealthCheckResponse


class HealthService:
    """``Check`` over the same data plane as the inference service (``Watch``, which the
    protocol makes optional, answers UNIMPLEMENTED, as in Triton)."""

    def __init__(self, inference: InferenceService) -> None:
        self.inference = inference

    def Check(self, request: Any, context: ServicerContext) -> Any:
        self.inference.check_restriction(ApiGroup.HEALTH, context)
        plane = self.inference.plane
        try:
            if request.service in SERVER_SERVICES:
                ready = plane.ready()
            else:
                ready = plane.model_ready(request.service)
        except (NotFound, InvalidArgument) as exc:  # an unknown model
            context.abort(Status.NOT_FOUND, exc.message)
        except ConchError as exc:
            if status_code(exc) is Status.UNAVAILABLE:
                ready = False  # the broker is down, the model not available: not serving
            else:
                context.abort(status_code(exc), exc.message)
        return _Response(status=_Response.SERVING if ready else _Response.NOT_SERVING)


__all__ = ["SERVER_SERVICES", "HealthService"]
