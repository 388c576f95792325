"""The HTTP frontend: Triton's HTTP/REST protocol as a Flask app, served by gunicorn."""

from conch.frontend.http.app import create_app

__all__ = ["create_app"]
