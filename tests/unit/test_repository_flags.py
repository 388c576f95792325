"""``--model-repository`` as Triton takes it: folders and object-storage URLs, repeated."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.cli import parser
from conch.cli.repository_mirror import cache_name
from conch.settings import Settings


def _settings(*argv: str) -> Settings:
    return Settings.from_args(parser().parse_args(["worker", *argv]))


def test_a_url_is_kept_whole_and_a_folder_made_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = _settings(
        "--model-repository=s3://models/triton-repo",
        "--model-repository",
        "local",
        "--model-repository=s3://10.0.0.1:9000/models/repo",
        "--model-repository=gs://bucket/path",
        "--model-repository=as://account/container/path",
    )
    assert s.model_repository == (
        "s3://models/triton-repo",  # not s3:/models/triton-repo, as a Path would make it
        tmp_path / "local",
        "s3://10.0.0.1:9000/models/repo",
        "gs://bucket/path",
        "as://account/container/path",
    )
    # The roles read folders only: a URL must be mirrored first.
    with pytest.raises(ValueError, match="s3://models/triton-repo is not mirrored"):
        s.repository_folders  # noqa: B018
    # ... and children get every repository back, in order.
    args = s.to_args("worker")
    given = [args[i + 1] for i, a in enumerate(args) if a == "--model-repository"]
    assert given == [str(r) for r in s.model_repository]


def test_a_repository_given_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="given twice"):
        _settings("--model-repository", str(tmp_path), "--model-repository", str(tmp_path))


def test_one_repository_may_be_given_alone_in_code(tmp_path: Path) -> None:
    (tmp_path / "b" / "m").mkdir(parents=True)
    s = Settings(model_repository=[tmp_path / "a", tmp_path / "b"])
    assert Settings(model_repository=tmp_path).repository_folders == (tmp_path,)
    assert s.model_folder("m") == tmp_path / "b" / "m"  # the repository that holds it
    assert s.model_folder("x") == tmp_path / "a" / "x"  # else where the first would


def test_cache_folders_are_named_for_their_url() -> None:
    a, b = cache_name("s3://models/triton-repo"), cache_name("s3://models/triton-repo2")
    assert a != b and a.startswith("s3-models-triton-repo-")
    assert "/" not in a and ".." not in cache_name("s3://b/../../etc")
