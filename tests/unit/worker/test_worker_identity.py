"""What a worker is known by, and how its held work comes back, when hosts come and go."""

from __future__ import annotations

import os
import socket

from kombu.transport.redis import Channel

from conch.settings import Settings
from conch.worker.app import transport_options, worker_name


def test_worker_names_are_unique_where_host_name_and_pid_repeat() -> None:
    # Two containers sharing a host's network (so its name) both run their worker as pid 1:
    # the same host name and pid must still give two ids.
    first, second = worker_name(), worker_name()
    prefix = f"{socket.gethostname()}.{os.getpid()}."
    assert first.startswith(prefix) and second.startswith(prefix)
    assert first != second


def test_a_sweep_lock_left_by_a_dead_host_costs_one_visibility_timeout_at_most() -> None:
    # tests/integration/deploy/test_multihost.py shows it on the real path (where hosts can be made).
    for vt in (2.0, 6.0, 30.0):
        options = transport_options(Settings(visibility_timeout_s=vt))
        assert options["visibility_timeout"] == vt
        expire = options.get("unacked_mutex_expire", Channel.unacked_mutex_expire)
        assert 0 < expire <= vt
