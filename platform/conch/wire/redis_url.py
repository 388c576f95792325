"""One Redis URL, spelled for each library that opens it.

conch takes redis-py's URLs (``redis://``, ``rediss://``, and ``unix:///path.sock?db=N``
for a Redis on the same host, which skips the TCP stack on every round trip). Celery and
kombu spell the Unix-socket form ``redis+socket:///path.sock?virtual_host=N``; the TCP
forms they read as they are.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit


def celery_url(url: str) -> str:
    """``url`` as Celery's broker and result backend read it."""
    parts = urlsplit(url)
    if parts.scheme != "unix":
        return url
    query = parse_qs(parts.query)
    db = query.pop("db", ["0"])[0]
    rest = {k: v[-1] for k, v in query.items()}
    auth = f"{parts.username or ''}:{parts.password}@" if parts.password else ""
    return f"redis+socket://{auth}{parts.path}?{urlencode({'virtual_host': db, **rest})}"
