"""Triton's server repository, read from a checkout the user already has: nothing is fetched.

``TRITON_SERVER_REPO`` names either a work tree (its files are copied as they are) or a git
directory, bare or not, read at ``TRITON_SERVER_REF`` with ``git archive``. Only the paths
the chosen cases need are taken out, into the run's scratch folder, never into conch's tree:
conch keeps none of Triton's files.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

UPSTREAM = "https://github.com/triton-inference-server/server"


class SourceError(RuntimeError):
    """No usable checkout; the message says how to get one."""


def how_to_get(where: str) -> str:
    """What to run when there is no checkout at ``where``."""
    return (
        f"no checkout of triton-inference-server/server at {where}. Get one with\n"
        f"  git clone --depth 1 {UPSTREAM} {where}\n"
        "or point TRITON_SERVER_REPO at a work tree or a git directory (bare too; "
        "TRITON_SERVER_REF picks the commit, HEAD by default)."
    )


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], capture_output=True, check=False)


@dataclass(frozen=True)
class TritonSource:
    """A checkout: a work tree (``ref`` None) or a git directory read at ``ref``."""

    path: Path
    ref: str | None
    commit: str  # the commit read (a work tree's HEAD), or "unknown" for plain files

    def extract(self, paths: Iterable[str], dest: Path) -> None:
        """Copy ``paths`` (relative to the repository's root) under ``dest``."""
        paths = sorted(set(paths))
        if self.ref is None:
            for rel in paths:
                shutil.copytree(self.path / rel, dest / rel, dirs_exist_ok=True)
            return
        done = _git("--git-dir", str(self.path), "archive", self.ref, "--", *paths)
        if done.returncode:
            raise SourceError(f"git archive {self.ref} in {self.path}: {done.stderr.decode()}")
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
            archive.extractall(dest, filter="data")


def resolve(where: str, ref: str = "HEAD") -> TritonSource:
    """The checkout at ``where``: a work tree when it has a ``qa`` folder, else a git dir."""
    path = Path(where).expanduser()
    if (path / "qa").is_dir():
        head = _git("-C", str(path), "rev-parse", "HEAD")
        commit = head.stdout.decode().strip() if head.returncode == 0 else "unknown"
        return TritonSource(path, None, commit)
    if path.is_dir():
        found = _git("--git-dir", str(path), "rev-parse", "--verify", f"{ref}^{{commit}}")
        if found.returncode == 0:
            return TritonSource(path, ref, found.stdout.decode().strip())
    raise SourceError(how_to_get(where))
