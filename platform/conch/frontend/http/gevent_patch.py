"""gevent's monkey patching for the gateway process, done before anything else is imported.

gevent asks to be patched before redis (and ssl through it) or gunicorn are imported, so
``conch gateway`` calls this first; it lives with the HTTP adapter because only the
gateway runs on gevent, and it imports nothing of conch.
"""

from __future__ import annotations


def patch_if_gevent(uses_gevent: bool) -> None:
    """Monkey-patch the process when the gateway's gunicorn workers are gevent's."""
    if uses_gevent:
        from gevent import monkey

        monkey.patch_all()
