"""gevent's monkey patching for a process that runs on gevent, done before anything else
is imported.

gevent asks to be patched before redis (and ssl through it) or gunicorn are imported, so
``conch gateway`` calls this first, and so does ``conch grpc --grpc-transport h2`` (from
``conch.cli``, which may import any room). It lives with the HTTP adapter because the
import contracts let only that adapter import gevent, and it imports nothing of conch.
"""

from __future__ import annotations


def patch_if_gevent(uses_gevent: bool) -> None:
    """Monkey-patch the process when the gateway's gunicorn workers are gevent's."""
    if uses_gevent:
        from gevent import monkey

        monkey.patch_all()
