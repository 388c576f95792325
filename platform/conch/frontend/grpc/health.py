"""gRPC's standard health service (``grpc.health.v1.Health/Check``), for Kubernetes probes.

Kubernetes' ``grpc`` probe and ``grpc_health_probe`` call ``Check``. Service "" (or the
inference service's full name) is the server, SERVING when it is ready, as Triton
answers; any other service name is a model, SERVING when its latest version is ready.
An unknown model is NOT_FOUND, as the health protocol has it. Under
``--grpc-restricted-protocol`` it is in the health group, as in Triton.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conch.core.errors import ConchError, InvalidArgument, NotFound
from conch.core.restricted_apis import ApiGroup
from conch.frontend.grpc.service import InferenceService, status_code

SERVER_SERVICES = ("", "inference.GRPCInferenceService")
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthService(health_pb2_grpc.HealthServicer):
    """``Check`` over the same data plane as the inference service."""

    def __init__(self, inference: InferenceService) -> None:
        self.inference = inference

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.inference.check_restriction(ApiGroup.HEALTH, context)
        plane = self.inference.plane
        try:
            if request.service in SERVER_SERVICES:
                ready = plane.ready()
            else:
                ready = plane.model_ready(request.service)
        except (NotFound, InvalidArgument) as exc:  # an unknown model
            context.abort(grpc.StatusCode.NOT_FOUND, exc.message)
        except ConchError as exc:
            if status_code(exc) is grpc.StatusCode.UNAVAILABLE:
                ready = False  # the broker is down, the model not available: not serving
            else:
                context.abort(status_code(exc), exc.message)
        return health_pb2.HealthCheckResponse(status=_SERVING if ready else _NOT_SERVING)


__all__ = ["SERVER_SERVICES", "HealthService"]
