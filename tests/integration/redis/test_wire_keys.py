"""Redis keys of models whose names hold '.': no model's key is another model's key."""

from __future__ import annotations

import redis

from conch.wire import broker, control_bus


def test_a_model_named_like_another_models_wake_list_has_a_queue_of_its_own() -> None:
    x_keys = {
        broker.wake_key(broker.queue_name("x")),
        broker.in_flight_key(broker.queue_name("x")),
        *broker.priority_keys(broker.queue_name("x")),
    }
    for name in ("x.wake", "x.in_flight", "x_in_flight"):
        other = broker.queue_name(name)
        assert other not in x_keys
        assert not x_keys & set(broker.priority_keys(other))
        assert broker.in_flight_key(other) not in x_keys


def test_overrides_of_model_files_x_and_of_model_x_are_apart(rclient: redis.Redis) -> None:
    for key in rclient.scan_iter(match="conch.override.*"):
        rclient.delete(key)
    control_bus.set_override(rclient, "files.x", '{"max_batch_size": 2}')
    control_bus.set_override(rclient, "x", None, {"1/model.py": b"pass"})
    # Loading x left the config of files.x alone, and only x exists through its files.
    assert control_bus.get_override(rclient, "files.x") == '{"max_batch_size": 2}'
    assert control_bus.override_models(rclient) == {"x"}
    control_bus.set_override(rclient, "files.x", None)
    assert control_bus.override_models(rclient) == {"x"}
    assert control_bus.get_override(rclient, "x") is None
