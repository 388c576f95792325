"""The pure parts of process instances: what a child is sent, what the pipe carries, how the
worker decides a model's form, and how the report's instances reach ``/metrics``. The
real path (children spawned, killed, reloaded) is tests/integration/serving/
test_process_instances.py."""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

from conch.backends.base import InstanceSpec
from conch.core.errors import ModelLoadError
from conch.core.model_config import parse_config
from conch.core.repository import ModelEntry
from conch.core.restricted_apis import RestrictedApis
from conch.frontend.http import metrics
from conch.settings import InstanceForm, Settings
from conch.wire import worker_reports
from conch.worker import instance
from conch.worker.host import ModelHost
from conch.worker.process_instance import Command, Event, InstancePlan, order, read, send

CONFIG = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""


def entry(extra: str = "") -> ModelEntry:
    config = parse_config(CONFIG + extra, model="m", source="test")
    return ModelEntry("m", Path("/models/m"), config=config, versions=[1, 3], backend="python")


def test_a_plan_travels_whole_to_a_spawned_child() -> None:
    """Spawn pickles the plan: the settings (restricted APIs included) and the model's
    config come back equal, the config rebuilt from Triton's bytes."""
    settings = Settings(http_restricted_api=RestrictedApis.parse(["inference:key=secret"]))
    plan = InstancePlan.of(settings, "w1", entry(), InstanceSpec("m_0", "CPU"))
    back = pickle.loads(pickle.dumps(plan))
    assert back == plan
    assert back.settings.http_restricted_api.rules == settings.http_restricted_api.rules
    rebuilt = back.entry()
    assert rebuilt.config == entry().config
    assert (rebuilt.name, rebuilt.versions, rebuilt.backend) == ("m", [1, 3], "python")
    assert back.metrics_id == "w1/m/m_0"


def test_the_pipe_carries_json_not_pickles() -> None:
    ours, theirs = multiprocessing.Pipe()
    send(theirs, Event.COUNTS, counts={"m": {"requests": 3}})
    assert read(ours) == {"event": "counts", "counts": {"m": {"requests": 3}}}
    order(ours, Command.STOP)
    assert Command(read(theirs)["do"]) is Command.STOP
    theirs.send_bytes(pickle.dumps({"event": "loaded"}))
    with pytest.raises(ValueError):
        read(ours)  # a pickle is not JSON, and is never unpickled
    theirs.send_bytes(b"[1, 2]")
    with pytest.raises(ValueError, match="not an instance message"):
        read(ours)


def host(form: InstanceForm, *, main: object = print) -> ModelHost:
    h = ModelHost.__new__(ModelHost)
    h.settings = Settings(instance_form=form)
    h.instance_main = main  # type: ignore[assignment]
    return h


@pytest.mark.parametrize(
    ("flag", "param", "expected"),
    [
        (InstanceForm.THREAD, "", InstanceForm.THREAD),
        (InstanceForm.PROCESS, "", InstanceForm.PROCESS),
        (InstanceForm.THREAD, "process", InstanceForm.PROCESS),  # the model's wins
        (InstanceForm.PROCESS, " Thread ", InstanceForm.THREAD),
    ],
)
def test_a_models_parameter_wins_over_the_flag(
    flag: InstanceForm, param: str, expected: InstanceForm
) -> None:
    extra = (
        f'parameters {{ key: "instance_form" value: {{ string_value: "{param}" }} }}'
        if param
        else ""
    )
    assert host(flag)._form(entry(extra)) is expected


def test_preserve_ordering_and_no_child_entry_keep_threads() -> None:
    ordered = entry("dynamic_batching { preserve_ordering: true }")
    assert instance.ordered(ordered)
    assert host(InstanceForm.PROCESS)._form(ordered) is InstanceForm.THREAD
    assert host(InstanceForm.PROCESS, main=None)._form(entry()) is InstanceForm.THREAD


def test_a_wrong_form_is_a_load_error() -> None:
    odd = entry('parameters { key: "instance_form" value: { string_value: "fiber" } }')
    with pytest.raises(ModelLoadError, match="must be one of thread, process, not 'fiber'"):
        host(InstanceForm.THREAD)._form(odd)


def test_process_instances_reach_the_metrics_port() -> None:
    reports = [
        {
            "id": "w1",
            "instances": [
                {
                    "model": "m",
                    "instance": "m_0",
                    "pid": 7,
                    "host_bytes": 1000,
                    "gpu_bytes": 2000,
                    "metrics_id": "w1/m/m_0",
                },
                {"model": "m", "instance": "m_1", "pid": 8, "host_bytes": 900, "gpu_bytes": None},
            ],
        },
        {"id": "w2"},  # a worker whose instances are threads (or an older one: no key)
    ]
    found = worker_reports.process_instances(reports)
    assert [(i["worker"], i["instance"]) for i in found] == [("w1", "m_0"), ("w1", "m_1")]
    assert worker_reports.metrics_sources(reports) == ["w1", "w2", "w1/m/m_0"]
    plane = SimpleNamespace(process_instances=lambda: found)
    lines = metrics._instance_memory(plane.process_instances())
    assert lines[1] == "# TYPE conch_instance_memory_bytes gauge"
    assert lines[2:] == [
        'conch_instance_memory_bytes{model="m",instance="m_0",worker="w1",memory="host"} 1000',
        'conch_instance_memory_bytes{model="m",instance="m_0",worker="w1",memory="gpu"} 2000',
        'conch_instance_memory_bytes{model="m",instance="m_1",worker="w1",memory="host"} 900',
    ]
    assert metrics._instance_memory([]) == []
