"""The Helm chart (charts/conch) as Helm itself renders it, offline, checked against conch.

Helm's own template engine and linter (helm-python-sdk wraps Helm 4's Go SDK) render the
default values, the GPU example and an edge set (odd model names, restricted APIs, an
external Redis, a fixed-size group); every core object is validated with
kubernetes-validate (strict, Kubernetes 1.37), every ScaledObject and ServiceMonitor with
the cloudcoil models of KEDA and prometheus-operator (strict: nothing they do not know).
What the objects tell conch is read back with conch's own code: container arguments with
the CLI's parser, restricted-API Secrets with Settings, the URL KEDA reads with
``queue_depth_url`` (and asked of a real gateway), the replicas KEDA would ask for with
``desired_workers``. The image is built when a Docker daemon and the base image are here.
"""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python
import kubernetes_validate
import numpy as np
import pytest
import redis
import requests
import tritonclient.http as httpclient
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor
from pydantic import BaseModel

import conch
from conch.cli import parser as conch_parser
from conch.frontend.grpc.health import SERVER_SERVICES
from conch.settings import (
    RESTRICTED_API_ENV,
    RESTRICTED_PROTOCOL_ENV,
    Settings,
)
from conch.wire.work_owed import (
    JobsWork,
    ModelWork,
    desired_workers,
    queue_depth_url,
    summary,
)

from harness import fresh_db, start_gateway
from integration.jobs.test_jobs import submit
from models import add_model

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "conch"
KUBE_VERSION = "1.37.0"  # kubernetes-validate's schemas, and the version lint assumes
RELEASE, NAMESPACE = "demo", "ml"

# Odd names on purpose: a comma (escaped in --models), a space and a non-ASCII letter
# (escaped in the URL).
ODD_MODELS = ["resnet,v2", "text encoder", "modèle"]
HTTP_RULES = ["model-repository,statistics:admin-key=s3cret", "inference:infer-key=k"]
GRPC_RULES = ["model-repository:admin-key=s3cret"]
EDGE = {
    "restrictedApis": {"http": HTTP_RULES, "grpc": GRPC_RULES},
    "redis": {"enabled": False},
    "externalRedis": {"url": "rediss://:pw@redis.example.internal:6380/2"},
    "dashboard": {"enabled": True, "annotations": {"grafana_folder": "conch"}},
    "workers": {
        "groups": [
            {
                "name": "odd",
                "models": ODD_MODELS,
                "autoscaling": {"minReplicas": 0, "activation": 3},
            },
            {
                "name": "fixed",
                "models": ["mlp"],
                "replicas": 3,
                "autoscaling": {"enabled": False},
            },
            {
                "name": "fractional",
                "models": ["mlp"],
                "autoscaling": {"targetPerWorker": 2.5, "activation": 4, "maxReplicas": 9},
            },
        ]
    },
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "gpu": yaml.safe_load((CHART / "values-gpu.yaml").read_text()),
    "edge": EDGE,
}


def _chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


class _StrictLoader(yaml.SafeLoader):
    """YAML as the API server reads it: a key given twice is an error, not the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        twice = {k for k in keys if keys.count(k) > 1}
        if twice:
            raise yaml.constructor.ConstructorError(None, None, f"keys given twice: {twice}")
        return super().construct_mapping(node, deep=deep)


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the chart renders for ``values``."""
    manifests = _chart().render(values, name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for doc in yaml.load_all(text, Loader=_StrictLoader)  # a SafeLoader
        if doc
    ]


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, VALUE_SETS[request.param]


@pytest.fixture(scope="module")
def objects(value_set: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return render(value_set[1])


@pytest.fixture(scope="module")
def merged(value_set: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """The values a release would use: the chart's defaults under the set's."""
    return _chart().merge_values(value_set[1])


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def conch_settings(container: dict[str, Any]) -> tuple[str, Settings]:
    """The subcommand and Settings conch reads from a container's arguments (the image's
    entry point is ``conch``), with no environment."""
    args = conch_parser().parse_args(container["args"])
    return args.command, Settings.from_args(args, environ={})


def group_settings(merged: dict[str, Any]) -> list[dict[str, Any]]:
    """Each worker group with workers.defaults under it, as the chart documents."""
    defaults = merged["workers"]["defaults"]
    out = []
    for group in merged["workers"]["groups"]:
        g = {**defaults, **group}
        g["autoscaling"] = {**defaults["autoscaling"], **group.get("autoscaling", {})}
        out.append(g)
    return out


def fullname() -> str:
    return f"{RELEASE}-conch"


def scale_to_zero_models(merged: dict[str, Any]) -> list[str]:
    """What the frontends should be told may have no worker: the models of every
    autoscaled group with minReplicas 0 (["*"], every model, if one serves them all)."""
    at_zero = [
        g["models"]
        for g in group_settings(merged)
        if g["autoscaling"]["enabled"] and g["autoscaling"]["minReplicas"] == 0
    ]
    if any(not models for models in at_zero):
        return ["*"]
    return list(dict.fromkeys(m for models in at_zero for m in models))


def jobs_group(merged: dict[str, Any]) -> str:
    """The group whose scaler counts the batch jobs queue: the one marked, else the first."""
    groups = merged["workers"]["groups"]
    return next((g["name"] for g in groups if g.get("jobs")), groups[0]["name"])


# --- Helm's linter and the schemas ------------------------------------------------------


def test_lint_strict(value_set: tuple[str, dict[str, Any]]) -> None:
    report = helm_python.lint(
        CHART, value_set[1], strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}"
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


def _strict(model: type[BaseModel], obj: dict[str, Any]) -> None:
    """Validate ``obj`` strictly against a cloudcoil model: no coercion, and no field the
    model does not know (the models ignore unknown fields, so it must survive a round trip)."""
    parsed = model.model_validate_json(json.dumps(obj), strict=True)
    assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == obj


def test_every_object_validates(objects: list[dict[str, Any]]) -> None:
    kinds = set()
    for obj in objects:
        kinds.add(obj["kind"])
        if obj["apiVersion"] == "keda.sh/v1alpha1":
            _strict(ScaledObject, obj)
        elif obj["apiVersion"] == "monitoring.coreos.com/v1":
            _strict(ServiceMonitor, obj)
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    assert {"Deployment", "Service", "PodDisruptionBudget", "Secret"} <= kinds


def test_the_strict_checks_can_fail() -> None:
    """The validators above reject what they should (a misspelt field, a string count)."""
    objects = render({})
    scaled = find(objects, "ScaledObject")[0]
    with pytest.raises(AssertionError):
        _strict(ScaledObject, {**scaled, "spec": {**scaled["spec"], "minReplicas": 1}})
    with pytest.raises(Exception, match="minReplicaCount"):
        _strict(ScaledObject, {**scaled, "spec": {**scaled["spec"], "minReplicaCount": "1"}})
    deployment = find(objects, "Deployment")[0]
    bad = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)


def test_app_version_is_conchs() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == conch.__version__
    gateway = one(render({}), "Deployment", f"{fullname()}-gateway")
    assert containers(gateway)[0]["image"] == f"conch:{conch.__version__}"


# --- the gateway pod: ports, probes, flags -------------------------------------------------


def test_gateway_ports_and_probes(objects: list[dict[str, Any]]) -> None:
    """Triton's ports (conch's defaults) on the Service and the containers, probes on
    Triton's health routes and grpc.health.v1, and flags conch reads as such."""
    defaults = Settings()
    name = f"{fullname()}-gateway"
    service = one(objects, "Service", name)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert (
        {n: p["port"] for n, p in ports.items()}
        == {
            "http": defaults.http_port,
            "grpc": defaults.grpc_port,
            "metrics": defaults.metrics_port,
        }
        == {"http": 8000, "grpc": 8001, "metrics": 8002}
    )
    pod = one(objects, "Deployment", name)["spec"]["template"]
    assert pod["metadata"]["labels"].items() >= service["spec"]["selector"].items()
    by_name = {c["name"]: c for c in pod["spec"]["containers"]}
    assert set(by_name) == {"gateway", "grpc"}
    container_ports = {
        p["name"]: p["containerPort"] for c in by_name.values() for p in c.get("ports", [])
    }
    assert {n: container_ports[p["targetPort"]] for n, p in ports.items()} == {
        n: p["port"] for n, p in ports.items()
    }

    gateway = by_name["gateway"]
    command, settings = conch_settings(gateway)
    assert command == "gateway"
    assert (settings.http_port, settings.metrics_port) == (8000, 8002)
    for probe, path in (
        ("startupProbe", "/v2/health/live"),
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
    ):
        assert gateway[probe]["httpGet"] == {"path": path, "port": "http"}

    grpc = by_name["grpc"]
    command, settings = conch_settings(grpc)
    assert command == "grpc" and settings.grpc_port == 8001
    for probe in ("startupProbe", "readinessProbe"):
        check = grpc[probe]["grpc"]
        assert check["port"] == settings.grpc_port
        assert check.get("service", "") in SERVER_SERVICES  # the server's own readiness


def test_frontends_are_told_the_models_of_the_groups_at_zero(
    value_set: tuple[str, dict[str, Any]], merged: dict[str, Any], objects: list[dict[str, Any]]
) -> None:
    """A group at zero wakes on requests the frontends take: HTTP and gRPC alike get
    --scale-to-zero with exactly the models of the min-0 groups (as conch's parser reads
    it back: commas in names escaped), so those read ready with no worker."""
    expected = scale_to_zero_models(merged)
    assert bool(expected) == (value_set[0] != "default")  # each set but the default has one
    for container in containers(one(objects, "Deployment", f"{fullname()}-gateway")):
        assert conch_settings(container)[1].scale_to_zero == expected, container["name"]


def test_a_group_at_zero_serving_every_model_makes_every_model_scale_to_zero() -> None:
    groups = [{"name": "a", "models": ["x"]}, {"name": "b", "autoscaling": {"minReplicas": 0}}]
    objects = render({"workers": {"groups": groups}})
    for container in containers(one(objects, "Deployment", f"{fullname()}-gateway")):
        assert conch_settings(container)[1].scale_to_zero == ["*"]


def test_strict_readiness_with_groups_at_zero_on_a_real_gateway(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    """strictReadiness with the GPU example (its GPU group at zero) renders, and a real
    gateway given the chart's readiness flags, with no worker at all: the GPU group's
    model is ready (its request would wake the group), the CPU group's are not (minimum
    1: Triton's meaning), so the server is not ready; with the CPU group at zero too,
    the server is ready with no worker."""
    gpu = VALUE_SETS["gpu"]
    repo = tmp_path / "models"
    for group in gpu["workers"]["groups"]:
        for model in group["models"]:
            add_model(repo / model)
    cpu_at_zero = {
        **gpu["workers"]["groups"][1],
        "autoscaling": {**gpu["workers"]["groups"][1]["autoscaling"], "minReplicas": 0},
    }
    for cpu_minimum, groups in (
        (1, gpu["workers"]["groups"]),
        (0, [gpu["workers"]["groups"][0], cpu_at_zero]),
    ):
        values = {**gpu, "gateway": {"strictReadiness": True}, "workers": {"groups": groups}}
        pod = one(render(values), "Deployment", f"{fullname()}-gateway")
        (container,) = [c for c in containers(pod) if c["name"] == "gateway"]
        settings = conch_settings(container)[1]
        assert settings.strict_readiness is True
        assert settings.scale_to_zero == [
            "classifier",
            *(["preprocessing", "postprocessing"] if cpu_minimum == 0 else []),
        ]
        flags = [a for a in container["args"] if a.startswith(("--strict-readiness", "--scale-"))]
        gateway, url = start_gateway(repo, fresh_db(redis_url, 2), log_dir, *flags)
        try:
            client = httpclient.InferenceServerClient(url)
            assert client.is_model_ready("classifier")
            assert client.is_model_ready("preprocessing") is (cpu_minimum == 0)
            assert client.is_server_ready() is (cpu_minimum == 0)
        finally:
            gateway.stop()


# --- graceful shutdown ----------------------------------------------------------------------


def test_termination_grace_outlasts_the_drain(objects: list[dict[str, Any]]) -> None:
    """Each conch pod's grace period is longer than what runs before SIGTERM (preStop)
    plus the SIGTERM drain its processes read from their flags (--exit-timeout-secs; a
    worker exits at that deadline whatever it still holds, conch.worker.app.ExitDeadline)."""
    checked = set()
    for obj in find(objects, "Deployment"):
        spec = obj["spec"]["template"]["spec"]
        for container in spec["containers"]:
            command, settings = conch_settings(container)
            if command == "sync":
                continue
            before = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
            drain = before.get("seconds", 0) + settings.exit_timeout_secs
            assert spec["terminationGracePeriodSeconds"] > drain, (obj["metadata"]["name"], drain)
            checked.add(command)
    assert {"gateway", "grpc", "worker"} <= checked


# --- worker groups and KEDA -------------------------------------------------------------------


def test_each_group_is_a_worker_deployment(
    merged: dict[str, Any], objects: list[dict[str, Any]]
) -> None:
    groups = group_settings(merged)
    workers = [o for o in find(objects, "Deployment") if containers(o)[0]["args"][0] == "worker"]
    assert len(workers) == len(groups)
    for g in groups:
        deployment = one(objects, "Deployment", f"{fullname()}-worker-{g['name']}")
        (container,) = containers(deployment)
        command, settings = conch_settings(container)
        assert command == "worker"
        assert settings.models == (g["models"] or None)  # None: every model
        assert container["resources"] == g["resources"]
        pod = deployment["spec"]["template"]["spec"]
        assert pod.get("nodeSelector", {}) == g["nodeSelector"]
        assert pod.get("tolerations", []) == g["tolerations"]
        if g["autoscaling"]["enabled"]:
            assert "replicas" not in deployment["spec"]  # KEDA's to set
        else:
            assert deployment["spec"]["replicas"] == g["replicas"]
        assert one(objects, "PodDisruptionBudget", deployment["metadata"]["name"])


def _keda_replicas(scaled: dict[str, Any], owed: int) -> int:
    """What KEDA asks for with this ScaledObject when the metric reads ``owed``:
    activation decides 0 or not (with minReplicaCount 0), then its HPA's AverageValue
    target, ceil(metric / target), within the bounds."""
    spec = scaled["spec"]
    (trigger,) = spec["triggers"]
    target = float(trigger["metadata"]["targetValue"])
    activation = float(trigger["metadata"].get("activationTargetValue", 0))
    low, high = spec.get("minReplicaCount", 0), spec["maxReplicaCount"]
    if low == 0 and not owed > activation:
        return 0
    return min(high, max(low, 1, math.ceil(owed / target)))


def test_scaled_objects_read_the_platforms_signal(
    merged: dict[str, Any], objects: list[dict[str, Any]]
) -> None:
    """Each autoscaled group's ScaledObject scales its Deployment on GET /queue-depth for
    exactly that group's models, as conch's own queue_depth_url spells it, at the gateway
    Service's metrics port; reads the field summary() puts the work owed in; and asks for
    the replicas desired_workers computes."""
    service = one(objects, "Service", f"{fullname()}-gateway")
    metrics = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "metrics")
    base = f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{metrics}"
    scaled_objects = find(objects, "ScaledObject")
    groups = [g for g in group_settings(merged) if g["autoscaling"]["enabled"]]
    assert len(scaled_objects) == len(groups)
    for g in groups:
        name = f"{fullname()}-worker-{g['name']}"
        scaled = one(objects, "ScaledObject", name)
        assert scaled["spec"]["scaleTargetRef"]["name"] == name
        (container,) = containers(one(objects, "Deployment", name))
        served = conch_settings(container)[1].models or []
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
        meta = trigger["metadata"]
        jobs = g["name"] == jobs_group(merged)  # that group's scaler counts the jobs too
        assert (
            meta["url"]
            == queue_depth_url(base, g["models"], jobs=jobs)
            == queue_depth_url(base, served, jobs=jobs)
        )

        work = {m: ModelWork(m, waiting=3 + i, in_flight=i) for i, m in enumerate(served or "ab")}
        queued = JobsWork(waiting=2, in_flight=1) if jobs else None
        payload = summary(work, queued)
        assert payload[meta["valueLocation"]] == sum(w.owed for w in work.values()) + (
            3 if jobs else 0
        )

        a = g["autoscaling"]
        for owed in range(0, 4 * int(a["targetPerWorker"] * a["maxReplicas"]) + 3):
            wanted = desired_workers(
                owed, a["targetPerWorker"], a["minReplicas"], a["maxReplicas"], a["activation"]
            )
            assert _keda_replicas(scaled, owed) == wanted, (g["name"], owed)
        cooldown = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert (
            scaled["spec"]["cooldownPeriod"]
            == cooldown["scaleDown"]["stabilizationWindowSeconds"]
            == a["cooldownSecs"]
        )


def _taking_jobs(objects: list[dict[str, Any]]) -> list[str]:
    """The worker Deployments whose workers run batch jobs, as conch's parser reads their
    arguments (``--batch-jobs``, true unless given false)."""
    return [
        o["metadata"]["name"]
        for o in find(objects, "Deployment")
        for command, settings in [conch_settings(containers(o)[0])]
        if command == "worker" and settings.batch_jobs
    ]


def test_exactly_one_group_counts_and_runs_the_batch_jobs(
    merged: dict[str, Any], objects: list[dict[str, Any]]
) -> None:
    """One group's ScaledObject asks for jobs=1: the one marked jobs: true (the GPU
    example's CPU group), else the first; that group's workers alone take batch jobs
    (every other one runs with --batch-jobs=false), so no scaler retires a job's driver
    it does not count."""
    group = f"{fullname()}-worker-{jobs_group(merged)}"
    counting = [
        o["metadata"]["name"]
        for o in find(objects, "ScaledObject")
        if "jobs=1" in o["spec"]["triggers"][0]["metadata"]["url"]
    ]
    assert counting == [group]
    assert _taking_jobs(objects) == [group]
    assert jobs_group(_chart().merge_values(VALUE_SETS["gpu"])) == "cpu"
    assert jobs_group(_chart().merge_values({})) == "all"
    later = render({"workers": {"groups": [{"name": "a"}, {"name": "b", "jobs": True}]}})
    url = one(later, "ScaledObject", f"{fullname()}-worker-b")["spec"]["triggers"][0]
    assert url["metadata"]["url"].endswith("?jobs=1")
    assert _taking_jobs(later) == [f"{fullname()}-worker-b"]


def test_odd_model_names_reach_the_worker_and_keda_intact() -> None:
    objects = render(EDGE)
    name = f"{fullname()}-worker-odd"
    (container,) = containers(one(objects, "Deployment", name))
    assert conch_settings(container)[1].models == ODD_MODELS
    url = one(objects, "ScaledObject", name)["spec"]["triggers"][0]["metadata"]["url"]
    assert url.endswith(queue_depth_url("", ODD_MODELS, jobs=True))  # the first group
    assert "%2C" in url and "%20" in url and "%C3%A8" in url


def test_gpu_example_has_a_gpu_group_at_zero_and_a_cpu_group() -> None:
    objects = render(VALUE_SETS["gpu"])
    gpu = one(objects, "Deployment", f"{fullname()}-worker-gpu")
    (container,) = containers(gpu)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].endswith("-gpu")
    assert one(objects, "ScaledObject", f"{fullname()}-worker-gpu")["spec"]["minReplicaCount"] == 0
    cpu = one(objects, "Deployment", f"{fullname()}-worker-cpu")
    assert "nvidia.com/gpu" not in json.dumps(cpu)
    assert find(objects, "ServiceMonitor")


def test_keda_reads_the_work_owed_from_a_real_gateway(
    tmp_path: Path, redis_url: str, log_dir: Path
) -> None:
    """The GPU example's trigger URLs, asked of a real gateway's metrics port: with one
    async job queued for the GPU group's model and one batch job queued (no worker runs),
    the value KEDA reads is 1 for the GPU group and 1 for the CPU group, which counts the
    batch jobs."""
    objects = render(VALUE_SETS["gpu"])
    groups = {
        g["name"]: g["models"] for g in group_settings(_chart().merge_values(VALUE_SETS["gpu"]))
    }
    repo = tmp_path / "models"
    for model in (m for models in groups.values() for m in models):
        add_model(repo / model)
    gateway, url = start_gateway(repo, fresh_db(redis_url, 2), log_dir)
    try:
        a, b = (httpclient.InferInput(n, [1, 4], "FP32") for n in "AB")
        for tensor in (a, b):
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        submit(url, groups["gpu"][0], [a, b])
        batch = requests.post(
            f"http://{url}/v2/models/{groups['gpu'][0]}/batch",
            json={"input": "s3://data/in.jsonl", "output": "s3://data/out.jsonl"},
            timeout=30,
        )
        assert batch.status_code == 202, batch.text
        for name, models in groups.items():
            scaled = one(objects, "ScaledObject", f"{fullname()}-worker-{name}")
            meta = scaled["spec"]["triggers"][0]["metadata"]
            target = urlsplit(meta["url"])
            reply = requests.get(f"http://{gateway.metrics_url}{target.path}?{target.query}")
            assert reply.status_code == 200, reply.text
            body = reply.json()
            assert set(body["models"]) == set(models)
            assert body[meta["valueLocation"]] == 1
            assert ("jobs" in body) is (name == "cpu")
    finally:
        gateway.stop()


# --- secrets, Redis and the model repository -----------------------------------------------


def _secret_data(secret: dict[str, Any]) -> dict[str, str]:
    data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
    return {**data, **secret.get("stringData", {})}


def _env_from_secrets(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict:
    """The container's environment as Kubernetes would give it (literal values, and
    values of Secrets the chart renders)."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            secrets = find(objects, "Secret", ref["name"])
            value = _secret_data(secrets[0]).get(ref["key"]) if secrets else None
            if value is not None:
                env[var["name"]] = value
            else:
                assert ref.get("optional") or not secrets, var
    return env


def test_every_conch_process_reads_redis_url_from_a_secret(objects: list[dict]) -> None:
    for obj in find(objects, "Deployment"):
        for container in containers(obj):
            (var,) = [v for v in container["env"] if v["name"] == "REDIS_URL"]
            assert set(var) == {"name", "valueFrom"}, "REDIS_URL never in the pod spec"
            assert "secretKeyRef" in var["valueFrom"]


def test_the_charts_redis_keeps_its_queues_on_a_volume() -> None:
    objects = render({})
    redis_name = f"{fullname()}-redis"
    statefulset = one(objects, "StatefulSet", redis_name)
    (container,) = containers(statefulset)
    args = container["args"]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--appendonly"] == "yes" and flags["--appendfsync"] == "everysec"
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[flags["--dir"]] == claim["metadata"]["name"]
    # The URL conch gets names that Redis, its Service port and its password.
    gateway = containers(one(objects, "Deployment", f"{fullname()}-gateway"))[0]
    url = _env_from_secrets(objects, gateway)["REDIS_URL"]
    kwargs = redis.ConnectionPool.from_url(url).connection_kwargs
    service = one(objects, "Service", redis_name)
    assert (kwargs["host"], kwargs["port"]) == (redis_name, service["spec"]["ports"][0]["port"])
    assert kwargs["password"] == _env_from_secrets(objects, container)["REDIS_PASSWORD"]


def test_external_redis_and_restricted_apis_come_from_secrets() -> None:
    """The edge set: REDIS_URL is the external URL; the restricted-API rules reach the
    frontends in the environment variables conch reads, and parse to what the flags
    would give."""
    objects = render(EDGE)
    assert not find(objects, "StatefulSet")
    by_name = {
        c["name"]: c for c in containers(one(objects, "Deployment", f"{fullname()}-gateway"))
    }
    for name, env_name, flag, rules, field in (
        ("gateway", RESTRICTED_API_ENV, "--http-restricted-api", HTTP_RULES, "http_restricted_api"),
        (
            "grpc",
            RESTRICTED_PROTOCOL_ENV,
            "--grpc-restricted-protocol",
            GRPC_RULES,
            "grpc_restricted_protocol",
        ),
    ):
        env = _env_from_secrets(objects, by_name[name])
        assert env["REDIS_URL"] == EDGE["externalRedis"]["url"]
        assert not any("s3cret" in json.dumps(a) for a in by_name[name]["args"])
        from_secret = getattr(Settings.from_env({env_name: env[env_name]}), field)
        flags = [arg for rule in rules for arg in (flag, rule)]
        from_flags = getattr(
            conch_settings({"args": [name, "--model-repository", "m", *flags]})[1], field
        )
        assert from_secret.to_values() == from_flags.to_values() and from_flags.to_values()


def test_volume_repository_and_repo_sync() -> None:
    """GPU example: repo-sync writes the repository into the claim every pod mounts, and
    every conch process is given that folder."""
    objects = render(VALUE_SETS["gpu"])
    claim = one(objects, "PersistentVolumeClaim", f"{fullname()}-models")
    sync = one(objects, "Deployment", f"{fullname()}-repo-sync")
    (container,) = containers(sync)
    args = conch_parser().parse_args(container["args"])
    assert args.command == "sync" and args.source == "s3://models/prod"
    repository = args.model_repository
    for obj in find(objects, "Deployment"):
        spec = obj["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["containers"]:
            if c["args"][0] != "sync":
                assert conch_settings(c)[1].model_repository == (repository,)
            (mount,) = [m for m in c["volumeMounts"] if repository.is_relative_to(m["mountPath"])]
            claim_name = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
            assert claim_name == claim["metadata"]["name"]
            assert mount["readOnly"] is (obj is not sync)


# --- values that cannot work are refused with the reason --------------------------------------


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"restrictedApis": {"http": ["health,inference:k=v"]}}, "health group must stay open"),
        (
            {"workers": {"groups": [{"name": n, "jobs": True} for n in ("a", "b", "c")]}},
            "one group runs the batch jobs (jobs: true), not 3: a, b, c",
        ),
        ({"workers": {"groups": [{"name": "GPU_1"}]}}, "must be a DNS label"),
        ({"workers": {"groups": [{"name": "a"}, {"name": "a"}]}}, "two groups are named a"),
        (
            {"workers": {"groups": [{"name": "a", "autoscaling": {"minReplicas": 5}}]}},
            "minReplicas <= maxReplicas",
        ),
        (
            {"workers": {"groups": [{"name": "a", "autoscaling": {"targetPerWorker": 0}}]}},
            "targetPerWorker must be above 0",
        ),
        ({"repoSync": {"enabled": True, "source": "s3://b/p"}}, "modelRepository.source=volume"),
        ({"redis": {"enabled": False}}, "externalRedis.url or externalRedis.existingSecret"),
        ({"modelRepository": {"source": "nfs"}}, "must be image or volume"),
    ],
)
def test_values_that_cannot_work_fail_with_the_reason(values: dict, reason: str) -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape(reason)):
        render(values)


# --- the image ------------------------------------------------------------------------------


def _dockerfile_final_stage() -> list[str]:
    lines = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    instructions = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    last_from = max(i for i, ln in enumerate(instructions) if ln.upper().startswith("FROM "))
    return instructions[last_from:]


def test_dockerfile_is_what_the_chart_expects() -> None:
    """Non-root user, ``conch`` as the entry point, the shipped repository where the
    chart's default values look for it, and a context (.dockerignore) that has it all."""
    final = _dockerfile_final_stage()
    user = next(ln.split()[1] for ln in reversed(final) if ln.upper().startswith("USER "))
    uid = user.split(":")[0]
    assert uid not in ("0", "root")
    assert int(uid) == _chart().values["podSecurityContext"]["runAsUser"]
    entrypoint = next(ln for ln in final if ln.upper().startswith("ENTRYPOINT "))
    assert json.loads(entrypoint.split(None, 1)[1]) == ["conch"]
    # The shipped repository, as the build stage left it (text_embedding built there).
    copies = [ln.split()[1:] for ln in final if ln.upper().startswith("COPY ")]
    image_path = _chart().values["modelRepository"]["imagePath"]
    assert ["--from=build", "/src/functions", image_path] in copies
    build = (ROOT / "Dockerfile").read_text().split("\nFROM ")[1]
    assert "WORKDIR /src" in build and "COPY functions functions" in build
    # Every build step of `make functions` (the shipped models' build outputs) runs there too.
    make_functions = re.search(
        r"^functions:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M
    )
    assert make_functions, "the Makefile has a functions target"
    scripts = re.findall(r"functions/build_\w+\.py", make_functions[1])
    assert len(scripts) >= 2
    for script in scripts:
        assert f"python {script}" in build, f"the image does not run {script}"
    cmd = json.loads(next(ln for ln in final if ln.upper().startswith("CMD ")).split(None, 1)[1])
    assert conch_parser().parse_args(cmd).command == "gateway"
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    for path in ("pyproject.toml", "README.md", "platform/", "repo_sync/", "functions/"):
        assert f"!{path}" in ignore


def _docker_ready() -> str | None:
    """Why the image cannot be built here, or None."""
    if not shutil.which("docker"):
        return "no docker client"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode:
        return f"no Docker daemon: {(info.stderr or info.stdout).strip().splitlines()[-1]}"
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert base, "the Dockerfile names its base image in ARG PYTHON_IMAGE"
    present = subprocess.run(["docker", "image", "inspect", base[1]], capture_output=True)
    if present.returncode:
        return f"base image {base[1]} is not present (docker pull {base[1]})"
    return None


@pytest.fixture(scope="module")
def built_image() -> Iterator[Callable[..., subprocess.CompletedProcess]]:
    why = _docker_ready()
    if why:
        pytest.skip(f"cannot build the image: {why}")
    tag = f"conch-test:{uuid.uuid4().hex[:12]}"
    subprocess.run(["docker", "build", "-t", tag, str(ROOT)], check=True, timeout=3600)

    def run(*args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess:
        cmd = ["docker", "run", "--rm", *(["--entrypoint", entrypoint] if entrypoint else [])]
        return subprocess.run([*cmd, tag, *args], capture_output=True, text=True, timeout=300)

    yield run
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def test_image_runs_conch_as_a_user_that_is_not_root(
    built_image: Callable[..., subprocess.CompletedProcess],
) -> None:
    assert built_image("--version").stdout.strip() == f"conch {conch.__version__}"
    assert built_image("-u", entrypoint="id").stdout.strip() != "0"
    for command in ("gateway", "grpc", "worker", "sync"):
        assert built_image(command, "--help").returncode == 0, command
    listing = built_image(_chart().values["modelRepository"]["imagePath"], entrypoint="ls")
    assert "mlp" in listing.stdout.split()
