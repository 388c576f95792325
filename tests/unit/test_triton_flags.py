"""tritonserver's launch flags start conch unchanged: each is applied with Triton's meaning
or, where it tunes what conch does not have, taken and named once as ignored; a flag
neither knows stays an error that names it."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path
from typing import get_type_hints

import pytest

from conch.cli import _warn_ignored, main, parser
from conch.core.cache_config import CacheConfig
from conch.settings import (
    FLAGS,
    ModelControlMode,
    RateLimitMode,
    RateLimitResources,
    Role,
    Settings,
)

ENV_NAMES = [name for f in dataclasses.fields(Settings) for name in f.metadata.get("env", ())]

# Every flag of tritonserver's command line (src/command_line_parser.cc, with the SageMaker,
# Vertex AI, tracing, metrics, HTTP and gRPC groups a release build has), each with a value
# of Triton's form; None for a flag that takes none.
TRITON_FLAGS: list[tuple[str, str | None]] = [
    ("--id", "triton-0"),
    ("--exit-timeout-secs", "10"),
    ("--exit-on-error", "true"),
    ("--disable-auto-complete-config", None),
    ("--strict-readiness", "false"),
    ("--model-control-mode", "explicit"),
    ("--repository-poll-secs", "30"),
    ("--load-model", "simple"),
    ("--model-config-name", "h100"),
    ("--model-load-thread-count", "8"),
    ("--model-load-retry-count", "2"),
    ("--model-namespacing", "true"),
    ("--enable-peer-access", "false"),
    ("--allow-http", "true"),
    ("--http-address", "127.0.0.1"),
    ("--http-port", "8000"),
    ("--reuse-http-port", "true"),
    ("--http-header-forward-pattern", "x-.*"),
    ("--http-thread-count", "8"),
    ("--http-restricted-api", "model-repository:admin-key=secret"),
    ("--allow-grpc", "true"),
    ("--grpc-address", "127.0.0.1"),
    ("--grpc-port", "8001"),
    ("--reuse-grpc-port", "true"),
    ("--grpc-header-forward-pattern", "x-.*"),
    ("--grpc-infer-thread-count", "4"),
    ("--grpc-infer-allocation-pool-size", "8"),
    ("--grpc-max-response-pool-size", "8"),
    ("--grpc-use-ssl", "false"),
    ("--grpc-use-ssl-mutual", "false"),
    ("--grpc-server-cert", "/etc/tls/server.crt"),
    ("--grpc-server-key", "/etc/tls/server.key"),
    ("--grpc-root-cert", "/etc/tls/ca.crt"),
    ("--grpc-infer-response-compression-level", "high"),
    ("--grpc-keepalive-time", "7200000"),
    ("--grpc-keepalive-timeout", "20000"),
    ("--grpc-keepalive-permit-without-calls", "1"),
    ("--grpc-http2-max-pings-without-data", "2"),
    ("--grpc-http2-min-recv-ping-interval-without-data", "300000"),
    ("--grpc-http2-max-ping-strikes", "2"),
    ("--grpc-max-connection-age", "60000"),
    ("--grpc-max-connection-age-grace", "5000"),
    ("--grpc-restricted-protocol", "model-repository:admin-key=secret"),
    ("--log-verbose", "1"),
    ("--log-info", "true"),
    ("--log-warning", "true"),
    ("--log-error", "true"),
    ("--log-format", "ISO8601"),
    ("--log-file", "/tmp/triton.log"),
    ("--allow-sagemaker", "false"),
    ("--sagemaker-port", "8080"),
    ("--sagemaker-safe-port-range", "8000-9000"),
    ("--sagemaker-thread-count", "8"),
    ("--allow-vertex-ai", "false"),
    ("--vertex-ai-port", "8080"),
    ("--vertex-ai-thread-count", "8"),
    ("--vertex-ai-default-model", "simple"),
    ("--allow-metrics", "true"),
    ("--allow-client-shm", "true"),
    ("--allow-gpu-metrics", "false"),
    ("--allow-cpu-metrics", "true"),
    ("--metrics-address", "0.0.0.0"),
    ("--metrics-port", "8002"),
    ("--metrics-interval-ms", "2000"),
    ("--metrics-config", "summary_latencies=true"),
    ("--trace-config", "rate=100"),
    ("--cache-config", "local,size=1048576"),
    ("--cache-directory", "/opt/tritonserver/caches"),
    ("--rate-limit", "execution_count"),
    ("--rate-limit-resource", "R1:10"),
    ("--pinned-memory-pool-byte-size", "268435456"),
    ("--cuda-memory-pool-byte-size", "0:67108864"),
    ("--cuda-virtual-address-size", "0:1073741824"),
    ("--min-supported-compute-capability", "6.0"),
    ("--buffer-manager-thread-count", "0"),
    ("--host-policy", "gpu_0,numa-node=0"),
    ("--model-load-gpu-limit", "0:0.8"),
    ("--backend-directory", "/opt/tritonserver/backends"),
    ("--backend-config", "python,shm-default-byte-size=1048576"),
    ("--repoagent-directory", "/opt/tritonserver/repoagents"),
    # Deprecated by Triton, still taken by it.
    ("--strict-model-config", "false"),
    ("--response-cache-byte-size", "1048576"),
    ("--trace-file", "/tmp/trace.json"),
    ("--trace-level", "TIMESTAMPS"),
    ("--trace-rate", "1000"),
    ("--trace-count", "-1"),
    ("--trace-log-frequency", "0"),
]
# Triton's older name of --model-repository.
MODEL_STORE = pytest.param("--model-store", "/models")


@pytest.fixture(autouse=True)
def _no_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def _settings(role: Role | str, *argv: str) -> Settings:
    return Settings.from_args(parser().parse_args([str(role), *argv]))


@pytest.mark.parametrize(("flag", "value"), [*TRITON_FLAGS, MODEL_STORE])
def test_every_tritonserver_flag_starts_conch_serve(tmp_path: Path, flag: str, value: str | None):
    given = [flag] if value is None else [f"{flag}={value}"]
    _settings(Role.SERVE, "--model-repository", str(tmp_path), *given)
    if value is not None:  # and as two words, as getopt takes it too
        _settings(Role.SERVE, "--model-repository", str(tmp_path), flag, value)


def test_the_issues_launch_line_gives_tritons_settings(tmp_path: Path):
    s = _settings(
        Role.SERVE,
        f"--model-repository={tmp_path}",
        "--model-control-mode=poll",
        "--repository-poll-secs=30",
        "--strict-model-config=false",
        "--log-verbose=1",
    )
    assert s == dataclasses.replace(
        Settings(),
        model_repository=(tmp_path,),
        model_control_mode=ModelControlMode.POLL,
        repository_poll_secs=30.0,
        auto_complete=True,  # --strict-model-config=false: configs are completed
        log_verbose=1,
    )


def test_a_whole_triton_launch_line_starts_a_real_process(tmp_path: Path):
    """Through ``python -m conch``: parsed, the ignored flags named once each, then on to
    the role (here refused only for the missing repository folder, before any Redis)."""
    missing = tmp_path / "models"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "conch", "worker", f"--model-repository={missing}"),
            *("--strict-model-config=false", "--exit-on-error=true", "--log-verbose=true"),
            *("--model-load-thread-count", "4", "--pinned-memory-pool-byte-size=268435456"),
            *("--cuda-memory-pool-byte-size", "0:67108864", "--rate-limit=execution_count"),
            *("--rate-limit-resource=R1:4", "--rate-limit-resource=R2:2:0"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "unrecognized arguments" not in done.stderr and "error: argument" not in done.stderr
    for flag in ("--pinned-memory-pool-byte-size", "--cuda-memory-pool-byte-size"):
        assert done.stderr.count(f"{flag} ignored: ") == 1, (flag, done.stderr)
    # Applied (conch.worker.rate_limiter, conch.worker.host), so not named as ignored.
    for flag in (
        "--rate-limit",
        "--rate-limit-resource",
        "--exit-on-error",
        "--model-load-thread-count",
    ):
        assert f"{flag} ignored" not in done.stderr, (flag, done.stderr)


def _bool_flags():
    kinds = get_type_hints(Settings)
    return [f for f in FLAGS if kinds[f.field] in (bool, bool | None)]


def test_boolean_flags_are_found():
    names = {f.name for f in _bool_flags()}
    assert {"--strict-model-config", "--disable-auto-complete-config", "--jobs"} <= names
    assert {"--exit-on-error", "--log-info", "--allow-model-upload", "--reuse-grpc-port"} <= names


@pytest.mark.parametrize("flag", _bool_flags(), ids=lambda f: f.name)
def test_every_boolean_flag_takes_tritons_forms(tmp_path: Path, flag, capsys):
    role = sorted(flag.roles)[0]
    base = [role.value, "--model-repository", str(tmp_path)]
    for word, on in [("true", True), ("false", False), ("1", True), ("0", False)]:
        for spelled in (word, word.upper(), word.capitalize()):
            args = parser().parse_args([*base, f"{flag.name}={spelled}"])
            assert getattr(args, flag.dest) is on, (flag.name, spelled)
            Settings.from_args(args)  # and the field takes it
    for word, on in [("on", True), ("OFF", False)]:
        assert getattr(parser().parse_args([*base, flag.name, word]), flag.dest) is on
    assert getattr(parser().parse_args([*base, flag.name]), flag.dest) is True  # bare
    with pytest.raises(SystemExit):
        parser().parse_args([*base, f"{flag.name}=yes"])
    assert "invalid value for bool option: 'yes'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "auto_complete"),
    [
        (["--strict-model-config=false"], True),
        (["--strict-model-config=true"], False),
        (["--strict-model-config"], False),
        (["--strict-model-config", "0"], True),
        (["--disable-auto-complete-config"], False),
        (["--disable-auto-complete-config=false"], True),
        # Triton: --disable-auto-complete-config wins over --strict-model-config=false.
        (["--disable-auto-complete-config", "--strict-model-config=false"], False),
        (["--strict-model-config=false", "--disable-auto-complete-config"], False),
        ([], True),
    ],
)
def test_strict_model_config_is_the_inverse_of_auto_complete(
    tmp_path: Path, argv: list[str], auto_complete: bool
):
    s = _settings(Role.WORKER, "--model-repository", str(tmp_path), *argv)
    assert s.auto_complete is auto_complete
    child = s.to_args(Role.WORKER)  # written back in the one spelling
    assert "--strict-model-config" not in " ".join(child)
    assert ("--disable-auto-complete-config" in child) is (not auto_complete)
    assert Settings.from_args(parser().parse_args(["worker", *child])) == s


def test_log_verbose_takes_tritons_true_and_false(tmp_path: Path):
    for word, level in [("true", 1), ("FALSE", 0), ("2", 2)]:
        s = _settings(Role.WORKER, "--model-repository", str(tmp_path), f"--log-verbose={word}")
        assert s.log_verbose == level


def test_an_unknown_flag_is_an_error_that_names_it(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model-repository", str(tmp_path), "--no-such-flag=1"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --no-such-flag=1" in capsys.readouterr().err
    # A Triton flag of another group is no flag of a role that does not take it.
    with pytest.raises(SystemExit):
        parser().parse_args(["gateway", "--model-repository", str(tmp_path), "--jobs"])
    assert "unrecognized arguments: --jobs" in capsys.readouterr().err


IGNORED = [
    "--id=triton-0",
    "--model-namespacing",
    "--pinned-memory-pool-byte-size=268435456",
    "--cuda-memory-pool-byte-size=0:67108864",
    "--cuda-memory-pool-byte-size=1:67108864",
    "--host-policy=gpu_0,numa-node=0",
    "--backend-directory=/opt/tritonserver/backends",
    "--trace-level=TIMESTAMPS",
    "--trace-level=TENSORS",
]


def test_the_rate_limiter_flags_are_applied_and_reach_the_workers(tmp_path: Path, caplog):
    s = _settings(
        Role.SERVE,
        *("--model-repository", str(tmp_path), "--rate-limit=EXECUTION_COUNT"),
        "--rate-limit-resource=R1:4",
    )
    with caplog.at_level(logging.WARNING, logger="conch.cli"):
        _warn_ignored(s)
    assert not caplog.records
    worker = _settings(Role.WORKER, *s.to_args(Role.WORKER))
    assert worker.rate_limit is RateLimitMode.EXECUTION_COUNT
    assert worker.rate_limit_resources.counts == {("R1", None): 4}


def test_exit_on_error_and_load_threads_are_applied_and_reach_the_workers(tmp_path: Path):
    """Triton's --exit-on-error and --model-load-thread-count are the workers' (conch's
    default for the first is false, Triton's true: ``Settings.exit_on_error``)."""
    assert (Settings().exit_on_error, Settings().model_load_thread_count) == (False, 4)
    s = _settings(
        Role.SERVE,
        *("--model-repository", str(tmp_path), "--exit-on-error", "true"),
        "--model-load-thread-count=2",
    )
    for role in (Role.WORKER, Role.AUTOSCALE):
        child = _settings(role, *s.to_args(role))
        assert (child.exit_on_error, child.model_load_thread_count) == (True, 2)
    with pytest.raises(ValueError, match="--model-load-thread-count 0: must be at least 1"):
        _settings(Role.WORKER, "--model-repository", str(tmp_path), "--model-load-thread-count=0")


@pytest.mark.parametrize("argv", [["autoscale"], ["serve", "--workers", "1:2"]])
def test_exit_on_error_is_refused_where_workers_are_autoscaled(tmp_path: Path, argv: list[str]):
    """An autoscaler replaces a worker that exits: the new one would fail the same load."""
    line = [*argv, "--model-repository", str(tmp_path), "--exit-on-error=true"]
    if argv == ["autoscale"]:
        line += ["--workers", "1:2"]
    with pytest.raises(SystemExit, match="--exit-on-error=true is refused with --workers"):
        main(line)


def test_model_store_is_tritons_older_model_repository(tmp_path: Path, capsys):
    assert _settings(Role.WORKER, f"--model-store={tmp_path}").model_repository == (tmp_path,)
    with pytest.raises(ValueError, match="--model-repository is required"):
        _settings(Role.WORKER)


def test_ignored_flags_are_named_once_and_never_reach_children(tmp_path: Path, caplog):
    s = _settings(Role.SERVE, "--model-repository", str(tmp_path), *IGNORED)
    with caplog.at_level(logging.WARNING, logger="conch.cli"):
        _warn_ignored(s)
    warned = [r.getMessage() for r in caplog.records]
    names = {arg.partition("=")[0] for arg in IGNORED}
    for name in names:
        assert sum(w.startswith(f"{name} ignored: ") for w in warned) == 1, (name, warned)
    assert len(warned) == len(names)
    for role in Role:  # conch serve's children take them from no command line
        assert not names & {a.partition("=")[0] for a in s.to_args(role)}, role


def test_values_that_ask_for_what_conch_does_are_not_warned_about(tmp_path: Path, caplog):
    s = _settings(
        Role.SERVE,
        *("--model-repository", str(tmp_path), "--exit-on-error=false", "--rate-limit=off"),
        *("--allow-sagemaker=0", "--reuse-http-port=false", "--model-namespacing=off"),
    )
    with caplog.at_level(logging.WARNING, logger="conch.cli"):
        _warn_ignored(s)
    assert not caplog.records
    assert s == Settings(model_repository=tmp_path)


def test_rate_limit_takes_tritons_modes(tmp_path: Path, capsys):
    for word, mode in [
        ("off", RateLimitMode.OFF),
        ("Execution_Count", RateLimitMode.EXECUTION_COUNT),
    ]:
        s = _settings(Role.WORKER, "--model-repository", str(tmp_path), "--rate-limit", word)
        assert s.rate_limit is mode
    with pytest.raises(SystemExit):
        parser().parse_args(["worker", "--model-repository", str(tmp_path), "--rate-limit=on"])
    assert "invalid choice: 'on'" in capsys.readouterr().err


def test_rate_limit_resources_take_tritons_forms(tmp_path: Path):
    s = _settings(
        Role.SERVE,
        *("--model-repository", str(tmp_path)),
        *("--rate-limit-resource", "R1:10", "--rate-limit-resource=R2:2:0"),
        *("--rate-limit-resource", "R2:3:1", "--rate-limit-resource=gpu_mem:0"),
    )
    assert s.rate_limit_resources.counts == {
        ("R1", None): 10,
        ("R2", 0): 2,
        ("R2", 1): 3,
        ("gpu_mem", None): 0,
    }
    assert RateLimitResources.parse(s.rate_limit_resources.items()) == s.rate_limit_resources


def test_a_resource_given_twice_keeps_the_smaller_count_as_triton_does():
    """Triton's server options keep the smaller of two counts for one resource on one
    device; ``R:N`` and ``R:N:-1`` are two spellings of the same thing (every device)."""
    parsed = RateLimitResources.parse(["R:4", "R:2:-1", "R:3", "R:5:0", "R:1:0", "r:9"])
    # names are kept as written: Triton's core tells R from r
    assert parsed.counts == {("R", None): 2, ("R", 0): 1, ("r", None): 9}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("R1", "option format is <name>:<count> or <name>:<count>:<device>; got 'R1'"),
        (":4", "option format is"),
        ("R1:4:0:1", "option format is"),
        ("R1:four", "count and device are whole numbers"),
        ("R1:4:gpu0", "count and device are whole numbers"),
        ("R1:-1", "count is 0 or more"),
        ("R1:4:-2", "device 0 or more"),
    ],
)
def test_a_malformed_resource_stops_the_start(tmp_path: Path, value: str, why: str):
    with pytest.raises(ValueError, match=why):
        RateLimitResources.parse([value])
    with pytest.raises(SystemExit) as exit_:
        main(["worker", "--model-repository", str(tmp_path), f"--rate-limit-resource={value}"])
    assert str(exit_.value.code).startswith("conch: --rate-limit-resource option format is")


def test_response_cache_byte_size_is_a_local_cache(tmp_path: Path):
    base = ("--model-repository", str(tmp_path))
    s = _settings(Role.SERVE, *base, "--response-cache-byte-size=1048576")
    assert s.cache_config == CacheConfig.parse(["local,size=1048576"])
    # It reaches the frontends as --cache-config does: in their environment.
    assert s.child_env(Role.GATEWAY) == {"CONCH_CACHE_CONFIG": "local,size=1048576"}
    assert "--response-cache-byte-size" not in s.to_args(Role.GATEWAY)
    assert _settings(Role.GRPC, *base, "--response-cache-byte-size=0").cache_config is None
    with pytest.raises(ValueError, match="must be 0 or more"):
        _settings(Role.SERVE, *base, "--response-cache-byte-size=-1")


def test_response_cache_byte_size_and_cache_config_are_refused_together(tmp_path: Path):
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                *("serve", "--model-repository", str(tmp_path)),
                *("--response-cache-byte-size=1024", "--cache-config=local,size=2048"),
            ]
        )
    assert str(exit_.value.code) == (
        "conch: --response-cache-byte-size and --cache-config are both given: give one or "
        "the other (--response-cache-byte-size N is --cache-config local,size=N)"
    )
