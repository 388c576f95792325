"""conch: Triton-compatible inference serving on Celery and Redis."""

__version__ = "0.1.0"
