"""One sync pass, and the loop around it: mirror a source repository into the cache.

See the package docstring (``repo_sync/__init__.py``) for the rules: when a version is
taken, what is refused, how the cache changes atomically, and the events published.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conch.core.repository_keys import (
    IGNORED,
    MODEL_FILE,
    READY,
    VERSION_FILE,
    RefusedKey,
    classify,
    is_model_name,
)

from . import fsops
from .events import Publisher, make_event
from .sources import LocalSource, ObjectInfo, Source, SourceError

log = logging.getLogger("repo_sync")

MANIFEST = ".conch-sync.json"
SCRATCH = ".conch-sync-tmp"
LOCK = ".conch-sync.lock"
MANIFEST_FORMAT = 1
CONFIG_FILE = "config.pbtxt"
ANY_FILE = "*"
MAX_CONFIG_BYTES = 4 << 20
DISK_RESERVE_BYTES = 64 << 20  # left free on the cache's file system


class CacheError(RuntimeError):
    """The cache folder cannot be used (not ours, or already synced by another process)."""


class CacheBusy(CacheError):
    """The cache folder is being synced by another process (which holds its lock)."""


@dataclass
class SyncOptions:
    poll_secs: float = 15.0
    require_ready_marker: bool = False
    max_object_bytes: int = 64 << 30
    download_threads: int = 4
    # Old copies of replaced or removed versions are deleted this long after they left the
    # repository: a reader that opened one just before the swap can finish reading it.
    delete_delay_secs: float = 30.0
    progress: bool = False  # a tqdm bar of the bytes downloaded, on stderr


@dataclass
class SourceVersion:
    files: dict[str, ObjectInfo] = field(default_factory=dict)  # path in the version folder
    ready: ObjectInfo | None = None

    def record(self) -> dict[str, list]:
        """What the manifest keeps: path -> [etag, size]."""
        return {rel: [i.etag, i.size] for rel, i in sorted(self.files.items())}


@dataclass
class SourceModel:
    files: dict[str, ObjectInfo] = field(default_factory=dict)  # model-level files
    versions: dict[int, SourceVersion] = field(default_factory=dict)


@dataclass
class Pending:
    model: str
    version: int
    reason: str


@dataclass
class PassResult:
    events: list[dict] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    listed: bool = False  # False when the source could not be listed
    downloaded: int = 0
    downloaded_bytes: int = 0
    reused: int = 0
    generation: int | None = None

    @property
    def changed(self) -> bool:
        return bool(self.events)


def required_files(model: str, config_text: bytes | None) -> tuple[str, ...]:
    """The model file names of which a version needs one, from the model's config.

    ``()`` for an ensemble or an identity model (they have none); ``("*",)`` when the
    config cannot tell (then any file will do); else the config's ``default_model_filename``, or the default file name
    of its platform/backend, or, with neither, any backend's default file name (the
    config is auto-completed from whichever model file is there)."""
    from conch.core.backend_table import BACKENDS, backend_name_for, model_filename
    from conch.core.ensemble_graph import ENSEMBLE
    from conch.core.errors import ModelLoadError
    from conch.core.model_config import parse_config

    any_default = tuple(e.default_filename for e in BACKENDS.values() if e.default_filename)
    if config_text is None:
        return any_default
    try:
        cfg = parse_config(
            config_text.decode("utf-8"), model=model, source=f"{model}/{CONFIG_FILE}"
        )
    except (UnicodeDecodeError, ModelLoadError) as exc:
        log.warning("model '%s': %s; any file counts as its model file", model, exc)
        return (ANY_FILE,)
    if ENSEMBLE in (cfg.platform, cfg.backend):
        return ()
    if cfg.default_model_filename:
        return (cfg.default_model_filename,)
    if cfg.platform or cfg.backend:
        try:
            cfg.backend = backend_name_for(cfg.platform, cfg.backend)
            per_platform = BACKENDS[cfg.backend].platform_filenames
            if per_platform and not cfg.platform:  # TensorFlow: either platform's file
                return tuple(f for _, f in per_platform)
            filename = model_filename(cfg)
            return (filename,) if filename else ()  # identity's version is its folder
        except ModelLoadError:
            return (ANY_FILE,)
    return any_default


def has_required(version: SourceVersion, required: tuple[str, ...]) -> bool:
    if not required:
        return True
    for name in required:
        if name == ANY_FILE:
            if version.files:
                return True
        elif name in version.files or any(k.startswith(name + "/") for k in version.files):
            return True  # a file, or a folder (model.savedmodel/...)
    return False


class Syncer:
    """Mirrors ``source`` into the folder ``cache``; one ``sync_once()`` per poll.

    Holds an exclusive lock on the cache while open: use it as a context manager or call
    ``close()``."""

    def __init__(
        self,
        source: Source,
        cache: Path,
        *,
        options: SyncOptions | None = None,
        publisher: Publisher | None = None,
    ) -> None:
        self.source = source
        self.cache = Path(cache).absolute()
        self.options = options or SyncOptions()
        self.publisher = publisher or Publisher(None)
        self.scratch = self.cache / SCRATCH
        self.models: dict[str, dict[str, Any]] = {}  # the manifest: what the cache holds
        self.stats: Counter[str] = Counter()
        self._seen: dict[tuple[str, int], dict] = {}  # listing of pending versions, last poll
        self._told: dict[tuple[str, int], str] = {}  # pending reason last logged
        self._configs: dict[str, tuple[str, bytes | None, tuple[str, ...]]] = {}
        self._warned: set[tuple[str, str]] = set()
        self._dirty = False
        self._trash: list[tuple[float, Path]] = []  # (delete after, old copy in scratch)
        self._lock_fd: int | None = None
        if isinstance(source, LocalSource):
            a, b = os.path.realpath(source.root), os.path.realpath(self.cache)
            if os.path.commonpath([a, b]) in (a, b):
                raise CacheError(f"the source {a} and the cache {b} overlap")
        self._open()

    # -- the cache ------------------------------------------------------------------------

    def _open(self) -> None:
        self.cache.mkdir(parents=True, exist_ok=True)
        if not (self.cache / MANIFEST).exists():  # checked before anything is written
            others = sorted(p.name for p in self.cache.iterdir() if not p.name.startswith("."))
            if others:
                raise CacheError(
                    f"{self.cache} holds {others[:5]} but no {MANIFEST}: it is not a repo_sync "
                    "cache; give an empty or new folder"
                )
        fd = os.open(self.cache / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise CacheBusy(f"{self.cache} is being synced by another process") from None
        self._lock_fd = fd
        try:
            if self.scratch.exists():
                fsops.remove_tree(self.scratch)
            self.scratch.mkdir()
            self._load_manifest()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._purge(everything=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.publisher.close()

    def __enter__(self) -> Syncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _load_manifest(self) -> None:
        path = self.cache / MANIFEST
        if not path.exists():
            self.models = {}
            self._dirty = True
            self._save()
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("models"), dict):
                raise ValueError(f"format {data.get('format')!r}")
        except (OSError, ValueError) as exc:
            raise CacheError(f"cannot read {path}: {exc}") from None
        if data.get("source") and data["source"] != self.source.description:
            log.info(
                "cache %s was synced from %s; now syncing it from %s",
                self.cache,
                data["source"],
                self.source.description,
            )
        self.models = data["models"]
        self._reconcile()

    def _reconcile(self) -> None:
        """Make the manifest and the folders agree after a restart: drop records of what is
        gone or damaged, delete what no record describes (left by a crash)."""
        for name in list(self.models):
            mdir = self.cache / name
            rec = self.models[name]
            if not is_model_name(name) or not mdir.is_dir() or mdir.is_symlink():
                del self.models[name]
                self._dirty = True
                continue
            rec.setdefault("files", {})
            rec.setdefault("versions", {})
            for fname, (_etag, size) in list(rec["files"].items()):
                if not _recorded_ok(mdir, fname, size):
                    del rec["files"][fname]
                    self._dirty = True
            for v, files in list(rec["versions"].items()):
                vdir = mdir / v
                if not vdir.is_dir() or not all(
                    _recorded_ok(vdir, rel, size) for rel, (_etag, size) in files.items()
                ):
                    log.warning(
                        "cache: %s version %s is damaged; it will be fetched again", name, v
                    )
                    del rec["versions"][v]
                    self._dirty = True
            for child in mdir.iterdir():
                if child.name not in rec["files"] and child.name not in rec["versions"]:
                    log.warning("cache: removing %s (no record of it)", child)
                    self._dispose(fsops.set_aside(child, self.scratch))
        for child in self.cache.iterdir():
            if not child.name.startswith(".") and child.name not in self.models:
                log.warning("cache: removing %s (no record of it)", child)
                self._dispose(fsops.set_aside(child, self.scratch))
        self._save()

    def _dispose(self, old: Path | None) -> None:
        """Delete an old copy that was set aside, now or after the grace period."""
        if old is None:
            return
        if self.options.delete_delay_secs <= 0:
            fsops.remove_tree(old)
        else:
            self._trash.append((time.monotonic() + self.options.delete_delay_secs, old))

    def _purge(self, everything: bool = False) -> None:
        now = time.monotonic()
        keep = []
        for due, old in self._trash:
            if everything or due <= now:
                try:
                    fsops.remove_tree(old)
                except OSError as exc:
                    log.warning("cannot delete the old copy %s: %s", old, exc)
            else:
                keep.append((due, old))
        self._trash = keep

    def _save(self) -> None:
        if not self._dirty:
            return
        manifest = {
            "format": MANIFEST_FORMAT,
            "source": self.source.description,
            "saved_at": time.time(),
            "models": self.models,
        }
        fsops.put_json(manifest, self.cache / MANIFEST, self.scratch)
        self._dirty = False

    # -- a pass ---------------------------------------------------------------------------

    def sync_once(self) -> PassResult:
        """List the source once and bring the cache up to date with what is complete."""
        result = PassResult()
        self._purge()
        try:
            listing = self.source.list()
        except SourceError as exc:
            log.error("%s", exc)
            result.errors.append(str(exc))
            return result
        result.listed = True
        tree = self._tree(listing)
        bar = self._progress_bar()
        progress = bar.update if bar is not None else None
        try:
            for name in sorted(set(self.models) - set(tree)):
                self._remove_model(name, result)
            for name in sorted(tree):
                try:
                    self._sync_model(name, tree[name], result, progress)
                except Exception as exc:  # one model must not stop the others' sync
                    log.exception("sync of model %s failed", name)
                    result.errors.append(f"model {name}: {exc}")
        finally:
            if bar is not None:
                bar.close()
            self._save()
        self._seen = {
            k: v for k, v in self._seen.items() if k[0] in tree and k[1] in tree[k[0]].versions
        }
        self._told = {k: v for k, v in self._told.items() if k in self._seen}
        for name in set(self._configs) - set(tree):
            del self._configs[name]
        if result.events or self.publisher.backlog:
            result.generation = self.publisher.publish(result.events)
        self.stats["passes"] += 1
        self.stats["downloaded"] += result.downloaded
        self.stats["downloaded_bytes"] += result.downloaded_bytes
        self.stats["reused"] += result.reused
        level = logging.INFO if result.events or result.downloaded else logging.DEBUG
        log.log(
            level,
            "sync %s: %d change(s), %d object(s) downloaded (%d bytes), %d reused, "
            "%d version(s) pending",
            self.source.description,
            len(result.events),
            result.downloaded,
            result.downloaded_bytes,
            result.reused,
            len(result.pending),
        )
        return result

    def sync_settled(self) -> PassResult:
        """``--once``: a pass, and when versions wait to settle, one more a poll later."""
        result = self.sync_once()
        if result.listed and result.pending:
            time.sleep(self.options.poll_secs)
            second = self.sync_once()
            second.events = result.events + second.events
            second.downloaded += result.downloaded
            second.downloaded_bytes += result.downloaded_bytes
            second.reused += result.reused
            result = second
        for p in result.pending:
            log.warning("not taken: %s version %d: %s", p.model, p.version, p.reason)
        return result

    def run(self, stop: threading.Event | None = None) -> None:
        """Poll until ``stop`` is set; a failed pass is logged and the next one tried."""
        stop = stop or threading.Event()
        log.info(
            "syncing %s into %s every %gs",
            self.source.description,
            self.cache,
            self.options.poll_secs,
        )
        while not stop.is_set():
            try:
                self.sync_once()
            except Exception:
                log.exception("sync pass failed")
            stop.wait(self.options.poll_secs)

    def _progress_bar(self) -> Any:
        if not self.options.progress:
            return None
        from tqdm import tqdm

        return tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc="sync", leave=False)

    # -- reading the listing --------------------------------------------------------------

    def _refuse(self, key: str, reason: str) -> None:
        self.stats["refused"] += 1
        if (key, reason) in self._warned:
            log.debug("refused object %r: %s", key, reason)
            return
        self._warned.add((key, reason))
        log.warning(
            "refused object %r in %s: %s; not written", key, self.source.description, reason
        )

    def _tree(self, listing: Any) -> dict[str, SourceModel]:
        tree: dict[str, SourceModel] = {}
        for key, reason in listing.refused:
            self._refuse(key, reason)
        for key, info in sorted(listing.objects.items()):
            try:
                place = classify(key)
            except RefusedKey as exc:
                self._refuse(key, exc.reason)
                continue
            if place.kind == IGNORED:
                if (key, "ignored") not in self._warned:
                    self._warned.add((key, "ignored"))
                    log.debug("ignoring object %r: %s", key, place.why)
                continue
            if (
                place.kind in (MODEL_FILE, VERSION_FILE)
                and info.size > self.options.max_object_bytes
            ):
                self._refuse(
                    key,
                    f"{info.size} bytes, over --max-object-bytes {self.options.max_object_bytes}",
                )
                continue
            model = tree.setdefault(place.model, SourceModel())
            if place.kind == MODEL_FILE:
                model.files[place.path] = info
                continue
            assert place.version is not None
            version = model.versions.setdefault(place.version, SourceVersion())
            if place.kind == READY:
                version.ready = info
            elif place.kind == VERSION_FILE:
                version.files[place.path] = info
        for name, model in tree.items():
            for v, version in model.versions.items():
                folders = {
                    rel.rsplit("/", i)[0]
                    for rel in version.files
                    for i in range(1, rel.count("/") + 1)
                }
                for rel in sorted(folders & set(version.files)):
                    self._refuse(f"{name}/{v}/{rel}", "is both a file and a folder")
                    del version.files[rel]
        return tree

    def _required(
        self, name: str, model: SourceModel, result: PassResult
    ) -> tuple[str, ...] | None:
        """What a version of this model needs (see ``required_files``); None if the config
        could not be read this pass."""
        info = model.files.get(CONFIG_FILE)
        if info is None:
            self._configs.pop(name, None)
            return required_files(name, None)
        cached = self._configs.get(name)
        if cached is not None and cached[0] == info.etag:
            return cached[2]
        data: bytes | None = None
        local: bytes | None = None
        rec = self.models.get(name)
        if rec is not None and rec["files"].get(CONFIG_FILE) == [info.etag, info.size]:
            with contextlib.suppress(OSError):  # the cached copy is that very object
                local = (self.cache / name / CONFIG_FILE).read_bytes()
        if local is not None and len(local) == info.size:
            data = local
            required = required_files(name, data)
        elif info.size <= MAX_CONFIG_BYTES:
            tmp = fsops.unique(self.scratch, "config")
            try:
                self.source.fetch(f"{name}/{CONFIG_FILE}", info, tmp)
                data = tmp.read_bytes()
                result.downloaded += 1
                result.downloaded_bytes += info.size
            except (SourceError, OSError) as exc:
                log.warning("model '%s': cannot read %s: %s", name, CONFIG_FILE, exc)
                return None
            finally:
                tmp.unlink(missing_ok=True)
            required = required_files(name, data)
        else:
            required = (ANY_FILE,)
        self._configs[name] = (info.etag, data, required)
        return required

    def _complete(
        self,
        name: str,
        v: int,
        version: SourceVersion,
        record: dict,
        required: tuple[str, ...] | None,
    ) -> tuple[bool, str]:
        note = ""
        if version.ready is not None:
            newest = max((i.mtime for i in version.files.values()), default=0.0)
            if newest <= version.ready.mtime:
                return True, "its .ready marker is there"
            note = "its .ready marker is older than some of its files"
        if self.options.require_ready_marker:
            return False, note or "waiting for its .ready marker"
        key = (name, v)
        previous = self._seen.get(key)
        self._seen[key] = record
        if previous != record:
            return False, "new or changed since the previous poll; waiting for it to settle"
        if required is None:
            return False, f"its model's {CONFIG_FILE} could not be read"
        if not has_required(version, required):
            return False, f"its model file ({' or '.join(required)}) is missing"
        return True, "unchanged across two polls"

    def _pending(self, result: PassResult, name: str, v: int, reason: str) -> None:
        result.pending.append(Pending(name, v, reason))
        if self._told.get((name, v)) != reason:
            self._told[(name, v)] = reason
            log.info("%s version %d not taken yet: %s", name, v, reason)

    # -- changing the cache ---------------------------------------------------------------

    def _sync_model(
        self, name: str, model: SourceModel, result: PassResult, progress: Callable | None
    ) -> None:
        rec = self.models.get(name)
        required = self._required(name, model, result)
        takes: dict[int, SourceVersion] = {}
        for v in sorted(model.versions):
            version = model.versions[v]
            record = version.record()
            if rec is not None and rec["versions"].get(str(v)) == record:
                self._seen.pop((name, v), None)
                continue
            ok, why = self._complete(name, v, version, record, required)
            if ok:
                log.info("taking %s version %d: %s", name, v, why)
                takes[v] = version
            else:
                self._pending(result, name, v, why)
        if rec is None:
            if takes:
                self._add_model(name, model, takes, result, progress)
            return
        for v in sorted(int(x) for x in rec["versions"] if int(x) not in model.versions):
            self._remove_version(name, v, result)
        self._update_model_files(name, model, rec, result)
        for v, version in takes.items():
            self._put_version(name, v, version, rec, result, progress)

    def _failed(self, result: PassResult, what: str, exc: BaseException) -> None:
        log.warning("%s failed: %s; the cache keeps what it had", what, exc)
        result.errors.append(f"{what}: {exc}")

    def _add_model(
        self,
        name: str,
        model: SourceModel,
        takes: dict[int, SourceVersion],
        result: PassResult,
        progress: Callable | None,
    ) -> None:
        """A new model: its folder is built whole in the scratch area and renamed in."""
        tmp = fsops.unique(self.scratch, f"model-{name}")
        try:
            tmp.mkdir()
            files = {}
            for fname, info in sorted(model.files.items()):
                self._fetch_model_file(name, fname, info, tmp / fname, result)
                files[fname] = [info.etag, info.size]
            versions = {}
            for v, version in sorted(takes.items()):
                try:
                    self._build_version(tmp / str(v), name, v, version, None, result, progress)
                except (SourceError, OSError) as exc:
                    fsops.remove_tree(tmp / str(v))
                    self._seen.pop((name, v), None)
                    self._failed(result, f"fetching {name} version {v}", exc)
                    continue
                versions[str(v)] = version.record()
            if not versions:
                fsops.remove_tree(tmp)
                return
            self._dispose(fsops.put_dir(tmp, self.cache / name, self.scratch))
        except (SourceError, OSError) as exc:
            fsops.remove_tree(tmp)
            for v in takes:
                self._seen.pop((name, v), None)
            self._failed(result, f"adding model {name}", exc)
            return
        self.models[name] = {"files": files, "versions": versions}
        self._dirty = True
        result.events.append(make_event(name, None, "added"))
        result.events.extend(make_event(name, int(v), "added") for v in versions)

    def _update_model_files(
        self, name: str, model: SourceModel, rec: dict, result: PassResult
    ) -> None:
        mdir = self.cache / name
        changed = False
        for fname, info in sorted(model.files.items()):
            want = [info.etag, info.size]
            if rec["files"].get(fname) == want:
                continue
            tmp = fsops.unique(self.scratch, "file")
            try:
                self._fetch_model_file(name, fname, info, tmp, result)
                os.replace(tmp, mdir / fname)
            except (SourceError, OSError) as exc:
                tmp.unlink(missing_ok=True)
                self._failed(result, f"fetching {name}/{fname}", exc)
                continue
            rec["files"][fname] = want
            changed = True
        for fname in sorted(set(rec["files"]) - set(model.files)):
            try:
                (mdir / fname).unlink(missing_ok=True)
            except OSError as exc:
                self._failed(result, f"removing {name}/{fname}", exc)
                continue
            del rec["files"][fname]
            changed = True
        if changed:
            self._dirty = True
            result.events.append(make_event(name, None, "changed"))

    def _fetch_model_file(
        self, name: str, fname: str, info: ObjectInfo, dest: Path, result: PassResult
    ) -> None:
        cached = self._configs.get(name)
        if fname == CONFIG_FILE and cached and cached[0] == info.etag and cached[1] is not None:
            with os.fdopen(fsops.new_file(dest), "wb") as f:
                f.write(cached[1])
            return
        self.source.fetch(f"{name}/{fname}", info, dest)
        result.downloaded += 1
        result.downloaded_bytes += info.size

    def _put_version(
        self,
        name: str,
        v: int,
        version: SourceVersion,
        rec: dict,
        result: PassResult,
        progress: Callable | None,
    ) -> None:
        target = self.cache / name / str(v)
        old = rec["versions"].get(str(v))
        tmp = fsops.unique(self.scratch, f"version-{name}-{v}")
        try:
            self._build_version(tmp, name, v, version, (target, old), result, progress)
            self._dispose(fsops.put_dir(tmp, target, self.scratch))
        except (SourceError, OSError) as exc:
            fsops.remove_tree(tmp)
            self._seen.pop((name, v), None)
            self._failed(result, f"fetching {name} version {v}", exc)
            return
        rec["versions"][str(v)] = version.record()
        self._dirty = True
        result.events.append(make_event(name, v, "added" if old is None else "changed"))

    def _build_version(
        self,
        tmp: Path,
        name: str,
        v: int,
        version: SourceVersion,
        current: tuple[Path, dict | None] | None,
        result: PassResult,
        progress: Callable | None,
    ) -> None:
        """Fill the new folder ``tmp``: files unchanged since the cached copy ``current`` are
        hard-linked from it, the others downloaded."""
        tmp.mkdir()
        jobs: list[tuple[str, ObjectInfo, Path]] = []
        reused = 0
        for rel, info in sorted(version.files.items()):
            dest = fsops.within(tmp, rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if current is not None and current[1] and current[1].get(rel) == [info.etag, info.size]:
                src = fsops.within(current[0], rel)
                if _is_file_of_size(src, info.size):
                    fsops.link_or_copy(src, dest)
                    reused += 1
                    continue
            jobs.append((f"{name}/{v}/{rel}", info, dest))
        need = sum(info.size for _, info, _ in jobs)
        free = shutil.disk_usage(self.cache).free
        if need + DISK_RESERVE_BYTES > free:
            raise OSError(errno.ENOSPC, f"{need} bytes to download, {free} free in {self.cache}")
        if len(jobs) > 1 and self.options.download_threads > 1:
            with ThreadPoolExecutor(min(self.options.download_threads, len(jobs))) as pool:
                futures = [pool.submit(self.source.fetch, *job, progress) for job in jobs]
                _, not_done = wait(futures, return_when=FIRST_EXCEPTION)
                for fut in not_done:
                    fut.cancel()  # the first failure ends the version's download
                for fut in futures:
                    if not fut.cancelled():
                        fut.result()
        else:
            for key, info, dest in jobs:
                self.source.fetch(key, info, dest, progress)
        result.downloaded += len(jobs)
        result.downloaded_bytes += need
        result.reused += reused

    def _remove_version(self, name: str, v: int, result: PassResult) -> None:
        vdir = self.cache / name / str(v)
        try:
            if vdir.exists():
                self._dispose(fsops.set_aside(vdir, self.scratch))
        except OSError as exc:
            self._failed(result, f"removing {name} version {v}", exc)
            return
        del self.models[name]["versions"][str(v)]
        self._dirty = True
        result.events.append(make_event(name, v, "removed"))

    def _remove_model(self, name: str, result: PassResult) -> None:
        mdir = self.cache / name
        try:
            if mdir.exists():
                self._dispose(fsops.set_aside(mdir, self.scratch))
        except OSError as exc:
            self._failed(result, f"removing model {name}", exc)
            return
        rec = self.models.pop(name)
        self._dirty = True
        self._configs.pop(name, None)
        result.events.extend(
            make_event(name, v, "removed") for v in sorted(int(x) for x in rec["versions"])
        )
        result.events.append(make_event(name, None, "removed"))


def _is_file_of_size(path: Path, size: int) -> bool:
    with contextlib.suppress(OSError):
        st = path.lstat()
        return stat.S_ISREG(st.st_mode) and st.st_size == size
    return False


def _recorded_ok(root: Path, rel: str, size: int) -> bool:
    """A manifest entry still matches the file on disk (and names a path inside root)."""
    try:
        return _is_file_of_size(fsops.within(root, rel), size)
    except (ValueError, TypeError):
        return False


__all__ = [
    "ANY_FILE",
    "CONFIG_FILE",
    "MANIFEST",
    "SCRATCH",
    "CacheError",
    "PassResult",
    "Pending",
    "SourceModel",
    "SourceVersion",
    "SyncOptions",
    "Syncer",
    "has_required",
    "required_files",
]
