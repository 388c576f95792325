"""The parts of the metrics that need no server: --metrics-config, why a batch was cut,
the host sample, which report a host's figures come from, summary quantiles."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conch.cli import parser
from conch.core.batch_policy import BatchPolicy
from conch.core.metrics_config import DEFAULT_QUANTILES, MetricsConfig
from conch.settings import Role, Settings
from conch.wire import statistics, worker_reports
from conch.worker.host_metrics import CpuSampler, gpu_sampler


def test_metrics_config_takes_tritons_keys_and_writes_them_back() -> None:
    config = MetricsConfig.parse(
        ["summary_latencies=true", "summary_quantiles=0.5:0.05,0.99:0.001", "counter_latencies=0"]
    )
    assert config == MetricsConfig(
        counter_latencies=False,
        summary_latencies=True,
        quantiles=((0.5, 0.05), (0.99, 0.001)),
    )
    assert MetricsConfig.parse(config.items()) == config
    assert MetricsConfig().quantiles == DEFAULT_QUANTILES
    for bad, says in (
        ("summary", "the form is <key>=<value>"),
        ("gpu_latencies=true", "unknown key 'gpu_latencies'"),
        ("histogram_latencies=yes please", "takes true or false"),
        ("summary_quantiles=0.5", "<quantile>:<error>"),
        ("summary_quantiles=1.5:0.1", "between 0 and 1"),
    ):
        with pytest.raises(ValueError, match=says):
            MetricsConfig.parse([bad])


def test_metrics_flags_reach_the_settings() -> None:
    args = parser().parse_args(
        [
            Role.WORKER.value,
            "--model-repository=/m",
            "--metrics-config",
            "histogram_latencies=true",
            "--allow-cpu-metrics=false",
            "--metrics-interval-ms=500",
        ]
    )
    settings = Settings.from_args(args, environ={})
    assert settings.metrics_config.histogram_latencies
    assert not settings.allow_cpu_metrics and settings.allow_gpu_metrics
    assert settings.metrics_interval_ms == 500


def test_why_a_batch_was_cut() -> None:
    policy = BatchPolicy(8, 0.1, (4,))
    assert policy.why_cut(4, False, 0.0, 0.01) == statistics.CUT_PREFERRED
    assert policy.why_cut(8, False, 0.0, 0.01) == statistics.CUT_FULL
    assert policy.why_cut(5, True, 0.0, 0.01) == statistics.CUT_FULL  # no room
    assert policy.why_cut(1, False, 0.0, 0.2) == statistics.CUT_DELAY
    assert policy.why_cut(1, False, 0.0, 0.01) == statistics.CUT_DRAINED  # stopping
    assert BatchPolicy(8, 0.0).why_cut(1, False, 0.0, 0.0) == statistics.CUT_DRAINED


def test_cpu_use_is_measured_between_two_samples(tmp_path: Path) -> None:
    def write(busy: int, idle: int) -> None:
        (tmp_path / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")

    write(100, 900)
    (tmp_path / "meminfo").write_text(
        "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n"
    )
    sampler = CpuSampler(tmp_path)
    write(130, 970)  # 30 busy of 100 jiffies since
    assert sampler.sample() == {
        "utilization": 0.3,
        "memory_total_bytes": 1000 * 1024,
        "memory_used_bytes": 750 * 1024,
    }
    assert sampler.sample()["utilization"] == 0.0  # nothing elapsed


def test_a_hosts_figures_come_from_its_freshest_report() -> None:
    reports = [
        {"at": 2, "host": {"host": "a", "cpu": {"utilization": 0.2}}},
        {"at": 1, "host": {"host": "a", "cpu": {"utilization": 0.9}}},
        {"at": 1, "host": {"host": "b", "cpu": {"utilization": 0.5}, "gpus": [{"uuid": "G"}]}},
        {"at": 3, "host": {"host": "c"}},  # CPU metrics off there
        {"at": 1, "models": {}},  # a report from before host figures
    ]
    cpus, gpus = worker_reports.hosts(reports)
    assert cpus == {"a": {"utilization": 0.2}, "b": {"utilization": 0.5}}
    assert gpus == {"G": {"uuid": "G", "host": "b"}}


def test_quantiles_are_exact_nearest_ranks() -> None:
    values = [5, 1, 4, 2, 3]
    assert [statistics.quantile(values, q) for q in (0.0, 0.2, 0.5, 0.9, 1.0)] == [1, 1, 3, 5, 5]
    assert math.isnan(statistics.quantile([], 0.5))


def test_first_responses_fall_in_tritons_buckets() -> None:
    counts: dict[str, int] = {}
    for ms in (50, 100, 101, 3000, 9000):
        for name, n in statistics.first_response_counts(ms * 1_000_000).items():
            counts[name] = counts.get(name, 0) + n
    buckets, count, total_ms = statistics.first_responses(counts)
    assert buckets == [("100", 2), ("500", 3), ("2000", 3), ("5000", 4), ("+Inf", 5)]
    assert count == 5 and total_ms == 50 + 100 + 101 + 3000 + 9000


@pytest.mark.gpu
@pytest.mark.skipif(gpu_sampler() is None, reason="no NVIDIA GPU or NVML here (nvidia-ml-py)")
def test_gpus_are_sampled_through_nvml() -> None:
    sampler = gpu_sampler()
    assert sampler is not None
    for gpu in sampler.sample():
        assert gpu["uuid"].startswith("GPU-")
        assert 0 <= gpu["utilization"] <= 1
        assert 0 < gpu["memory_used_bytes"] <= gpu["memory_total_bytes"]
        assert gpu.get("power_limit", 1) > 0
