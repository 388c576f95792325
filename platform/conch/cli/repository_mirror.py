"""``--model-repository`` in object storage, as Triton takes it: mirrored into a local folder.

Triton reads ``s3://``, ``gs://`` and ``as://`` repositories itself. conch's roles read
folders only, so before a role starts, each repository given as a URL is mirrored into a
cache folder by repo_sync (the code behind ``conch sync``, the one path from object storage
to disk), and the role is given that folder instead:

- the first pass runs here, before the role starts, and a version still settling gets one
  more pass a second later; a bucket that cannot be listed (unreachable, unknown, no
  credentials) stops the start with a message naming the flag and the cause;
- in poll and explicit model control, a ``conch sync`` child then follows the bucket every
  ``--repository-poll-secs``: poll mode picks changes up from the folder as from any
  other, and an explicit load reads the folder as the bucket was at the last pass. The
  child dies with this process. With ``--model-control-mode none`` the first pass is all.

``conch serve`` mirrors once, in its own process, and its children get the folders. Each
cache folder is named for its URL under ``--model-repository-cache``; a second process on
the same host mirroring the same URL takes the next free one (repo_sync locks a cache).
Credentials come from the environment, as Triton's do (``AWS_*``; ``GOOGLE_APPLICATION_
CREDENTIALS``; ``AZURE_STORAGE_ACCOUNT`` and ``AZURE_STORAGE_KEY``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conch.settings import Settings, is_remote_repository

log = logging.getLogger("conch.cli")

# How long the first pass waits before looking again at versions still being uploaded.
SETTLE_SECS = 1.0
# Cache folders tried for one URL on one host (one per process mirroring it at once).
MAX_CACHES_PER_URL = 32


class MirrorError(RuntimeError):
    """A repository in object storage cannot be mirrored: the message says why."""


@dataclass(frozen=True)
class Mirrored:
    """A URL repository and the folder that holds it, with the process that follows it."""

    source: str
    folder: Path
    follower: subprocess.Popen | None


def cache_root(settings: Settings) -> Path:
    if settings.model_repository_cache:
        return Path(settings.model_repository_cache).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "conch" / "repositories"


def cache_name(source: str) -> str:
    """A folder name for ``source``: readable, and unique to it."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", source).strip("-")[:64]
    return f"{readable}-{hashlib.sha256(source.encode()).hexdigest()[:12]}"


def mirror(settings: Settings) -> tuple[Settings, list[Mirrored]]:
    """``settings`` with every URL repository replaced by its mirror's folder, and the
    mirrors; raises MirrorError for one that cannot be mirrored."""
    done: list[Mirrored] = []
    folders: list[Path | str] = []
    try:
        for spec in settings.model_repository:
            if is_remote_repository(spec):
                done.append(_mirror_one(str(spec), settings))
                folders.append(done[-1].folder)
            else:
                folders.append(spec)
    except BaseException:
        stop(done)
        raise
    return dataclasses.replace(settings, model_repository=tuple(folders)), done


def _mirror_one(source: str, settings: Settings) -> Mirrored:
    from repo_sync import CacheBusy, CacheError, Syncer, SyncOptions, open_source

    flag = f"--model-repository {source}"
    try:
        opened = open_source(source)
    except (ValueError, ImportError) as exc:
        raise MirrorError(f"{flag}: {exc}") from None
    root = cache_root(settings)
    syncer = None
    for n in range(MAX_CACHES_PER_URL):
        folder = root / (cache_name(source) + (f"-{n}" if n else ""))
        try:
            syncer = Syncer(opened, folder, options=SyncOptions(poll_secs=SETTLE_SECS))
            break
        except CacheBusy:
            continue
        except (CacheError, OSError) as exc:
            raise MirrorError(f"{flag}: its cache {folder}: {exc}") from None
    if syncer is None:
        raise MirrorError(f"{flag}: {MAX_CACHES_PER_URL} processes here mirror it already")
    with syncer:
        result = syncer.sync_settled()
    if not result.listed:
        cause = "; ".join(result.errors) or "it cannot be listed"
        raise MirrorError(f"{flag}: {cause}")
    log.info("%s: mirrored into %s", flag, folder)
    follower = None
    if settings.model_control_mode.follows_changes:
        follower = _follow(source, folder, settings)
    return Mirrored(source, folder, follower)


def _follow(source: str, folder: Path, settings: Settings) -> subprocess.Popen:
    """``conch sync`` following ``source`` into ``folder`` until this process ends."""
    from conch.devtools.processes import die_with_parent

    cmd = [sys.executable, "-m", "conch", "sync", "--source", source]
    cmd += ["--model-repository", str(folder)]
    cmd += ["--repository-poll-secs", str(settings.repository_poll_secs)]
    cmd += ["--log-verbose", str(settings.log_verbose)]
    if settings.redis_url:
        cmd += ["--redis-url", settings.redis_url]
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent
    )


def stop(mirrors: list[Mirrored]) -> None:
    """Stop the followers (they also die with this process)."""
    for m in mirrors:
        if m.follower is not None and m.follower.poll() is None:
            m.follower.terminate()
    for m in mirrors:
        if m.follower is not None:
            try:
                m.follower.wait(timeout=10)
            except subprocess.TimeoutExpired:
                m.follower.kill()
