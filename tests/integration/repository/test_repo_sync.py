"""repo_sync against a real S3-API server: moto's server mode on loopback, reached by boto3
over HTTP with the same code a user runs against AWS or MinIO (no mocks, no decorators).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from conch.core.repository import ModelRepository
from conch.devtools.redis_server import free_port, start_private
from repo_sync import fsops
from repo_sync.events import CHANNEL, GENERATION_KEY, Publisher, decode_event
from repo_sync.sources import LocalSource, S3Source
from repo_sync.sync import MANIFEST, Syncer, SyncOptions

POLL = 0.2

PY_CONFIG = b"""
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
ONNX_CONFIG = b'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


@pytest.fixture()
def bucket(s3) -> str:
    name = f"models-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


class Store:
    """Uploads into one bucket under a prefix, the way a team would."""

    def __init__(self, s3, bucket: str, prefix: str = "repo") -> None:
        self.s3, self.bucket, self.prefix = s3, bucket, prefix

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def put(self, rel: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self.key(rel), Body=data)

    def delete(self, rel: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=self.key(rel))

    def delete_prefix(self, rel: str) -> None:
        listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self.key(rel))
        for obj in listed.get("Contents", []):
            self.s3.delete_object(Bucket=self.bucket, Key=obj["Key"])

    def version(self, model: str, v: int, files: dict[str, bytes], *, ready: bool = False) -> None:
        for rel, data in files.items():
            self.put(f"{model}/{v}/{rel}", data)
        if ready:
            self.put(f"{model}/{v}/.ready", b"")


@pytest.fixture()
def store(s3, bucket: str) -> Store:
    return Store(s3, bucket)


@pytest.fixture()
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture()
def syncers(s3_endpoint: str) -> Iterator[list]:
    made: list[Syncer] = []
    yield made
    for s in made:
        s.close()


@pytest.fixture()
def make_syncer(s3_endpoint: str, bucket: str, cache: Path, syncers: list):
    def make(prefix: str = "repo", publisher: Publisher | None = None, **options) -> Syncer:
        options.setdefault("poll_secs", POLL)
        source = S3Source(bucket, prefix, endpoint_url=s3_endpoint)
        syncer = Syncer(source, cache, options=SyncOptions(**options), publisher=publisher)
        syncers.append(syncer)
        return syncer

    return make


def count_gets(syncer: Syncer) -> list[str]:
    """Observe the production client's GetObject calls (an event hook, not a mock)."""
    keys: list[str] = []
    syncer.source.client.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: keys.append(params["Key"])
    )
    return keys


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under root that is not repo_sync's own (dot entries at the top)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0].startswith("."):
            continue
        if path.is_file():
            out[rel.as_posix()] = path.read_bytes()
    return out


def scan(cache: Path) -> dict:
    return ModelRepository(cache, auto_complete=False, gpu_count=0).scan()


# -- mirroring ----------------------------------------------------------------------------


def test_first_sync_mirrors_every_model_byte_for_byte(store: Store, make_syncer, cache: Path):
    weights = os.urandom(300_000)
    store.put("py/config.pbtxt", PY_CONFIG)
    store.put("py/labels.txt", b"a\nb\n")
    store.version("py", 1, {"model.py": b"# one\n", "assets/vocab.txt": b"v1"}, ready=True)
    store.version("py", 3, {"model.py": b"# three\n", "assets/vocab.txt": b"v3"}, ready=True)
    store.put("onnx/config.pbtxt", ONNX_CONFIG)
    store.version("onnx", 2, {"model.onnx": weights}, ready=True)
    store.put("README.md", b"not a model")  # files at the root are ignored, like Triton

    syncer = make_syncer()
    result = syncer.sync_once()

    assert result.errors == [] and result.pending == []
    assert tree_bytes(cache) == {
        "py/config.pbtxt": PY_CONFIG,
        "py/labels.txt": b"a\nb\n",
        "py/1/model.py": b"# one\n",
        "py/1/assets/vocab.txt": b"v1",
        "py/3/model.py": b"# three\n",
        "py/3/assets/vocab.txt": b"v3",
        "onnx/config.pbtxt": ONNX_CONFIG,
        "onnx/2/model.onnx": weights,
    }
    assert not any(p.name == ".ready" for p in cache.rglob("*"))
    entries = scan(cache)
    assert entries["py"].error is None and entries["py"].versions == [3]
    manifest = json.loads((cache / MANIFEST).read_text())
    assert sorted(manifest["models"]) == ["onnx", "py"]
    assert sorted(manifest["models"]["py"]["versions"]) == ["1", "3"]


def test_only_changed_objects_are_downloaded_again(store: Store, make_syncer, cache: Path):
    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": b"# v1", "a.bin": b"a" * 1000, "b.bin": b"b" * 1000})
    syncer = make_syncer()
    gets = count_gets(syncer)
    syncer.sync_once()
    assert syncer.sync_once().events  # taken on the second, stable poll
    assert sorted(gets) == sorted(
        f"repo/m/{f}" for f in ("config.pbtxt", "1/model.py", "1/a.bin", "1/b.bin")
    )
    a_inode = (cache / "m/1/a.bin").stat().st_ino

    gets.clear()
    for _ in range(3):
        result = syncer.sync_once()
        assert result.events == [] and result.downloaded == 0
    assert gets == []  # nothing changed: listings only

    store.put("m/1/b.bin", b"B" * 1200)
    syncer.sync_once()
    result = syncer.sync_once()
    assert [(e["model"], e["version"], e["change"]) for e in result.events] == [("m", 1, "changed")]
    assert gets == ["repo/m/1/b.bin"]
    assert result.downloaded == 1 and result.reused == 2
    assert (cache / "m/1/b.bin").read_bytes() == b"B" * 1200
    assert (cache / "m/1/a.bin").read_bytes() == b"a" * 1000
    assert (cache / "m/1/a.bin").stat().st_ino == a_inode  # reused by a hard link

    gets.clear()
    store.put("m/config.pbtxt", PY_CONFIG + b"\n# edited\n")
    result = syncer.sync_once()
    assert [(e["version"], e["change"]) for e in result.events] == [(None, "changed")]
    assert gets == ["repo/m/config.pbtxt"]  # read once: to check it, then written from memory
    assert (cache / "m/config.pbtxt").read_bytes().endswith(b"# edited\n")


def test_new_version_with_marker_is_taken_at_the_next_poll(store: Store, make_syncer, cache):
    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": b"1"}, ready=True)
    syncer = make_syncer()
    syncer.sync_once()
    store.version("m", 2, {"model.py": b"2"}, ready=True)
    result = syncer.sync_once()
    assert [(e["version"], e["change"]) for e in result.events] == [(2, "added")]
    assert (cache / "m/2/model.py").read_bytes() == b"2"


def test_new_version_without_marker_is_taken_after_two_stable_polls(
    store: Store, make_syncer, cache
):
    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": b"1"})
    syncer = make_syncer()
    first = syncer.sync_once()
    assert not (cache / "m").exists()  # a model appears only with a complete version
    assert [(p.model, p.version) for p in first.pending] == [("m", 1)]
    second = syncer.sync_once()
    assert [(e["version"], e["change"]) for e in second.events] == [(None, "added"), (1, "added")]
    assert (cache / "m/1/model.py").read_bytes() == b"1"

    store.version("m", 2, {"model.py": b"2"})
    assert syncer.sync_once().events == []
    assert not (cache / "m/2").exists()
    assert [(e["version"], e["change"]) for e in syncer.sync_once().events] == [(2, "added")]


def test_require_ready_marker_waits_for_the_marker(store: Store, make_syncer, cache):
    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": b"1"})
    syncer = make_syncer(require_ready_marker=True)
    for _ in range(3):
        assert syncer.sync_once().events == []
    store.put("m/1/.ready", b"")
    assert len(syncer.sync_once().events) == 2
    assert (cache / "m/1/model.py").exists()


def test_half_uploaded_version_is_not_taken(store: Store, make_syncer, cache):
    store.put("m/config.pbtxt", ONNX_CONFIG)
    store.version("m", 1, {"model.onnx": b"one"}, ready=True)
    syncer = make_syncer()
    syncer.sync_once()

    # The model file is not uploaded yet: stable, but incomplete.
    store.version("m", 2, {"extra.bin": b"x" * 100})
    for _ in range(4):
        result = syncer.sync_once()
        assert result.events == []
    assert "model file (model.onnx) is missing" in result.pending[0].reason
    assert not (cache / "m/2").exists()
    assert scan(cache)["m"].versions == [1]

    # Objects still changing between polls: never taken while they change.
    for i in range(4):
        store.put("m/2/model.onnx", b"chunk" * (i + 1))
        assert syncer.sync_once().events == []
        assert not (cache / "m/2").exists()
    result = syncer.sync_once()  # the upload ended: stable since the previous poll
    assert [(e["version"], e["change"]) for e in result.events] == [(2, "added")]
    assert (cache / "m/2/model.onnx").read_bytes() == b"chunk" * 4

    # A changed version being re-uploaded keeps its old copy until it settles.
    store.put("m/2/model.onnx", b"new")
    assert syncer.sync_once().events == []
    assert (cache / "m/2/model.onnx").read_bytes() == b"chunk" * 4


def test_removed_version_and_model_disappear_at_once(store: Store, make_syncer, cache):
    store.put("a/config.pbtxt", PY_CONFIG)
    store.version("a", 1, {"model.py": b"1"}, ready=True)
    store.version("a", 2, {"model.py": b"2"}, ready=True)
    store.put("b/config.pbtxt", PY_CONFIG)
    store.version("b", 1, {"model.py": b"b"}, ready=True)
    syncer = make_syncer(delete_delay_secs=0)
    syncer.sync_once()
    assert (cache / "a/1").is_dir() and (cache / "b/1").is_dir()

    store.delete_prefix("a/1/")
    store.delete_prefix("b/")
    result = syncer.sync_once()
    assert [(e["model"], e["version"], e["change"]) for e in result.events] == [
        ("b", 1, "removed"),  # vanished models first, then each model's own changes
        ("b", None, "removed"),
        ("a", 1, "removed"),
    ]
    assert not (cache / "a/1").exists() and (cache / "a/2/model.py").exists()
    assert not (cache / "b").exists()
    assert sorted(p.name for p in (cache / ".conch-sync-tmp").iterdir()) == []
    assert sorted(json.loads((cache / MANIFEST).read_text())["models"]) == ["a"]


ESCAPING = ["../evil", "/abs", "m/1/../../x", "m\\..\\x", "m/1/a\x00b", "m/1/a\x01b"]


@pytest.mark.parametrize("prefix", ["", "repo"])
def test_path_escaping_keys_are_refused_and_logged(
    s3, bucket: str, make_syncer, tmp_path: Path, cache: Path, prefix: str, caplog
):
    store = Store(s3, bucket, prefix)
    for key in [*ESCAPING, "m//1/x", "m/./1/x", " /1/model.py", "m/1/\u202egnp.py"]:
        store.put(key, b"evil")
    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": b"good"}, ready=True)
    before = {p for p in tmp_path.rglob("*")}

    caplog.set_level(logging.WARNING, logger="repo_sync")
    result = make_syncer(prefix).sync_once()

    assert [(e["model"], e["version"]) for e in result.events] == [("m", None), ("m", 1)]
    refused = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    for key in [*ESCAPING, "m//1/x", "m/./1/x", " /1/model.py", "m/1/\u202egnp.py"]:
        assert repr(key) in refused, key
    written = {p for p in tmp_path.rglob("*")} - before
    assert all(p.is_relative_to(cache) for p in written)
    assert tree_bytes(cache) == {"m/config.pbtxt": PY_CONFIG, "m/1/model.py": b"good"}
    assert not any(p.read_bytes() == b"evil" for p in tmp_path.rglob("*") if p.is_file())


# -- atomicity ----------------------------------------------------------------------------


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_readers_never_see_a_half_copied_version(
    store: Store, make_syncer, cache: Path, monkeypatch, exchange: bool
):
    """A reader scanning in a loop while the sync replaces a version again and again sees
    the old version or the new one, whole. With renameat2 it never even misses it; with
    the rename-aside fallback the folder may be absent for an instant, never partial."""
    if not exchange:
        monkeypatch.setattr(fsops, "exchange", lambda a, b: False)
    contents = [bytes([65 + i]) * (40_000 + 1000 * i) for i in range(8)]
    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": contents[0], "w.bin": contents[0]}, ready=True)
    syncer = make_syncer()
    syncer.sync_once()

    stop = threading.Event()
    problems: list[str] = []
    counts = {"scans": 0, "absent": 0}

    def reader() -> None:
        vdir = cache / "m" / "1"
        while not stop.is_set():
            counts["scans"] += 1
            if exchange:
                entry = scan(cache)["m"]
                if entry.error or entry.versions != [1]:
                    problems.append(f"scan: {entry.error or entry.versions}")
            try:
                fd = os.open(vdir, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                counts["absent"] += 1
                continue
            try:
                names = sorted(os.listdir(fd))
                if names != ["model.py", "w.bin"]:
                    problems.append(f"version 1 holds {names}")
                    continue
                for name in names:
                    f = os.open(name, os.O_RDONLY, dir_fd=fd)
                    with os.fdopen(f, "rb") as fh:
                        data = fh.read()
                    if data not in contents:
                        problems.append(f"{name} has {len(data)} unknown bytes")
            finally:
                os.close(fd)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for data in contents[1:]:
            store.version("m", 1, {"w.bin": data, "model.py": data}, ready=True)
            assert [e["change"] for e in syncer.sync_once().events] == ["changed"]
    finally:
        stop.set()
        thread.join()
    assert problems == []
    assert counts["scans"] > 5
    if exchange:
        assert counts["absent"] == 0
    assert (cache / "m/1/model.py").read_bytes() == contents[-1]
    old_copies = list((cache / ".conch-sync-tmp").iterdir())
    assert len(old_copies) == len(contents) - 1  # kept for readers, deleted after the delay
    syncer.close()
    assert list((cache / ".conch-sync-tmp").iterdir()) == []


# -- events -------------------------------------------------------------------------------


def _drain(pubsub, want: int, timeout: float = 5.0) -> list[dict]:
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        msg = pubsub.get_message(timeout=0.1)
        if msg and msg["type"] == "message":
            out.append(decode_event(msg["data"]))
    return out


def test_events_are_published_on_the_channel(store: Store, make_syncer, redis_url: str):
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(CHANNEL)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    start = int(client.get(GENERATION_KEY) or 0)

    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": b"1"}, ready=True)
    syncer = make_syncer(publisher=Publisher(redis_url))
    t0 = time.time()
    assert syncer.sync_once().generation == start + 1
    events = _drain(pubsub, 2)
    assert [(e["model"], e["version"], e["change"]) for e in events] == [
        ("m", None, "added"),
        ("m", 1, "added"),
    ]
    assert all(e["generation"] == start + 1 and t0 - 1 <= e["at"] <= time.time() for e in events)

    assert syncer.sync_once().events == []  # nothing changed: no event, same generation
    assert int(client.get(GENERATION_KEY)) == start + 1

    store.version("m", 1, {"model.py": b"one"}, ready=True)
    store.put("m/config.pbtxt", PY_CONFIG + b"# x\n")
    store.version("m", 2, {"model.py": b"2"}, ready=True)
    syncer.sync_once()
    assert [(e["version"], e["change"], e["generation"]) for e in _drain(pubsub, 3)] == [
        (None, "changed", start + 2),
        (1, "changed", start + 2),
        (2, "added", start + 2),
    ]

    store.delete_prefix("m/")
    syncer.sync_once()
    assert [(e["version"], e["change"]) for e in _drain(pubsub, 3)] == [
        (1, "removed"),
        (2, "removed"),
        (None, "removed"),
    ]
    assert int(client.get(GENERATION_KEY)) == start + 3
    assert _drain(pubsub, 1, timeout=0.3) == []
    pubsub.close()


def test_events_wait_for_redis_when_it_is_down(store: Store, make_syncer):
    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": b"1"}, ready=True)
    port = free_port()
    publisher = Publisher(f"redis://127.0.0.1:{port}/0")  # nothing listens there yet
    syncer = make_syncer(publisher=publisher)
    assert syncer.sync_once().generation is None
    assert (syncer.cache / "m/1/model.py").read_bytes() == b"1"  # the files still move
    assert publisher.backlog == 2

    server = start_private(port)  # Redis is back
    try:
        pubsub = redis.Redis.from_url(server.url).pubsub()
        pubsub.subscribe(CHANNEL)
        pubsub.get_message(timeout=2)
        assert syncer.sync_once().generation == 1
        assert [(e["version"], e["change"]) for e in _drain(pubsub, 2)] == [
            (None, "added"),
            (1, "added"),
        ]
        assert publisher.backlog == 0
        pubsub.close()
    finally:
        syncer.close()
        server.stop()


# -- the daemon and the command line --------------------------------------------------------


def test_daemon_takes_a_new_version_within_two_poll_intervals(store: Store, make_syncer, cache):
    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": b"1"}, ready=True)
    syncer = make_syncer(poll_secs=0.3)
    syncer.sync_once()
    stop = threading.Event()
    thread = threading.Thread(target=syncer.run, args=(stop,))
    thread.start()
    try:
        time.sleep(0.1)
        store.version("m", 2, {"model.py": b"2"})  # no marker: two stable polls
        uploaded = time.monotonic()
        while not (cache / "m/2/model.py").exists():
            assert time.monotonic() - uploaded < 5, "version 2 was not taken"
            time.sleep(0.02)
        took = time.monotonic() - uploaded
    finally:
        stop.set()
        thread.join()
    assert took <= 2 * 0.3 + 1.0, took


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run a command line with the test's AWS settings (no REDIS_URL), plus ``env``."""
    full_env = dict(os.environ)
    full_env.pop("REDIS_URL", None)
    full_env.update(env)
    return subprocess.run(args, env=full_env, capture_output=True, text=True, timeout=60)


def test_cli_once_with_the_usual_aws_settings(store: Store, s3_endpoint: str, tmp_path: Path):
    store.put("m/config.pbtxt", PY_CONFIG)
    store.version("m", 1, {"model.py": b"1"})  # no marker: --once polls twice
    store.version("m", 2, {"model.py": b"2"}, ready=True)
    cache = tmp_path / "from-module"
    done = _cli(
        *(sys.executable, "-m", "repo_sync", "--source", f"s3://{store.bucket}/repo"),
        *("--model-repository", str(cache), "--once", "--repository-poll-secs", "0.2"),
        AWS_ENDPOINT_URL=s3_endpoint,
    )
    assert done.returncode == 0, done.stderr
    assert tree_bytes(cache) == {
        "m/config.pbtxt": PY_CONFIG,
        "m/1/model.py": b"1",
        "m/2/model.py": b"2",
    }

    conch = shutil.which("conch", path=str(Path(sys.executable).parent))
    assert conch
    host = s3_endpoint.removeprefix("http://")
    cache2 = tmp_path / "from-conch"
    done = _cli(
        *(conch, "sync", "--source", f"s3://{host}/{store.bucket}/repo/"),  # Triton's form
        *("--model-repository", str(cache2), "--once", "--repository-poll-secs", "0.2"),
    )
    assert done.returncode == 0, done.stderr
    assert tree_bytes(cache2) == tree_bytes(cache)


def test_cli_daemon_syncs_publishes_and_stops_on_sigterm(
    store: Store, s3_endpoint: str, tmp_path: Path, redis_url: str
):
    cache = tmp_path / "daemon"
    pubsub = redis.Redis.from_url(redis_url).pubsub()
    pubsub.subscribe(CHANNEL)
    pubsub.get_message(timeout=2)
    env = dict(os.environ, AWS_ENDPOINT_URL_S3=s3_endpoint, REDIS_URL=redis_url)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "repo_sync", "--source", f"s3://{store.bucket}/repo"),
            *("--model-repository", str(cache), "--repository-poll-secs", "0.2"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        store.put("m/config.pbtxt", PY_CONFIG)
        store.version("m", 1, {"model.py": b"1"}, ready=True)
        events = _drain(pubsub, 2, timeout=20)
        assert [(e["model"], e["version"]) for e in events] == [("m", None), ("m", 1)]
        assert (cache / "m/1/model.py").read_bytes() == b"1"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
        pubsub.close()
    assert proc.returncode == 0, out
    assert "stopping" in out


def test_cli_refuses_a_folder_that_is_not_its_cache(store: Store, tmp_path: Path):
    (tmp_path / "served" / "other").mkdir(parents=True)
    done = _cli(
        *(sys.executable, "-m", "repo_sync", "--source", f"s3://{store.bucket}/repo"),
        *("--model-repository", str(tmp_path / "served"), "--once"),
    )
    assert done.returncode == 2
    assert "not a repo_sync cache" in done.stderr
    assert os.listdir(tmp_path / "served") == ["other"]  # nothing written


def test_cli_once_fails_when_the_bucket_is_missing(s3_endpoint: str, tmp_path: Path):
    done = _cli(
        *(sys.executable, "-m", "repo_sync", "--source", "s3://no-such-bucket-here/x"),
        *("--model-repository", str(tmp_path / "c"), "--once", "--s3-endpoint-url", s3_endpoint),
    )
    assert done.returncode == 1
    assert "NoSuchBucket" in done.stderr


# -- the local-folder source ----------------------------------------------------------------


def test_local_folder_source(tmp_path: Path, caplog):
    src, cache = tmp_path / "src", tmp_path / "cache"
    (src / "m" / "1").mkdir(parents=True)
    (src / "m" / "config.pbtxt").write_bytes(PY_CONFIG)
    (src / "m" / "1" / "model.py").write_bytes(b"one")
    (src / "m" / "1" / "data.bin").write_bytes(b"d" * 10)
    (src / "m" / "1" / "passwd").symlink_to("/etc/passwd")
    (src / "ens" / "1").mkdir(parents=True)  # an ensemble's empty version folder
    (src / "ens" / "config.pbtxt").write_bytes(b'platform: "ensemble"\n')
    caplog.set_level(logging.WARNING, logger="repo_sync")
    with Syncer(LocalSource(src), cache, options=SyncOptions(poll_secs=0.05)) as syncer:
        result = syncer.sync_settled()
        assert result.pending == [] and result.errors == []
        assert tree_bytes(cache) == {
            "m/config.pbtxt": PY_CONFIG,
            "ens/config.pbtxt": b'platform: "ensemble"\n',
            "m/1/model.py": b"one",
            "m/1/data.bin": b"d" * 10,
        }
        assert (cache / "ens/1").is_dir()
        assert not any(p.is_symlink() for p in cache.rglob("*"))
        assert "'m/1/passwd'" in caplog.text and "symbolic link" in caplog.text

        # Same size, new mtime: fetched again (once settled); unchanged file reused.
        (src / "m" / "1" / "model.py").write_bytes(b"ONE")
        assert syncer.sync_once().events == []
        result = syncer.sync_once()
        assert [(e["model"], e["version"], e["change"]) for e in result.events] == [
            ("m", 1, "changed")
        ]
        assert result.downloaded == 1 and result.reused == 1
        assert (cache / "m/1/model.py").read_bytes() == b"ONE"

        shutil.rmtree(src / "ens")
        assert [(e["model"], e["change"]) for e in syncer.sync_once().events] == [
            ("ens", "removed"),
            ("ens", "removed"),
        ]
        assert not (cache / "ens").exists()


# -- end to end: S3 -> conch sync -> workers and gateways in poll mode -------------------


def test_new_s3_version_goes_live_with_no_failed_request(
    s3_endpoint: str, store: Store, tmp_path: Path, redis_url: str
) -> None:
    """Upload version 2 while requests stream: it serves within two poll intervals, no
    request fails, every answer is version 1's or 2's; a half-uploaded version 3 is not
    taken, and a broken one leaves version 2 serving with the reason."""
    import numpy as np
    import tritonclient.http as httpclient

    from harness import Service, conch, start_gateway, start_worker, wait_model_ready, wait_until
    from models import offset_model

    poll = 1.0
    built = tmp_path / "built"
    for v, offset in ((1, 1.0), (2, 2.0)):
        offset_model(built / "offset", v, offset)
    store.put("offset/config.pbtxt", (built / "offset" / "config.pbtxt").read_bytes())
    store.version(
        "offset",
        1,
        {"model.onnx": (built / "offset" / "1" / "model.onnx").read_bytes()},
        ready=True,
    )
    db = redis_url.rsplit("/", 1)[0] + "/2"
    redis.Redis.from_url(db).flushdb()
    cache = tmp_path / "cache"
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    sync = Service(
        "sync",
        conch(
            "sync",
            "--source",
            f"s3://{store.bucket}/repo",
            "--model-repository",
            str(cache),
            "--repository-poll-secs",
            str(poll),
            "--redis-url",
            db,
        ),
        logs,
        env,
    )
    wait_until(
        lambda: (cache / "offset" / "1" / "model.onnx").is_file(), 30, "the first sync", sync
    )
    flags = ("--model-control-mode", "poll", "--repository-poll-secs", str(poll))
    worker = start_worker(cache, db, logs, *flags)
    gateway, url = start_gateway(cache, db, logs, *flags)
    answers: list[tuple[str, float]] = []
    failures: list[str] = []
    stop = threading.Event()

    def stream() -> None:
        client = httpclient.InferenceServerClient(url)
        x = httpclient.InferInput("X", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        while not stop.is_set():
            try:
                r = client.infer("offset", [x])
                answers.append((r.get_response()["model_version"], float(r.as_numpy("Y")[0, 0])))
            except Exception as exc:
                failures.append(str(exc))

    threads = [threading.Thread(target=stream) for _ in range(3)]
    try:
        wait_model_ready(url, "offset", 60, worker, gateway)
        for t in threads:
            t.start()
        time.sleep(1.0)
        store.version(
            "offset",
            2,
            {"model.onnx": (built / "offset" / "2" / "model.onnx").read_bytes()},
            ready=True,
        )
        uploaded = time.monotonic()
        wait_until(
            lambda: any(v == "2" for v, _ in answers[-3:]),
            30,
            "version 2 to serve",
            sync,
            worker,
            gateway,
        )
        took = time.monotonic() - uploaded
        # Half uploaded: no model file, no marker. Never taken.
        store.put("offset/3/notes.txt", b"the model file is still uploading")
        time.sleep(3 * poll)
        assert not (cache / "offset" / "3").exists()
        # Broken: complete by the marker, but the model file is garbage.
        store.version("offset", 3, {"model.onnx": b"not an onnx model"}, ready=True)
        wait_until(lambda: (cache / "offset" / "3").is_dir(), 30, "version 3 to be mirrored", sync)
        index = httpclient.InferenceServerClient(url)

        def broken_reported() -> bool:
            rows = index.get_model_repository_index()
            return any(r["name"] == "offset" and "3" in r.get("reason", "") for r in rows) or any(
                r["name"] == "offset" and r.get("version") == "3" and r.get("reason") for r in rows
            )

        wait_until(broken_reported, 30, "version 3's failure to be reported", worker)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        gateway.stop()
        worker.stop()
        sync.stop()
    assert not failures, failures[:3]
    assert took < 2 * poll, f"version 2 served {took:.1f} s after its upload: over two polls"
    assert {a for a in answers} <= {("1", 2.0), ("2", 3.0)}
    assert answers[-1] == ("2", 3.0)  # the broken version 3 never took over
