"""The parts of tracing that need no server: ``--trace-config``, Triton's sampling
(rate, count, level, a parent's flag) and the message's checked ``traceparent``."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import SpanContext, TraceFlags

from conch.cli import parser
from conch.core.trace_config import TraceConfig
from conch.core.tracing import RateSampler, context_of, trace_id
from conch.settings import Role, Settings
from conch.wire.messages import BadMessage, InferMessage

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_trace_config_takes_tritons_forms_and_writes_them_back() -> None:
    config = TraceConfig.parse(
        [
            "mode=opentelemetry",
            "opentelemetry,url=collector:4318/v1/traces",
            "opentelemetry,resource=deployment=prod",
            "rate=10",
            "count=5",
            "level=timestamps",
        ]
    )
    assert config == TraceConfig(
        mode="opentelemetry",
        url="http://collector:4318/v1/traces",
        level="TIMESTAMPS",
        rate=10,
        count=5,
        resource=(("deployment", "prod"),),
    )
    assert config.on and TraceConfig.parse(config.items()) == config
    assert not TraceConfig().on and TraceConfig().items() == []
    assert not TraceConfig.parse(["mode=opentelemetry"]).on  # Triton's level: OFF
    for bad, says in (
        ("mode=triton", "mode=opentelemetry only"),
        ("triton,file=/tmp/t.json", "OpenTelemetry only"),
        ("opentelemetry,bsp_max_queue_size=5", "conch takes"),
        ("rate=0", "at least 1"),
        ("count=-2", "at least -1"),
        ("level=TENSORS", "OFF or TIMESTAMPS"),
        ("log_frequency=5", "unknown key 'log_frequency'"),
        ("rate", "the form is <key>=<value>"),
    ):
        with pytest.raises(ValueError, match=says):
            TraceConfig.parse([bad])


def test_trace_flag_reaches_the_settings_and_is_passed_on() -> None:
    argv = [Role.WORKER.value, "--model-repository=/m", "--trace-config", "level=TIMESTAMPS"]
    settings = Settings.from_args(parser().parse_args(argv), environ={})
    assert settings.trace_config == TraceConfig(mode="opentelemetry", level="TIMESTAMPS")


def _decide(sampler: RateSampler, parent: str = "") -> bool:
    context = context_of(parent) if parent else None
    return sampler.should_sample(context, 1, "infer").decision is Decision.RECORD_AND_SAMPLE


def test_new_traces_are_sampled_one_in_rate_until_count() -> None:
    sampler = RateSampler(TraceConfig(mode="opentelemetry", level="TIMESTAMPS", rate=3, count=2))
    assert [_decide(sampler) for _ in range(9)] == [1, 0, 0, 1, 0, 0, 0, 0, 0]
    off = RateSampler(TraceConfig(mode="opentelemetry", level="OFF", rate=1))
    assert not _decide(off)


def test_a_parents_flag_is_followed_whatever_the_rate() -> None:
    sampler = RateSampler(TraceConfig(mode="opentelemetry", level="OFF"))
    assert _decide(sampler, PARENT)
    assert not _decide(sampler, PARENT[:-2] + "00")
    remote = trace.get_current_span(context_of(PARENT)).get_span_context()
    assert remote == SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(1),
    )
    assert context_of("00-not-a-traceparent") is None
    # Log lines name a sampled trace only.
    assert trace_id(PARENT) == "0af7651916cd43dd8448eb211c80319c"
    assert trace_id(PARENT[:-2] + "00") == trace_id("") == trace_id("00-x") == ""


def _message(**fields: object) -> InferMessage:
    return InferMessage("m1", "add", 1, [], ["OUT"], None, 1.0, 0.0, **fields)  # type: ignore[arg-type]


def test_a_message_carries_a_checked_traceparent() -> None:
    traced = _message(traceparent=PARENT)
    assert InferMessage.from_dict(traced.to_dict()).traceparent == PARENT
    assert "tp" not in _message().to_dict()  # an untraced message stays as it was
    for bad in ("00-xyz", 7, PARENT + "\n", PARENT.upper()):
        body = {**traced.to_dict(), "tp": bad}
        with pytest.raises(BadMessage, match="traceparent"):
            InferMessage.from_dict(body)


def test_the_trace_extensions_changes_apply_per_model() -> None:
    sampler = RateSampler(TraceConfig(mode="opentelemetry", level="TIMESTAMPS", rate=1))

    def decide(model: str) -> bool:
        result = sampler.should_sample(None, 1, "infer", attributes={"model": model})
        return result.decision is Decision.RECORD_AND_SAMPLE

    sampler.apply({"add/trace_rate": "2", "add/trace_count": "2"})
    assert sampler.configured("add").rate == 2 and sampler.configured("other").rate == 1
    assert [decide("add") for _ in range(6)] == [True, False, True, False, False, False]
    assert all(decide("other") for _ in range(3))  # counted apart, at the flags' rate
    sampler.apply({"trace_level": ["OFF"]})
    assert not decide("other") and not decide("add")  # the level for every model holds
    sampler.apply({"trace_level": None, "add/trace_rate": None, "add/trace_count": None})
    assert sampler.shared == {} and all(decide("add") for _ in range(3))
