"""Errors that carry the HTTP status Triton would answer with.

Everything raised on the request path is one of these, so the gateway can turn it into
Triton's ``{"error": "..."}`` body without guessing at a status code.
"""

from __future__ import annotations


class ConchError(Exception):
    """An error with a Triton status. The message is what the client reads."""

    status: int = 500
    code: str = "INTERNAL"
    retry_after_s: int | None = None  # when to try again, for a Retry-After header

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgument(ConchError):
    status = 400
    code = "INVALID_ARG"


class NotFound(ConchError):
    status = 404
    code = "NOT_FOUND"


class Unavailable(ConchError):
    status = 503
    code = "UNAVAILABLE"


class BrokerUnavailable(Unavailable):
    """Redis, the broker and store everything goes through, cannot be reached now.

    Triton's UNAVAILABLE (503) with a ``Retry-After``: nothing is wrong with the request,
    and the same request is worth sending again once Redis is back.
    """

    retry_after_s = 1


class Unsupported(ConchError):
    status = 501
    code = "UNSUPPORTED"


class Forbidden(ConchError):
    """Refused by the server's own policy (a restricted API, a disabled feature). Triton
    answers a restricted HTTP API with 403; its gRPC frontend has no permission code
    and says UNAVAILABLE, which is this error's code."""

    status = 403
    code = "UNAVAILABLE"


class Internal(ConchError):
    status = 500
    code = "INTERNAL"


class Unknown(ConchError):
    status = 400
    code = "UNKNOWN"


class AlreadyExists(ConchError):
    status = 400
    code = "ALREADY_EXISTS"


class Cancelled(ConchError):
    status = 400
    code = "CANCELLED"


class ModelLoadError(ConchError):
    """A model that cannot be loaded or whose config is broken. It says which and why."""

    status = 400
    code = "INVALID_ARG"


class StartFailed(ModelLoadError):
    """Triton's ``--exit-on-error``: models to be served from the start failed to load,
    so the server does not start (Triton's "failed to load all models"); ``reasons``:
    each model's why."""

    def __init__(self, reasons: dict[str, str]) -> None:
        self.reasons = reasons
        named = "; ".join(f"'{name}': {why}" for name, why in sorted(reasons.items()))
        super().__init__(f"failed to load all models ({named})")


# Triton's error codes by name (``ConchError.code``), with their numbers: Triton's
# TRITONSERVER_Error_Code order, which ``pb_utils.TritonError``'s constants are. With
# ``_BY_CODE`` below (name -> class) this is the one table for both directions: a conch
# error to a Python model's TritonError (BLS responses) and back (a model's error response).
TRITON_CODES: dict[str, int] = {
    "UNKNOWN": 0,
    "INTERNAL": 1,
    "NOT_FOUND": 2,
    "INVALID_ARG": 3,
    "UNAVAILABLE": 4,
    "UNSUPPORTED": 5,
    "ALREADY_EXISTS": 6,
    "CANCELLED": 7,
}

_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        Unavailable,
        Unsupported,
        Internal,
        Unknown,
        AlreadyExists,
        Cancelled,
    )
}


def from_code(code: str, message: str, status: int | None = None) -> ConchError:
    """Rebuild an error sent across the broker by its Triton code."""
    return _BY_CODE.get(code, Internal)(message, status)


def triton_code(code: str) -> int:
    """Triton's number for a code name (``"INVALID_ARG"`` -> 3); INTERNAL's when unknown."""
    return TRITON_CODES.get(code, TRITON_CODES["INTERNAL"])


def error_class(name: str) -> type[ConchError]:
    """One of these classes by name (a Celery task's stored exc_type); Internal if none."""
    found = next((c for c in _BY_CODE.values() if c.__name__ == name), None)
    if found is None and name == ModelLoadError.__name__:
        found = ModelLoadError
    return found or Internal
