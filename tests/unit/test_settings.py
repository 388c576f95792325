"""conch.settings: the one reader of flags and environment, and the flags it writes back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conch.cli import main, parser
from conch.core.restricted_apis import ApiGroup, RestrictedApis
from conch.settings import (
    FLAGS,
    GEVENT_WORKER,
    LOCAL_REDIS_URL,
    BackendConfig,
    CompressionLevel,
    LogFormat,
    ModelControlMode,
    Role,
    Settings,
    WorkerRange,
)

# Every variable Settings reads, so a test's environment is exactly what it says.
ENV_NAMES = [name for f in dataclasses.fields(Settings) for name in f.metadata.get("env", ())]


@pytest.fixture(autouse=True)
def _no_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def _protocols(values: list[str]) -> RestrictedApis:
    return RestrictedApis.parse(
        values,
        option="grpc-restricted-protocol",
        feature="protocol",
        header_prefix="triton-grpc-protocol-",
    )


def parse(role: Role, *argv: str):
    return parser().parse_args([role.value, *argv])


def test_from_env_without_variables_is_the_defaults():
    s = Settings.from_env({})
    assert s == Settings()
    assert (s.redis_url, s.request_timeout_s, s.max_input_bytes) == ("", 60.0, 64 << 20)
    assert (s.http_worker_class, s.local_redis_url, s.s3_region) == (
        GEVENT_WORKER,
        LOCAL_REDIS_URL,
        None,
    )
    assert Settings.from_env() == Settings()  # the process environment, cleared above


def test_from_env_reads_every_variable():
    s = Settings.from_env(
        {
            "REDIS_URL": "redis://r:1/2",
            "CONCH_REQUEST_TIMEOUT_S": "2.5",
            "CONCH_MAX_INPUT_BYTES": "4096",
            "CONCH_VISIBILITY_TIMEOUT_S": "3",
            "CONCH_MAX_ATTEMPTS": "5",
            "CONCH_JOB_TTL_S": "60",
            "CONCH_MAX_QUEUED_JOBS": "7",
            "CONCH_HTTP_WORKER_CLASS": "gthread",
            "CONCH_LOCAL_REDIS_URL": "redis://127.0.0.1:1/0",
            "AWS_REGION": "eu-west-3",
        }
    )
    assert s == dataclasses.replace(
        Settings(),
        redis_url="redis://r:1/2",
        request_timeout_s=2.5,
        max_input_bytes=4096,
        visibility_timeout_s=3.0,
        max_attempts=5,
        job_ttl_s=60,
        max_queued_jobs=7,
        http_worker_class="gthread",
        local_redis_url="redis://127.0.0.1:1/0",
        s3_region="eu-west-3",
    )
    assert not s.http_worker_uses_gevent and Settings().http_worker_uses_gevent


def test_from_env_region_order_and_empty_variables():
    both = {"AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "eu-west-3"}
    assert Settings.from_env(both).s3_region == "us-east-1"
    assert Settings.from_env({**both, "AWS_DEFAULT_REGION": ""}).s3_region == "eu-west-3"
    assert Settings.from_env({"CONCH_MAX_ATTEMPTS": ""}).max_attempts == 3


def test_from_env_names_the_bad_variable():
    with pytest.raises(ValueError, match="CONCH_MAX_ATTEMPTS"):
        Settings.from_env({"CONCH_MAX_ATTEMPTS": "many"})


def test_from_args_flags_win_over_the_environment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://env:1/0")
    monkeypatch.setenv("CONCH_REQUEST_TIMEOUT_S", "9")
    monkeypatch.setenv("CONCH_MAX_INPUT_BYTES", "1000")
    s = Settings.from_args(parse(Role.SERVE, "--model-repository", str(tmp_path)))
    assert (s.redis_url, s.request_timeout_s, s.max_input_bytes) == ("redis://env:1/0", 9.0, 1000)
    s = Settings.from_args(
        parse(
            Role.SERVE,
            *("--model-repository", str(tmp_path), "--redis-url", "redis://flag:2/0"),
            *("--request-timeout-secs", "1.5", "--http-max-input-size", "2000"),
        )
    )
    assert (s.redis_url, s.request_timeout_s, s.max_input_bytes) == ("redis://flag:2/0", 1.5, 2000)
    # An empty --redis-url is no URL: $REDIS_URL stays, as before.
    s = Settings.from_args(
        parse(Role.WORKER, "--model-repository", str(tmp_path), "--redis-url", "")
    )
    assert s.redis_url == "redis://env:1/0"


def test_from_args_reads_each_flag(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repo").mkdir()
    s = Settings.from_args(
        parse(
            Role.SERVE,
            *("--model-repository", "repo", "--log-verbose", "1"),
            "--disable-auto-complete-config",
            *("--backend-config", "onnxruntime,default-max-batch-size=8"),
            *("--model-control-mode", "explicit", "--repository-poll-secs", "0.5"),
            *("--load-model", "a", "--load-model", "b"),
            *("--metrics-port", "9002", "--allow-metrics=false"),
            *("--http-port", "9000", "--http-address", "127.0.0.1"),
            *("--http-thread-count", "8", "--http-workers", "3"),
            *("--models", "a,,b"),
            *("--log-file", "conch.log", "--log-format", "ISO8601"),
            *("--log-info=false", "--log-warning", "off", "--log-error=1"),
            *("--exit-timeout-secs", "7", "--strict-readiness=false"),
        )
    )
    assert s.model_repository == (tmp_path / "repo",) and s.model_repository[0].is_absolute()
    assert s.model_control_mode is ModelControlMode.EXPLICIT
    assert (s.log_verbose, s.auto_complete) == (1, False)
    assert s.backend_config.max_batch_sizes == {"onnxruntime": 8}
    assert (s.log_file, s.log_format) == ("conch.log", LogFormat.ISO8601)
    assert (s.log_info, s.log_warning, s.log_error) == (False, False, True)
    assert (s.exit_timeout_secs, s.strict_readiness) == (7, False)
    assert (s.repository_poll_secs, s.load_models, s.models) == (0.5, ["a", "b"], ["a", "b"])
    assert (s.metrics_port, s.allow_metrics) == (9002, False)
    assert (s.http_port, s.http_address, s.http_thread_count, s.http_workers) == (
        9000,
        "127.0.0.1",
        8,
        3,
    )
    strict = Settings.from_args(
        parse(Role.WORKER, "--model-repository", "repo", "--strict-model-config")
    )
    assert strict.auto_complete is False


def test_backend_config_takes_tritons_forms(tmp_path: Path):
    """Global and per-backend default-max-batch-size (a backend's own wins, as in
    Triton's merge); every other setting is kept aside to be logged, never refused."""
    s = Settings.from_args(
        parse(
            Role.WORKER,
            *("--model-repository", str(tmp_path)),
            "--backend-config=default-max-batch-size=16",
            "--backend-config=onnxruntime,default-max-batch-size=2",
            "--backend-config=python,shm-default-byte-size=1048576",
            "--backend-config=tensorflow,version=2",
            "--backend-config=onnxruntime,default-max-batch-size=3",  # the last one counts
        )
    )
    assert s.backend_config.max_batch_sizes == {"": 16, "onnxruntime": 3}
    assert s.backend_config.ignored == (
        "python,shm-default-byte-size=1048576",
        "tensorflow,version=2",
    )
    # Written back without what is ignored: the children of conch serve warn no more.
    assert s.to_args(Role.WORKER).count("--backend-config") == 2
    assert Settings.from_args(parse(Role.WORKER, *s.to_args(Role.WORKER))) == s
    # Nothing given: the repository keeps its own default (Triton's 4).
    assert BackendConfig.parse([]).max_batch_sizes == {}


@pytest.mark.parametrize(
    ("item", "why"),
    [
        (",default-max-batch-size=2", "no backend before ','"),
        ("onnxruntime,default-max-batch-size", "the form is"),
        ("onnxruntime,=2", "the form is"),
        ("default-max-batch-size=", "the form is"),
        ("default-max-batch-size=many", "not an integer"),
        ("onnxruntime,default-max-batch-size=-1", "0 or more"),
    ],
)
def test_malformed_backend_config_is_refused(tmp_path: Path, item: str, why: str):
    args = parse(Role.WORKER, "--model-repository", str(tmp_path), "--backend-config", item)
    with pytest.raises(ValueError, match=why):
        Settings.from_args(args)
    with pytest.raises(SystemExit, match="conch: --backend-config"):
        main(["worker", "--model-repository", str(tmp_path), "--backend-config", item])


def test_ignored_backend_config_is_logged_and_the_launch_goes_on(
    tmp_path: Path, capsys, monkeypatch
):
    import logging

    from conch import cli

    started: list[Settings] = []
    monkeypatch.setattr(cli, "worker", lambda settings: started.append(settings) or 0)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # main() sets the log up
    monkeypatch.setattr(root, "level", root.level)
    code = main(
        [
            "worker",
            *("--model-repository", str(tmp_path)),
            "--backend-config=onnxruntime,enable-mem-arena=1",
            "--backend-config=dali,default-max-batch-size=8",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0 and len(started) == 1
    assert "--backend-config onnxruntime,enable-mem-arena=1 ignored" in err
    assert "conch has no backend 'dali'" in err


@pytest.mark.parametrize("flag", ["--strict-readiness", "--log-info", "--allow-metrics"])
def test_boolean_flags_read_as_triton_reads_them(tmp_path: Path, flag: str, capsys):
    for word, value in [
        ("true", True),
        ("ON", True),
        ("1", True),
        ("False", False),
        ("off", False),
        ("0", False),
    ]:
        args = parse(Role.GATEWAY, "--model-repository", str(tmp_path), f"{flag}={word}")
        assert getattr(args, flag.removeprefix("--").replace("-", "_")) is value
    with pytest.raises(SystemExit):
        parse(Role.GATEWAY, "--model-repository", str(tmp_path), f"{flag}=yes please")
    assert "invalid value for bool option" in capsys.readouterr().err


def test_log_format_and_exit_timeout_are_checked(tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        parse(Role.WORKER, "--model-repository", str(tmp_path), "--log-format", "iso8601")
    assert "invalid choice: 'iso8601'" in capsys.readouterr().err
    args = parse(Role.WORKER, "--model-repository", str(tmp_path), "--exit-timeout-secs", "-1")
    with pytest.raises(ValueError, match="--exit-timeout-secs -1"):
        Settings.from_args(args)
    assert Settings().exit_timeout_secs == 30 and Settings().strict_readiness  # Triton's


def test_control_mode_choices_come_from_the_enum(tmp_path: Path, capsys):
    [flag] = [f for f in FLAGS if f.name == "--model-control-mode"]
    assert flag.choices == tuple(m.value for m in ModelControlMode)
    with pytest.raises(SystemExit):
        parse(Role.GATEWAY, "--model-repository", str(tmp_path), "--model-control-mode", "x")
    assert "invalid choice: 'x'" in capsys.readouterr().err


def _changed(role: Role, repo: Path) -> Settings:
    """Settings with every field that ``role`` has a flag for away from its default."""
    s = dataclasses.replace(
        Settings(),
        model_repository=repo,
        redis_url="redis://h:1/3",
        request_timeout_s=0.1 + 0.2,  # a float that str() must keep exactly
        auto_complete=False,
        backend_config=BackendConfig({"": 16, "pytorch": 0}),
        model_control_mode=ModelControlMode.POLL,
        repository_poll_secs=2.5,
        load_models=["*", "m"],
        log_verbose=2,
        log_file="/tmp/conch.log",
        log_format=LogFormat.ISO8601,
        log_info=False,
        log_warning=False,
        log_error=False,
        exit_timeout_secs=3,
    )
    if role in (Role.SERVE, Role.GATEWAY, Role.GRPC):
        s = dataclasses.replace(
            s, max_input_bytes=12345, allow_model_upload=True, strict_readiness=False
        )
    if role in (Role.SERVE, Role.GRPC):
        s = dataclasses.replace(
            s,
            grpc_address="127.0.0.3",
            grpc_port=9101,
            grpc_infer_thread_count=7,
            grpc_restricted_protocol=_protocols(["inference,health:infer-key=a:b=c"]),
            grpc_use_ssl=True,
            grpc_use_ssl_mutual=True,
            grpc_server_cert="/etc/tls/server.crt",
            grpc_server_key="/etc/tls/server.key",
            grpc_root_cert="/etc/tls/ca.crt",
            grpc_infer_response_compression_level=CompressionLevel.MEDIUM,
            grpc_keepalive_time_ms=1000,
            grpc_keepalive_timeout_ms=2000,
            grpc_keepalive_permit_without_calls=True,
            grpc_http2_max_pings_without_data=0,
            grpc_http2_min_recv_ping_interval_without_data_ms=3000,
            grpc_http2_max_ping_strikes=5,
        )
    if role is Role.SERVE:
        s = dataclasses.replace(s, allow_http=False, allow_grpc=False)
    if role in (Role.SERVE, Role.GATEWAY):
        s = dataclasses.replace(
            s,
            allow_metrics=False,
            metrics_port=9102,
            http_address="127.0.0.2",
            http_port=9100,
            http_thread_count=3,
            http_workers=5,
            http_restricted_api=RestrictedApis.parse(
                ["model-repository,batch:admin-key=a:b=c", "inference:Infer-Key=v"]
            ),
        )
    if role in (Role.SERVE, Role.WORKER, Role.AUTOSCALE):
        # Triton allows "," in names
        s = dataclasses.replace(s, models=["a", "b,c"], batch_jobs=False)
    if role in (Role.SERVE, Role.AUTOSCALE):
        s = dataclasses.replace(
            s,
            workers=WorkerRange(0, 7),
            target_work_per_worker=2.5,
            activation_work=3,
            scale_down_cooldown_secs=9.5,
            scale_poll_secs=0.25,
        )
    if role in (Role.SERVE, Role.GATEWAY, Role.GRPC):
        s = dataclasses.replace(s, scale_to_zero=["a", "b,c"])
    return s


@pytest.mark.parametrize("role", list(Role))
def test_to_args_round_trips(role: Role, tmp_path: Path):
    for s in (Settings(model_repository=tmp_path), _changed(role, tmp_path)):
        args = parser().parse_args([role.value, *s.to_args(role)])
        assert Settings.from_args(args, environ=s.child_env(role)) == s


def test_secrets_reach_children_through_the_environment_not_argv(tmp_path: Path):
    s = _changed(Role.SERVE, tmp_path)
    args, env = s.to_args(Role.GATEWAY), s.child_env(Role.GATEWAY)
    assert "--http-restricted-api" not in args and not any("a:b=c" in a for a in args)
    assert env == {
        "CONCH_HTTP_RESTRICTED_API": "inference:Infer-Key=v\nmodel-repository,batch:admin-key=a:b=c"
    }
    assert Settings.from_env(env).http_restricted_api == s.http_restricted_api
    assert s.child_env(Role.WORKER) == {}
    assert Settings(model_repository=tmp_path).child_env(Role.GATEWAY) == {}


def test_models_list_takes_names_that_hold_commas(tmp_path: Path):
    s = Settings.from_args(
        parse(Role.WORKER, "--model-repository", str(tmp_path), "--models", "a\\,b,c,,d\\,")
    )
    assert s.models == ["a,b", "c", "d,"]
    args = s.to_args(Role.WORKER)
    at = args.index("--models")
    assert args[at : at + 2] == ["--models", "a\\,b,c,d\\,"]


def test_to_args_writes_only_the_role_flags(tmp_path: Path):
    s = _changed(Role.SERVE, tmp_path)
    worker, gateway = s.to_args(Role.WORKER), s.to_args(Role.GATEWAY)
    assert "--models" in worker and "--http-port" not in worker
    assert "--http-port" in gateway and "--models" not in gateway
    assert "--allow-metrics=false" in gateway
    assert "--strict-model-config" not in s.to_args(Role.SERVE)


@pytest.mark.parametrize(("cpus", "workers"), [(None, 1), (1, 1), (2, 1), (3, 1), (4, 2), (64, 2)])
def test_gateway_processes_default_to_half_the_cores_one_to_two(
    cpus: int | None, workers: int
) -> None:
    from conch.settings import default_http_workers

    assert default_http_workers(cpus) == workers


def test_restricted_apis_and_uploads_are_gateway_flags(tmp_path: Path):
    s = Settings.from_args(
        parse(
            Role.GATEWAY,
            *("--model-repository", str(tmp_path)),
            "--http-restricted-api=model-repository:admin-key=one",
            *("--http-restricted-api", "inference,metadata:infer-key=two"),
            "--allow-model-upload",
        )
    )
    assert s.http_restricted_api == RestrictedApis.parse(
        ["model-repository:admin-key=one", "inference,metadata:infer-key=two"]
    )
    assert s.allow_model_upload is True
    # Off by default, and Triton's spelling of a bool flag works too.
    assert not Settings().allow_model_upload and not Settings().http_restricted_api
    for value, on in (("true", True), ("false", False)):
        args = parse(
            Role.SERVE, "--model-repository", str(tmp_path), f"--allow-model-upload={value}"
        )
        assert Settings.from_args(args).allow_model_upload is on
    # The worker takes neither: nothing of either reaches it.
    s = dataclasses.replace(s, model_repository=tmp_path)
    assert "--http-restricted-api" not in s.to_args(Role.WORKER)
    with pytest.raises(SystemExit):
        parse(Role.WORKER, "--model-repository", str(tmp_path), "--allow-model-upload")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("model-reposit:k=s3cret", "conch: unknown restricted api 'model-reposit'"),
        ("health=s3cret", "conch: --http-restricted-api option format is"),
        ("health:k:s3cret", "conch: --http-restricted-api option format is"),
    ],
)
def test_a_bad_restriction_stops_the_command_with_tritons_message(
    tmp_path: Path, capsys, value: str, message: str
):
    with pytest.raises(SystemExit) as exit_:
        main(["gateway", "--model-repository", str(tmp_path), "--http-restricted-api", value])
    assert str(exit_.value.code).startswith(message)
    assert "s3cret" not in str(exit_.value.code) + "".join(capsys.readouterr())


def test_a_group_named_twice_over_two_flags_stops_the_command(tmp_path: Path):
    with pytest.raises(SystemExit, match="'health' can not be specified in multiple config groups"):
        main(
            [
                *("serve", "--model-repository", str(tmp_path)),
                *("--http-restricted-api", "model-repository,health:k1=v1"),
                *("--http-restricted-api", "metadata,health:k2=v2"),
            ]
        )


def test_settings_never_show_a_secret(tmp_path: Path):
    s = Settings.from_args(
        parse(
            Role.SERVE, "--model-repository", str(tmp_path), "--http-restricted-api=jobs:k=s3cret"
        )
    )
    assert "s3cret" not in repr(s) and "s3cret" not in str(s)


def test_grpc_restricted_protocol_takes_tritons_form_and_metadata_keys(tmp_path: Path):
    s = Settings.from_args(
        parse(
            Role.GRPC,
            *("--model-repository", str(tmp_path)),
            "--grpc-restricted-protocol=inference,model-repository:admin-key=s3cret",
        )
    )
    rule = s.grpc_restricted_protocol.get(ApiGroup.INFERENCE)
    assert rule is not None and rule.header == "triton-grpc-protocol-admin-key"
    assert rule.allows("s3cret") and not rule.allows("other")
    # A secret: it reaches the gRPC child in its environment, never on its command line.
    assert not any("s3cret" in a for a in s.to_args(Role.GRPC))
    env = s.child_env(Role.GRPC)
    assert env == {"CONCH_GRPC_RESTRICTED_PROTOCOL": "inference,model-repository:admin-key=s3cret"}
    assert Settings.from_env(env).grpc_restricted_protocol == s.grpc_restricted_protocol
    assert s.child_env(Role.GATEWAY) == {} and s.child_env(Role.WORKER) == {}


def test_a_bad_restricted_protocol_stops_the_command_with_tritons_message(tmp_path: Path):
    with pytest.raises(SystemExit) as exit_:
        main(["grpc", "--model-repository", str(tmp_path), "--grpc-restricted-protocol", "x:k=v"])
    assert str(exit_.value.code) == "conch: unknown restricted protocol 'x'"
    with pytest.raises(SystemExit) as exit_:
        main(["grpc", "--model-repository", str(tmp_path), "--grpc-restricted-protocol", "health"])
    assert str(exit_.value.code).startswith(
        "conch: --grpc-restricted-protocol option format is "
        "'<protocol>[,<protocol>...]:<key>=<value>'"
    )


def test_grpc_defaults_and_which_role_takes_which_flag(tmp_path: Path):
    s = Settings(model_repository=tmp_path)
    assert (s.grpc_address, s.grpc_port, s.allow_grpc, s.allow_http) == (
        "0.0.0.0",
        8001,
        True,
        True,
    )
    changed = _changed(Role.SERVE, tmp_path)
    grpc_args, gateway_args = changed.to_args(Role.GRPC), changed.to_args(Role.GATEWAY)
    assert "--grpc-port" in grpc_args and "--http-port" not in grpc_args
    assert "--grpc-port" not in gateway_args
    assert "--http-max-input-size" in grpc_args and "--allow-model-upload" in grpc_args
    assert "--allow-grpc=false" in changed.to_args(Role.SERVE)
    assert not any(a.startswith("--allow-grpc") for a in grpc_args + gateway_args)


def test_grpc_transport_flags_take_tritons_names_and_defaults(tmp_path: Path, capsys):
    s = Settings()
    assert (s.grpc_use_ssl, s.grpc_use_ssl_mutual, s.grpc_infer_response_compression_level) == (
        False,
        False,
        CompressionLevel.NONE,
    )
    assert (s.grpc_keepalive_time_ms, s.grpc_keepalive_timeout_ms) == (7_200_000, 20_000)
    assert s.grpc_keepalive_permit_without_calls is False
    assert s.grpc_http2_max_pings_without_data == 2
    assert s.grpc_http2_min_recv_ping_interval_without_data_ms == 300_000
    assert s.grpc_http2_max_ping_strikes == 2
    given = Settings.from_args(
        parse(
            Role.GRPC,
            "--model-repository",
            str(tmp_path),
            "--grpc-use-ssl=1",
            "--grpc-server-cert",
            "c.pem",
            "--grpc-infer-response-compression-level",
            "HIGH",  # Triton lower-cases the level
            "--grpc-keepalive-time",
            "10000",
            "--grpc-keepalive-permit-without-calls",
            "true",
        )
    )
    assert given.grpc_use_ssl and given.grpc_server_cert == "c.pem"
    assert given.grpc_infer_response_compression_level is CompressionLevel.HIGH
    assert given.grpc_keepalive_time_ms == 10000 and given.grpc_keepalive_permit_without_calls
    assert "--grpc-use-ssl" not in " ".join(s.to_args(Role.GATEWAY))
    with pytest.raises(SystemExit):
        parse(
            Role.GRPC,
            "--model-repository",
            str(tmp_path),
            "--grpc-infer-response-compression-level",
            "max",
        )
    assert "invalid choice: 'max'" in capsys.readouterr().err


def test_autoscale_flags_and_what_its_workers_are_started_with(tmp_path: Path):
    s = Settings.from_args(
        parse(
            Role.AUTOSCALE,
            *("--model-repository", str(tmp_path), "--models", "a,b"),
            *("--workers", "0:3", "--target-work-per-worker", "4", "--exit-timeout-secs", "9"),
            "--batch-jobs=false",
        )
    )
    assert s.workers == WorkerRange(0, 3) and s.target_work_per_worker == 4
    worker = s.to_args(Role.WORKER)  # the autoscaler's workers get every worker flag...
    assert worker[worker.index("--models") :][:2] == ["--models", "a,b"]
    assert "--exit-timeout-secs" in worker and "--batch-jobs=false" in worker
    assert not {"--workers", "--target-work-per-worker"} & set(worker)  # ...and none of its own
    # A worker takes no scaling flag; the defaults run one worker and scale nothing to zero.
    with pytest.raises(SystemExit):
        parse(Role.WORKER, "--model-repository", str(tmp_path), "--workers", "1:2")
    assert Settings().workers is None and not Settings().scales_to_zero("m")


def test_a_group_that_counts_the_jobs_must_run_them(tmp_path: Path):
    """``--batch-jobs`` (true by default) says whether a worker runs batch jobs; an
    autoscaler told to count the jobs for workers that never run them is refused."""
    base = ("--model-repository", str(tmp_path), "--workers", "0:2")
    assert Settings().batch_jobs is True
    assert Settings.from_args(parse(Role.AUTOSCALE, *base, "--jobs")).scale_on_jobs
    off = Settings.from_args(parse(Role.WORKER, base[0], base[1], "--batch-jobs=false"))
    assert off.batch_jobs is False
    with pytest.raises(SystemExit, match="conch: --jobs counts batch jobs that --batch-jobs=false"):
        main(["autoscale", *base, "--jobs", "--batch-jobs=false"])


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--workers", "3:1"),
        ("--target-work-per-worker", "0"),
        ("--activation-work", "-1"),
        ("--scale-down-cooldown-secs", "-5"),
        ("--scale-poll-secs", "0"),
    ],
)
def test_scaling_flags_refuse_values_that_cannot_work(flag: str, value: str, tmp_path: Path):
    args = parse(Role.AUTOSCALE, "--model-repository", str(tmp_path), flag, value)
    with pytest.raises(ValueError, match=flag):
        Settings.from_args(args)


def test_scale_to_zero_names_models_or_all_of_them(tmp_path: Path):
    def scale_to_zero(*flag: str) -> Settings:
        return Settings.from_args(parse(Role.GATEWAY, "--model-repository", str(tmp_path), *flag))

    named = scale_to_zero("--scale-to-zero", "a,b\\,c")
    assert named.scale_to_zero == ["a", "b,c"]
    assert named.scales_to_zero("b,c") and not named.scales_to_zero("d")
    every = scale_to_zero("--scale-to-zero")
    assert every.scale_to_zero == ["*"] and every.scales_to_zero("anything")
    assert every.to_args(Role.GATEWAY)[-2:] == ["--scale-to-zero", "*"]
    assert not scale_to_zero().scale_to_zero
