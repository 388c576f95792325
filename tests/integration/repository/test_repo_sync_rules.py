"""repo_sync's rules, on an in-memory source and on local folders: completeness, refusals,
the cache's manifest and lock, delayed deletion, the atomic steps, the command line."""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import time
from pathlib import Path

import pytest

from repo_sync import fsops
from repo_sync.cli import byte_size
from repo_sync.cli import run as cli_run
from repo_sync.events import decode_event, make_event, publish_events
from repo_sync.sources import (
    Listing,
    LocalSource,
    ObjectChanged,
    ObjectInfo,
    S3Source,
    open_source,
)
from repo_sync.sync import (
    ANY_FILE,
    MANIFEST,
    SCRATCH,
    CacheError,
    SourceVersion,
    Syncer,
    SyncOptions,
    has_required,
    required_files,
)

PY_CONFIG = b'backend: "python"\n'


class DictSource:
    """An in-memory source: key -> (bytes, mtime). Its fetch can be told to fail."""

    description = "memory://test"

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, float]] = {}
        self.fail: set[str] = set()
        self.fetched: list[str] = []

    def put(self, key: str, data: bytes, mtime: float | None = None) -> None:
        self.objects[key] = (data, time.time() if mtime is None else mtime)

    def list(self) -> Listing:
        return Listing(
            {
                k: ObjectInfo(hashlib.md5(d).hexdigest(), len(d), m)
                for k, (d, m) in self.objects.items()
            }
        )

    def fetch(self, key: str, info: ObjectInfo, dest: Path, progress=None) -> None:
        self.fetched.append(key)
        if key in self.fail:
            raise ObjectChanged(f"{key} changed")
        with os.fdopen(fsops.new_file(dest), "wb") as f:
            f.write(self.objects[key][0])


@pytest.fixture()
def src() -> DictSource:
    return DictSource()


@pytest.fixture()
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def changes(result) -> list[tuple]:
    return [(e["model"], e["version"], e["change"]) for e in result.events]


# -- completeness -------------------------------------------------------------------------

# Every backend's default model file, in the backend table's order: what a model whose
# config names no backend may hold.
EVERY_DEFAULT = (
    "model.onnx",
    "model.pt",
    "model.plan",
    "model.py",
    "model.savedmodel",
    "model.xml",
    "xgboost.model",
)


@pytest.mark.parametrize(
    ("config", "required"),
    [
        (None, EVERY_DEFAULT),
        (b'platform: "onnxruntime_onnx"', ("model.onnx",)),
        (b'platform: "pytorch_libtorch"', ("model.pt",)),
        (b'backend: "python"', ("model.py",)),
        (b'platform: "tensorrt_plan"', ("model.plan",)),
        (b'platform: "tensorflow_graphdef"', ("model.graphdef",)),
        (b'backend: "tensorflow"', ("model.savedmodel", "model.graphdef")),
        (b'backend: "openvino"', ("model.xml",)),
        (b'backend: "onnxruntime" default_model_filename: "net.bin"', ("net.bin",)),
        (b"max_batch_size: 8", EVERY_DEFAULT),
        (b'backend: "fil"', ("xgboost.model",)),
        (
            b'backend: "fil" parameters { key: "model_type" value { string_value: "lightgbm" } }',
            ("model.txt",),
        ),
        (b'platform: "ensemble"', ()),
        (b'backend: "identity"', ()),  # its version is its folder: no file to wait for
        (b'backend: "somethingelse"', (ANY_FILE,)),
        (b"this is { not a config", (ANY_FILE,)),
        (b"\xff\xfe", (ANY_FILE,)),
    ],
)
def test_required_files(config, required):
    assert required_files("m", config) == required


def test_has_required():
    info = ObjectInfo("e", 1, 0.0)
    v = SourceVersion({"model.savedmodel/saved_model.pb": info, "x.txt": info})
    assert has_required(v, ("model.savedmodel",))
    assert not has_required(v, ("model.onnx",))
    assert has_required(v, ())
    assert has_required(v, (ANY_FILE,))
    assert not has_required(SourceVersion(), (ANY_FILE,))
    assert has_required(SourceVersion({"model.py": info}), ("model.onnx", "model.py"))


def test_a_marker_older_than_a_file_does_not_count(src: DictSource, cache: Path):
    src.put("m/config.pbtxt", PY_CONFIG)
    src.put("m/1/.ready", b"", mtime=100.0)
    src.put("m/1/model.py", b"x", mtime=101.0)  # written after the marker
    with Syncer(src, cache, options=SyncOptions(poll_secs=0)) as syncer:
        result = syncer.sync_once()
        assert result.events == []
        assert "settle" in result.pending[0].reason
        assert changes(syncer.sync_once()) == [("m", None, "added"), ("m", 1, "added")]


def test_strict_marker_mode_ignores_stability(src: DictSource, cache: Path):
    src.put("m/config.pbtxt", PY_CONFIG)
    src.put("m/1/model.py", b"x", mtime=100.0)
    options = SyncOptions(poll_secs=0, require_ready_marker=True)
    with Syncer(src, cache, options=options) as syncer:
        for _ in range(3):
            result = syncer.sync_once()
            assert result.events == [] and "marker" in result.pending[0].reason
        src.put("m/1/.ready", b"", mtime=99.0)  # older than the file: still not enough
        assert "older" in syncer.sync_once().pending[0].reason
        src.put("m/1/.ready", b"", mtime=100.0)
        assert len(syncer.sync_once().events) == 2


def test_an_ensemble_version_needs_no_model_file(src: DictSource, cache: Path):
    src.put("ens/config.pbtxt", b'platform: "ensemble"\n')
    src.put("ens/1/", b"")  # the folder marker S3 consoles create
    with Syncer(src, cache, options=SyncOptions(poll_secs=0)) as syncer:
        result = syncer.sync_settled()
        assert changes(result) == [("ens", None, "added"), ("ens", 1, "added")]
        assert (cache / "ens/1").is_dir() and list((cache / "ens/1").iterdir()) == []


def test_sync_settled_takes_stable_versions_in_a_second_pass(src: DictSource, cache: Path):
    src.put("m/config.pbtxt", PY_CONFIG)
    src.put("m/1/model.py", b"1")
    src.put("m/2/other.bin", b"2")  # no model file: left out, with a warning
    with Syncer(src, cache, options=SyncOptions(poll_secs=0.01)) as syncer:
        result = syncer.sync_settled()
    assert changes(result) == [("m", None, "added"), ("m", 1, "added")]
    assert [(p.version, p.reason) for p in result.pending] == [
        (2, "its model file (model.py) is missing")
    ]


# -- refusals -----------------------------------------------------------------------------


def test_oversized_objects_are_refused(src: DictSource, cache: Path, caplog):
    src.put("m/config.pbtxt", PY_CONFIG)
    src.put("m/1/model.py", b"x")
    src.put("m/1/huge.bin", b"h" * 2000)
    src.put("m/1/.ready", b"")
    src.put("n/1/model.py", b"n" * 2000)  # the model file itself: n never complete
    src.put("n/1/notes.txt", b"n")
    caplog.set_level(logging.WARNING, logger="repo_sync")
    options = SyncOptions(poll_secs=0, max_object_bytes=1000)
    with Syncer(src, cache, options=options) as syncer:
        syncer.sync_once()
        result = syncer.sync_once()
    assert "'m/1/huge.bin'" in caplog.text and "--max-object-bytes" in caplog.text
    assert not (cache / "m/1/huge.bin").exists() and (cache / "m/1/model.py").exists()
    assert not (cache / "n").exists()
    assert "missing" in result.pending[0].reason
    assert caplog.text.count("'m/1/huge.bin'") == 1  # warned once, not at every poll


def test_a_path_that_is_both_file_and_folder_is_refused(src: DictSource, cache: Path, caplog):
    src.put("m/config.pbtxt", PY_CONFIG)
    src.put("m/1/model.py", b"x")
    src.put("m/1/a", b"file")
    src.put("m/1/a/b", b"nested")
    src.put("m/1/.ready", b"")
    with Syncer(src, cache, options=SyncOptions(poll_secs=0)) as syncer:
        syncer.sync_once()
    assert "'m/1/a'" in caplog.text and "both a file and a folder" in caplog.text
    assert (cache / "m/1/a/b").read_bytes() == b"nested"


def test_local_source_refuses_links_and_special_files(tmp_path: Path, cache: Path, caplog):
    root = tmp_path / "src"
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.py").write_bytes(b"x")
    (root / "m" / "1" / "link").symlink_to("/etc/passwd")
    (root / "m" / "2").symlink_to(root / "m" / "1")
    os.mkfifo(root / "m" / "1" / "fifo")
    listing = LocalSource(root).list()
    assert sorted(listing.objects) == ["m/1/model.py"]
    assert sorted(listing.refused) == [
        ("m/1/fifo", "is not a regular file"),
        ("m/1/link", "is a symbolic link"),
        ("m/2", "is a symbolic link"),
    ]


def test_local_source_fetch_never_follows_a_link(tmp_path: Path):
    root = tmp_path / "src"
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.py").write_bytes(b"x")
    source = LocalSource(root)
    info = source.list().objects["m/1/model.py"]
    secret = tmp_path / "secret"
    secret.write_bytes(b"s")
    (root / "m" / "1" / "model.py").unlink()
    (root / "m" / "1" / "model.py").symlink_to(secret)  # swapped in after the listing
    with pytest.raises(ObjectChanged):
        source.fetch("m/1/model.py", info, tmp_path / "out")
    assert not (tmp_path / "out").exists() or (tmp_path / "out").read_bytes() == b""


# -- failures and the cache ---------------------------------------------------------------


def test_a_failed_download_keeps_the_old_version(src: DictSource, cache: Path):
    src.put("m/config.pbtxt", PY_CONFIG)
    src.put("m/1/model.py", b"old")
    src.put("m/1/.ready", b"")
    with Syncer(src, cache, options=SyncOptions(poll_secs=0)) as syncer:
        syncer.sync_once()
        src.put("m/1/model.py", b"new")
        src.put("m/1/.ready", b"")
        src.fail.add("m/1/model.py")
        result = syncer.sync_once()
        assert result.events == [] and "changed" in result.errors[0]
        assert (cache / "m/1/model.py").read_bytes() == b"old"
        assert [p.name for p in (cache / SCRATCH).iterdir()] == []  # the partial copy is gone
        src.fail.clear()
        assert changes(syncer.sync_once()) == [("m", 1, "changed")]
        assert (cache / "m/1/model.py").read_bytes() == b"new"


def test_a_folder_that_is_not_a_cache_is_refused(src: DictSource, cache: Path):
    (cache / "resnet").mkdir(parents=True)
    with pytest.raises(CacheError, match="not a repo_sync cache"):
        Syncer(src, cache)
    assert os.listdir(cache) == ["resnet"]


def test_one_syncer_per_cache(src: DictSource, cache: Path):
    with Syncer(src, cache), pytest.raises(CacheError, match="another process"):
        Syncer(src, cache)
    Syncer(src, cache).close()  # free again


def test_source_and_cache_must_not_overlap(tmp_path: Path):
    (tmp_path / "repo").mkdir()
    with pytest.raises(CacheError, match="overlap"):
        Syncer(LocalSource(tmp_path / "repo"), tmp_path / "repo" / "cache")
    with pytest.raises(CacheError, match="overlap"):
        Syncer(LocalSource(tmp_path), tmp_path / "x")


def test_restart_repairs_the_cache_from_its_manifest(src: DictSource, cache: Path):
    src.put("m/config.pbtxt", PY_CONFIG)
    for v in (1, 2):
        src.put(f"m/{v}/model.py", f"v{v}".encode())
        src.put(f"m/{v}/.ready", b"")
    options = SyncOptions(poll_secs=0)
    with Syncer(src, cache, options=options) as syncer:
        syncer.sync_once()
    (cache / "m/2/model.py").write_bytes(b"damaged!")  # another size
    (cache / "stray").mkdir()
    (cache / "m/7").mkdir()
    with Syncer(src, cache, options=options) as syncer:
        assert not (cache / "stray").exists() and not (cache / "m/7").exists()
        assert not (cache / "m/2").exists()
        src.fetched.clear()
        assert changes(syncer.sync_once()) == [("m", 2, "added")]
        assert src.fetched == ["m/2/model.py"]  # the config is read from the cache
    assert (cache / "m/2/model.py").read_bytes() == b"v2"


def test_old_copies_are_deleted_after_the_delay(src: DictSource, cache: Path):
    src.put("m/config.pbtxt", PY_CONFIG)
    src.put("m/1/model.py", b"a")
    src.put("m/1/.ready", b"")
    options = SyncOptions(poll_secs=0, delete_delay_secs=0.3)
    with Syncer(src, cache, options=options) as syncer:
        syncer.sync_once()
        src.put("m/1/model.py", b"b")
        src.put("m/1/.ready", b"")
        syncer.sync_once()
        old = list((cache / SCRATCH).iterdir())
        assert len(old) == 1 and (old[0] / "model.py").read_bytes() == b"a"
        syncer.sync_once()
        assert old[0].exists()  # a reader may still be in it
        time.sleep(0.35)
        syncer.sync_once()
        assert not old[0].exists()


def test_manifest_is_written_atomically_and_names_the_source(src: DictSource, cache: Path):
    with Syncer(src, cache) as syncer:
        syncer.sync_once()
    import json

    data = json.loads((cache / MANIFEST).read_text())
    assert data["format"] == 1 and data["source"] == "memory://test" and data["models"] == {}


# -- atomic steps -------------------------------------------------------------------------


def test_within_refuses_paths_outside_the_root(tmp_path: Path):
    assert fsops.within(tmp_path, "a/b") == tmp_path / "a" / "b"
    for rel in ("../x", "a/../../x", "/etc/passwd", "", "."):
        with pytest.raises(ValueError):
            fsops.within(tmp_path, rel)


@pytest.mark.parametrize("exchange", [True, False])
def test_put_dir_replaces_a_folder(tmp_path: Path, monkeypatch, exchange: bool):
    if not exchange:
        monkeypatch.setattr(fsops, "exchange", lambda a, b: False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    target = tmp_path / "1"
    for content in (b"one", b"two"):
        new = tmp_path / f"new-{content.decode()}"
        new.mkdir()
        (new / "model.py").write_bytes(content)
        old = fsops.put_dir(new, target, scratch)
        assert (target / "model.py").read_bytes() == content
        if content == b"one":
            assert old is None
        else:
            assert (old / "model.py").read_bytes() == b"one" and old.parent in (scratch, tmp_path)


def test_exchange_is_available_here(tmp_path: Path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").write_bytes(b"b")
    if not fsops.exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not supported on this file system")
    assert (tmp_path / "a").read_bytes() == b"b" and (tmp_path / "b").is_dir()


# -- command line, sources, events ---------------------------------------------------------


def test_byte_sizes():
    assert byte_size("1048576") == 1 << 20
    assert byte_size("512M") == 512 << 20
    assert byte_size("64G") == 64 << 30
    assert byte_size("2GiB") == 2 << 30
    with pytest.raises(argparse.ArgumentTypeError):
        byte_size("lots")


def test_open_source_forms(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s = open_source("s3://bucket/some/prefix/")
    assert isinstance(s, S3Source) and (s.bucket, s.prefix) == ("bucket", "some/prefix/")
    s = open_source("s3://bucket")
    assert (s.bucket, s.prefix) == ("bucket", "")
    s = open_source("s3://minio.local:9000/bucket/p")
    assert (s.bucket, s.prefix) == ("bucket", "p/")
    assert s.client.meta.endpoint_url == "http://minio.local:9000"
    s = open_source("s3://bucket/p", endpoint_url="http://127.0.0.1:9")
    assert s.client.meta.endpoint_url == "http://127.0.0.1:9"
    assert open_source(str(tmp_path)).root == tmp_path
    assert open_source(f"file://{tmp_path}").root == tmp_path
    with pytest.raises(ValueError):
        open_source("ftp://bucket/x")
    with pytest.raises(ValueError):
        open_source("s3://")
    with pytest.raises(ValueError):
        open_source("s3://h:9000/b/p", endpoint_url="http://other")


def test_conch_cli_has_the_sync_subcommand(tmp_path: Path):
    from conch.cli import parser

    args = parser().parse_args(
        [
            *("sync", "--source", "s3://b/p", "--model-repository", str(tmp_path), "--once"),
            *("--repository-poll-secs", "0.5", "--max-object-bytes", "1G"),
        ]
    )
    assert (args.command, args.source, args.once) == ("sync", "s3://b/p", True)
    assert args.repository_poll_secs == 0.5 and args.max_object_bytes == 1 << 30
    args.source = ""
    assert cli_run(args) == 2  # --once with nothing to sync


def test_events():
    e = make_event("m", 3, "added", at=5.0)
    assert e == {"model": "m", "version": 3, "change": "added", "at": 5.0}
    with pytest.raises(ValueError):
        make_event("m", 3, "renamed")
    assert decode_event(b'{"model": "m", "version": null, "change": "removed", "at": 1}')
    with pytest.raises(ValueError):
        decode_event(b'{"hello": 1}')


def test_publish_events(rclient):
    from repo_sync.events import CHANNEL, GENERATION_KEY, read_generation

    pubsub = rclient.pubsub()
    pubsub.subscribe(CHANNEL)
    pubsub.get_message(timeout=2)
    before = read_generation(rclient)
    generation = publish_events(
        rclient, [make_event("m", 1, "added"), make_event("m", None, "changed")]
    )
    assert generation == before + 1 == int(rclient.get(GENERATION_KEY))
    got = []
    while len(got) < 2:
        msg = pubsub.get_message(timeout=2)
        assert msg is not None
        if msg["type"] == "message":
            got.append(decode_event(msg["data"]))
    assert [(g["version"], g["generation"]) for g in got] == [(1, generation), (None, generation)]
    pubsub.close()
