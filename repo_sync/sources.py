"""Where models come from: an S3 bucket (AWS, MinIO, any S3 API) or a local folder.

A source lists its objects as relative keys with an ETag-like fingerprint, and fetches
one object into a new file, checking it is still the object it listed.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from .fsops import new_file

log = logging.getLogger(__name__)

Progress = Callable[[int], Any] | None
_CHUNK = 1 << 20


class SourceError(RuntimeError):
    """The source could not be listed or read; the sync pass changes nothing it depends on."""


class ObjectChanged(SourceError):
    """The object is no longer the one listed (replaced, deleted, or a different size)."""


@dataclass(frozen=True)
class ObjectInfo:
    etag: str  # S3 ETag; "<size>-<mtime_ns>" for local files
    size: int
    mtime: float  # epoch seconds (S3 LastModified, or the file's mtime)


@dataclass
class Listing:
    objects: dict[str, ObjectInfo] = field(default_factory=dict)  # relative key -> info
    refused: list[tuple[str, str]] = field(default_factory=list)  # (key, reason) seen by the source


class Source(Protocol):
    description: str

    def list(self) -> Listing: ...

    def fetch(self, key: str, info: ObjectInfo, dest: Path, progress: Progress = None) -> None: ...


def _copy_stream(chunks: Any, fd: int, key: str, info: ObjectInfo, progress: Progress) -> None:
    written = 0
    with os.fdopen(fd, "wb") as out:
        for chunk in chunks:
            written += len(chunk)
            if written > info.size:
                raise ObjectChanged(f"{key}: more than the {info.size} bytes listed")
            out.write(chunk)
            if progress is not None:
                progress(len(chunk))
    if written != info.size:
        raise ObjectChanged(f"{key}: {written} bytes read, {info.size} listed")


# -- S3 ---------------------------------------------------------------------------------

# Triton's form for a custom endpoint: s3://host:port/bucket/prefix
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-]+:[0-9]{1,5}")


class S3Source:
    """``s3://bucket/prefix`` through boto3: credentials, region and endpoint come from the
    usual AWS settings (environment, config files, instance roles), as for any AWS tool."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.description = f"s3://{bucket}/{self.prefix}"
        if client is None:
            import boto3
            from botocore.config import Config

            region = (
                region
                or os.environ.get("AWS_DEFAULT_REGION")
                or os.environ.get("AWS_REGION")
                or None
            )
            client = boto3.session.Session().client(
                "s3",
                endpoint_url=endpoint_url or None,
                region_name=region,
                config=Config(retries={"mode": "standard", "max_attempts": 5}),
            )
        self.client = client

    def list(self) -> Listing:
        from botocore.exceptions import BotoCoreError, ClientError

        listing = Listing()
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    key = obj["Key"][len(self.prefix) :]
                    listing.objects[key] = ObjectInfo(
                        etag=obj.get("ETag", ""),
                        size=int(obj.get("Size", 0)),
                        mtime=obj["LastModified"].timestamp() if "LastModified" in obj else 0.0,
                    )
        except (BotoCoreError, ClientError) as exc:
            raise SourceError(f"cannot list {self.description}: {exc}") from exc
        return listing

    def fetch(self, key: str, info: ObjectInfo, dest: Path, progress: Progress = None) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self.prefix + key
        try:
            args: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
            if info.etag:
                args["IfMatch"] = info.etag  # the object listed, not a newer upload
            body = self.client.get_object(**args)["Body"]
            try:
                _copy_stream(body.iter_chunks(_CHUNK), new_file(dest), key, info, progress)
            finally:
                body.close()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                raise ObjectChanged(
                    f"s3://{self.bucket}/{full} changed since it was listed"
                ) from exc
            raise SourceError(f"cannot read s3://{self.bucket}/{full}: {exc}") from exc
        except BotoCoreError as exc:
            raise SourceError(f"cannot read s3://{self.bucket}/{full}: {exc}") from exc


# -- local folder -----------------------------------------------------------------------


class LocalSource:
    """A folder on this machine (a mounted volume, say). Symbolic links are refused."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.description = str(self.root)

    def list(self) -> Listing:
        if not self.root.is_dir():
            raise SourceError(f"source folder {self.root} is not a folder")
        listing = Listing()
        self._walk(self.root, "", listing)
        return listing

    def _walk(self, folder: Path, rel: str, listing: Listing) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            raise SourceError(f"cannot list {folder}: {exc}") from exc
        if rel and not entries:
            listing.objects[rel] = ObjectInfo("dir", 0, 0.0)  # an empty folder, as S3 shows it
        for entry in entries:
            key = rel + entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISLNK(st.st_mode):
                listing.refused.append((key, "is a symbolic link"))
            elif stat.S_ISDIR(st.st_mode):
                self._walk(Path(entry.path), key + "/", listing)
            elif stat.S_ISREG(st.st_mode):
                listing.objects[key] = ObjectInfo(
                    f"{st.st_size}-{st.st_mtime_ns}", st.st_size, st.st_mtime
                )
            else:
                listing.refused.append((key, "is not a regular file"))

    def _open(self, key: str) -> int:
        """Open root/key for reading without following a link at any step."""
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(self.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            *folders, name = key.split("/")
            for seg in folders:
                nxt = os.open(
                    seg, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow, dir_fd=fd
                )
                os.close(fd)
                fd = nxt
            return os.open(name, os.O_RDONLY | nofollow, dir_fd=fd)
        finally:
            os.close(fd)

    def fetch(self, key: str, info: ObjectInfo, dest: Path, progress: Progress = None) -> None:
        try:
            src = self._open(key)
        except OSError as exc:
            raise ObjectChanged(f"{self.root / key}: {exc}") from exc
        with os.fdopen(src, "rb") as inp:
            st = os.fstat(inp.fileno())
            if not stat.S_ISREG(st.st_mode) or f"{st.st_size}-{st.st_mtime_ns}" != info.etag:
                raise ObjectChanged(f"{self.root / key} changed since it was listed")
            _copy_stream(iter(lambda: inp.read(_CHUNK), b""), new_file(dest), key, info, progress)


# -- choosing ---------------------------------------------------------------------------


def open_source(
    spec: str, *, endpoint_url: str | None = None, region: str | None = None
) -> S3Source | LocalSource:
    """``s3://bucket/prefix``, ``s3://host:port/bucket/prefix`` (Triton's form for a custom
    endpoint, plain HTTP), ``file:///path`` or a folder path."""
    if spec.startswith("s3://"):
        rest = spec[len("s3://") :]
        first, _, path = rest.partition("/")
        if _HOST_PORT.fullmatch(first):
            if endpoint_url:
                raise ValueError(f"{spec}: names an endpoint and --s3-endpoint-url is set too")
            endpoint_url = f"http://{first}"
            first, _, path = path.partition("/")
        if not first:
            raise ValueError(f"{spec}: no bucket name")
        return S3Source(first, path, endpoint_url=endpoint_url, region=region)
    parts = urlsplit(spec)
    if parts.scheme == "file":
        return LocalSource(Path(parts.path))
    if parts.scheme and len(parts.scheme) > 1:
        raise ValueError(f"{spec}: unsupported source (s3://bucket/prefix or a folder)")
    return LocalSource(Path(spec))


__all__ = [
    "Listing",
    "LocalSource",
    "ObjectChanged",
    "ObjectInfo",
    "S3Source",
    "Source",
    "SourceError",
    "open_source",
]
