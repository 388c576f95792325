"""The HTTP frontend: Triton's HTTP/REST protocol as a Flask app, served by gunicorn.

Importing the package imports nothing else, so ``gevent_patch`` can run before redis,
ssl or gunicorn are loaded; the app factory is ``conch.frontend.http.app.create_app``.
"""
