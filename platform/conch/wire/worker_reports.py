"""Which worker serves which model version, as the workers report it.

Every worker writes its model states under a key that expires unless refreshed, so a
dead worker drops out by itself; gateways read the union to answer readiness and the
repository index with what is really loaded, not what is on disk.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from conch.wire.keys import WORKER_PREFIX, WORKERS

# How often a worker (and each of its process instances) refreshes what it keeps alive in
# Redis: its report, its custom metrics, the tags it holds. What it writes lives four beats.
HEARTBEAT_S = 1.5
REPORT_TTL_S = HEARTBEAT_S * 4

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
# Not resident on a worker with --model-memory-budget, which loads it when work for it
# waits (conch.worker.residency): its requests wait in the queue, so it reads as ready.
STANDBY = "STANDBY"


def publish(
    client: redis.Redis,
    worker_id: str,
    models: dict[str, dict[str, Any]],
    *,
    stats: dict[str, dict[str, int]] | None = None,
    host: dict[str, Any] | None = None,
    instances: list[dict[str, Any]] | None = None,
    ttl_s: float,
) -> None:
    """``models``: name -> {"versions": {"1": "READY"}, "reason": str | None};
    ``stats``: name -> counts of executions, requests and rows this worker ran;
    ``host``: its host's CPU and GPU use (``conch.worker.host_metrics``);
    ``instances``: its process instances (``--instance-form process``), each
    {"model", "instance", "pid", "host_bytes", "gpu_bytes", "metrics_id"}."""
    report = {
        "id": worker_id,
        "at": time.time(),
        "models": models,
        "stats": stats or {},
        "host": host or {},
        "instances": instances or [],
    }
    pipe = client.pipeline(transaction=False)
    pipe.set(WORKER_PREFIX + worker_id, json.dumps(report), px=int(ttl_s * 1000))
    pipe.sadd(WORKERS, worker_id)
    pipe.execute()


def withdraw(client: redis.Redis, worker_id: str) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.delete(WORKER_PREFIX + worker_id)
    pipe.srem(WORKERS, worker_id)
    pipe.execute()


def snapshot(client: redis.Redis) -> list[dict[str, Any]]:
    """The live workers' reports; entries of workers whose key expired are pruned."""
    ids = sorted(v.decode() if isinstance(v, bytes) else v for v in client.smembers(WORKERS))
    if not ids:
        return []
    values = client.mget([WORKER_PREFIX + i for i in ids])
    gone = [i for i, v in zip(ids, values, strict=True) if v is None]
    if gone:
        client.srem(WORKERS, *gone)
    return [json.loads(v) for v in values if v is not None]


def model_states(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Union over workers: a version is READY if any live worker has it ready."""
    out: dict[str, dict[str, Any]] = {}
    for report in reports:
        for name, m in report.get("models", {}).items():
            merged = out.setdefault(
                name, {"versions": {}, "reason": None, "load_ids": [], "loading": False}
            )
            if m.get("load_id"):
                merged["load_ids"].append(m["load_id"])
            merged["loading"] = merged["loading"] or bool(m.get("loading"))
            for v, state in m.get("versions", {}).items():
                if merged["versions"].get(v) != READY:
                    merged["versions"][v] = state
            if m.get("reason") and not merged["reason"]:
                merged["reason"] = m["reason"]
    return out


def residency(reports: list[dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Model -> the live workers it is resident on (a version READY there) and those that
    hold it on standby (``--model-memory-budget``), by worker id: where each model is."""
    out: dict[str, dict[str, list[str]]] = {}
    for report in reports:
        for name, m in report.get("models", {}).items():
            states = set(m.get("versions", {}).values())
            where = out.setdefault(name, {"resident_on": [], "standby_on": []})
            if READY in states:
                where["resident_on"].append(report.get("id", ""))
            elif STANDBY in states:
                where["standby_on"].append(report.get("id", ""))
    return out


def hosts(
    reports: list[dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(host name -> CPU sample, GPU UUID -> GPU sample, host included): the freshest
    report's for each, so workers sharing a host (or a GPU) count it once."""
    cpus: dict[str, dict[str, Any]] = {}
    gpus: dict[str, dict[str, Any]] = {}
    for report in sorted(reports, key=lambda r: r.get("at", 0)):  # the freshest wins
        host = report.get("host") or {}
        name = host.get("host", "")
        if "cpu" in host:
            cpus[name] = host["cpu"]
        for gpu in host.get("gpus", ()):
            gpus[gpu["uuid"]] = {**gpu, "host": name}
    return cpus, gpus


def process_instances(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live workers' process instances, each with its worker's id (``worker``)."""
    return [
        {**inst, "worker": report.get("id", "")}
        for report in reports
        for inst in report.get("instances") or ()
        if isinstance(inst, dict)
    ]


def metrics_sources(reports: list[dict[str, Any]]) -> list[str]:
    """Whose custom metrics count (``conch.wire.model_metrics``): each live worker's, and
    each of its process instances' (a child's models have a registry of their own)."""
    ids = [report.get("id", "") for report in reports]
    ids += [inst.get("metrics_id", "") for inst in process_instances(reports)]
    return [i for i in ids if isinstance(i, str) and i]
