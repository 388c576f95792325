"""Redis URLs as Celery and kombu spell them."""

from __future__ import annotations

import pytest

from conch.wire.redis_url import celery_url


@pytest.mark.parametrize(
    ("given", "celery"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("rediss://:pw@host:6380/2", "rediss://:pw@host:6380/2"),
        ("unix:///tmp/r.sock", "redis+socket:///tmp/r.sock?virtual_host=0"),
        ("unix:///tmp/r.sock?db=3", "redis+socket:///tmp/r.sock?virtual_host=3"),
        (
            "unix://:secret@/run/redis.sock?db=1&socket_timeout=5",
            "redis+socket://:secret@/run/redis.sock?virtual_host=1&socket_timeout=5",
        ),
    ],
)
def test_unix_socket_urls_take_celerys_spelling(given: str, celery: str) -> None:
    assert celery_url(given) == celery
