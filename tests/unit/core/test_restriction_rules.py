"""Restricted APIs: the flag's parser (Triton's syntax and errors), the secret's
comparison, and the group of every HTTP route."""

from __future__ import annotations

import pytest
from flask import Flask

from conch.core.errors import Forbidden
from conch.core.restricted_apis import ApiGroup, RestrictedApis, Restriction
from conch.frontend.http import api_groups, docs_routes, job_routes, routes

TRITON_GROUPS = [
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
]


def test_the_groups_are_tritons_then_conchs():
    assert [g.value for g in ApiGroup] == [*TRITON_GROUPS, "jobs", "batch"]


def test_each_value_is_groups_header_and_secret():
    rules = RestrictedApis.parse(
        ["model-repository,health:admin-key=admin-value", "inference,metadata:infer-key=v"]
    )
    admin, infer = Restriction("admin-key", "admin-value"), Restriction("infer-key", "v")
    assert dict(rules.rules) == {
        ApiGroup.MODEL_REPOSITORY: admin,
        ApiGroup.HEALTH: admin,
        ApiGroup.INFERENCE: infer,
        ApiGroup.METADATA: infer,
    }
    assert rules.get(ApiGroup.STATISTICS) is None
    assert rules and not RestrictedApis() and not RestrictedApis.parse([])


def test_the_secret_may_hold_colons_and_equals_signs():
    # The first ':' ends the groups, the first '=' after it the header (Triton's split).
    [rule] = set(RestrictedApis.parse(["jobs,batch:k=a:b=c="]).rules.values())
    assert rule == Restriction("k", "a:b=c=")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # Triton's own messages, from its QA of the flag.
        (["model-reposit,health:k1=v1"], "unknown restricted api 'model-reposit'"),
        (
            ["model-repository,health:k1=v1", "metadata,health:k2=v2"],
            "restricted api 'health' can not be specified in multiple config groups",
        ),
        (["health,health:k=v"], "restricted api 'health' can not be specified"),
        (["health,,metadata:k=v"], "unknown restricted api ''"),
        (["Health:k=v"], "unknown restricted api 'Health'"),
        (["health"], "--http-restricted-api option format is .*Got health$"),
        (["health:k"], r"option format .*Got health\.\.\.$"),
        (["health:k="], "option format"),
        (["health:=v"], "option format"),
        ([":k=v"], "option format"),
        (["health:a b=v"], "'a b' is not a valid header name"),
    ],
)
def test_bad_values_get_tritons_errors(values: list[str], message: str):
    with pytest.raises(ValueError, match=message):
        RestrictedApis.parse(values)


@pytest.mark.parametrize("value", ["health=s3cret", "health:k:s3cret", "x=y:k=s3cret"])
def test_errors_never_repeat_the_secret(value: str):
    with pytest.raises(ValueError) as err:
        RestrictedApis.parse([value])
    assert "s3cret" not in str(err.value)


def test_grpc_reuses_the_parser_with_its_words_and_prefix():
    rules = RestrictedApis.parse(
        ["inference:k=v"],
        option="grpc-restricted-protocol",
        feature="protocol",
        header_prefix="triton-grpc-protocol-",
    )
    assert rules.get(ApiGroup.INFERENCE) == Restriction("triton-grpc-protocol-k", "v")
    assert rules.to_values("triton-grpc-protocol-") == ["inference:k=v"]
    with pytest.raises(ValueError, match="unknown restricted protocol 'x'"):
        RestrictedApis.parse(["x:k=v"], option="grpc-restricted-protocol", feature="protocol")


def test_to_values_round_trips_and_groups_each_secret_once():
    rules = RestrictedApis.parse(["batch:k=v", "health:k=v", "inference:other=w"])
    assert rules.to_values() == ["health,batch:k=v", "inference:other=w"]
    assert RestrictedApis.parse(rules.to_values()) == rules


def test_the_secret_is_compared_exactly_and_never_shown():
    rule = Restriction("k", "s3cret")
    assert rule.allows("s3cret")
    for wrong in (None, "", "s3cre", "s3cret ", "S3CRET", "s3cretx"):
        assert not rule.allows(wrong), wrong
    assert "s3cret" not in repr(rule)
    assert "s3cret" not in repr(RestrictedApis.parse(["health:k=s3cret"]))
    # Non-ASCII: the header's bytes (servers decode them as latin-1) against UTF-8.
    accented = Restriction("k", "clé")
    assert accented.allows("clé".encode().decode("latin-1"))
    assert not accented.allows("clé") and not accented.allows("\u2603")


def test_refuse_answers_tritons_403():
    rules = RestrictedApis.parse(["inference:infer-key=v"])
    headers = {"infer-key": "v"}
    api_groups.refuse(rules, ApiGroup.INFERENCE, headers.get)
    api_groups.refuse(rules, ApiGroup.HEALTH, {}.get)  # open
    with pytest.raises(Forbidden) as err:
        api_groups.refuse(rules, ApiGroup.INFERENCE, {}.get)
    assert err.value.status == 403
    assert err.value.message == "This API is restricted, expecting header 'infer-key'"


def _app() -> Flask:
    app = Flask("t")
    app.register_blueprint(routes.v2)
    app.register_blueprint(job_routes.bp)
    docs_routes.register(app)
    return app


def test_every_route_declares_its_group():
    """A route with no group would be open whatever is restricted."""
    app = _app()
    missing = [
        rule.rule
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
        and api_groups.group_of(app.view_functions[rule.endpoint]) is None
    ]
    assert not missing


@pytest.mark.parametrize(
    ("method", "path", "group"),
    [
        ("GET", "/v2/health/live", ApiGroup.HEALTH),
        ("GET", "/v2/health/ready", ApiGroup.HEALTH),
        ("GET", "/v2/models/m/ready", ApiGroup.HEALTH),  # as Triton: model readiness is health
        ("GET", "/v2/models/m/versions/2/ready", ApiGroup.HEALTH),
        ("GET", "/v2", ApiGroup.METADATA),
        ("GET", "/v2/models/m", ApiGroup.METADATA),
        ("GET", "/v2/models/m/versions/2", ApiGroup.METADATA),
        ("GET", "/v2/models/m/config", ApiGroup.MODEL_CONFIG),
        ("GET", "/v2/models/stats", ApiGroup.STATISTICS),
        ("GET", "/v2/models/m/versions/2/stats", ApiGroup.STATISTICS),
        ("POST", "/v2/models/m/infer", ApiGroup.INFERENCE),
        ("POST", "/v2/models/m/versions/2/infer", ApiGroup.INFERENCE),
        ("POST", "/v2/repository/index", ApiGroup.MODEL_REPOSITORY),
        ("POST", "/v2/repository/models/m/load", ApiGroup.MODEL_REPOSITORY),
        ("POST", "/v2/repository/models/m/unload", ApiGroup.MODEL_REPOSITORY),
        ("POST", "/v2/models/m/jobs", ApiGroup.JOBS),
        ("POST", "/v2/models/m/versions/2/jobs", ApiGroup.JOBS),
        ("POST", "/v2/models/m/batch", ApiGroup.BATCH),
        ("GET", "/v2/jobs/abc", api_groups.BY_JOB_KIND),
        ("DELETE", "/v2/jobs/abc", api_groups.BY_JOB_KIND),
        ("GET", "/v2/jobs/abc/result", api_groups.BY_JOB_KIND),
        ("GET", "/v2/openapi.json", ApiGroup.METADATA),
        ("GET", "/v2/docs", ApiGroup.METADATA),
        ("GET", "/v2/docs/", ApiGroup.METADATA),
        ("GET", "/v2/docs/swagger-ui.css", ApiGroup.METADATA),
    ],
)
def test_the_group_of_each_route(method: str, path: str, group: ApiGroup | str):
    app = _app()
    endpoint, _ = app.url_map.bind("localhost").match(path, method=method)
    assert api_groups.group_of(app.view_functions[endpoint]) == group
