"""Triton's shared-memory extension over HTTP: register, unregister and status of system
shared-memory regions, and the CUDA twins (refused: not built). All in the restricted
group ``shared-memory``; with ``--allow-client-shm`` off every one answers 403 saying
which flag turns it on. The regions themselves are ``conch.frontend.shared_memory``'s;
infer calls read and write them in ``http_codec``.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, Response, request

from conch.core.errors import InvalidArgument
from conch.core.restricted_apis import ApiGroup
from conch.frontend import v2_json
from conch.frontend.http.api_groups import api_group
from conch.frontend.http.routes import plane
from conch.frontend.shared_memory import SharedMemory

bp = Blueprint("shared_memory", __name__)

SYSTEM = "/v2/systemsharedmemory"
CUDA = "/v2/cudasharedmemory"


def _regions() -> SharedMemory:
    return plane().shared_memory


def _json(obj: Any) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")), mimetype="application/json")


_MAX_BODY = 64 * 1024  # a register request is three fields


def _register_body() -> dict[str, Any]:
    """The register request's JSON object ({"key", "offset", "byte_size"})."""
    raw = request.get_data(cache=False)
    if len(raw) > _MAX_BODY:
        raise InvalidArgument(f"shared memory register request over {_MAX_BODY} bytes")
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise InvalidArgument(v2_json.DEPTH_ERROR) from None
    except ValueError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("the shared memory register request must be a JSON object")
    return doc


@bp.get(f"{SYSTEM}/status")
@bp.get(f"{SYSTEM}/region/<region>/status")
@api_group(ApiGroup.SHARED_MEMORY)
def system_status(region: str = "") -> Response:
    return _json(_regions().status(region))


@bp.post(f"{SYSTEM}/region/<region>/register")
@api_group(ApiGroup.SHARED_MEMORY)
def system_register(region: str) -> Response:
    regions = _regions()
    regions.check_enabled()  # before the body: a disabled feature says so first
    doc = _register_body()
    for field in ("key", "offset", "byte_size"):
        if field not in doc:
            raise InvalidArgument(f"Shared memory register request has no '{field}' field")
    regions.register(region, doc["key"], doc["offset"], doc["byte_size"])
    return Response(b"", status=200)


@bp.post(f"{SYSTEM}/unregister")
@bp.post(f"{SYSTEM}/region/<region>/unregister")
@api_group(ApiGroup.SHARED_MEMORY)
def system_unregister(region: str = "") -> Response:
    _regions().unregister(region)
    return Response(b"", status=200)


@bp.get(f"{CUDA}/status")
@bp.get(f"{CUDA}/region/<region>/status")
@api_group(ApiGroup.SHARED_MEMORY)
def cuda_status(region: str = "") -> Response:
    return _json(_regions().cuda_status(region))


@bp.post(f"{CUDA}/region/<region>/register")
@api_group(ApiGroup.SHARED_MEMORY)
def cuda_register(region: str) -> Response:
    _regions().cuda_register()
    return Response(b"", status=200)  # never: refused above


@bp.post(f"{CUDA}/unregister")
@bp.post(f"{CUDA}/region/<region>/unregister")
@api_group(ApiGroup.SHARED_MEMORY)
def cuda_unregister(region: str = "") -> Response:
    _regions().cuda_unregister(region)
    return Response(b"", status=200)


__all__ = ["bp"]
