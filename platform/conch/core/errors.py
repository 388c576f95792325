"""Errors that carry the HTTP status Triton would answer with.

Everything raised on the request path is one of these, so the gateway can turn it into
Triton's ``{"error": "..."}`` body without guessing at a status code.
"""

from __future__ import annotations


class ConchError(Exception):
    """An error with a Triton status. The message is what the client reads."""

    status: int = 500
    code: str = "INTERNAL"

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


class Unsupported(ConchError):
    status = 501
    code = "UNSUPPORTED"


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


def error_class(name: str) -> type[ConchError]:
    """One of these classes by name (a Celery task's stored exc_type); Internal if none."""
    found = next((c for c in _BY_CODE.values() if c.__name__ == name), None)
    if found is None and name == ModelLoadError.__name__:
        found = ModelLoadError
    return found or Internal
