"""Where models come from, in the forms Triton's ``--model-repository`` takes: an S3 bucket
(AWS, MinIO, any S3 API: ``s3://bucket/prefix``, ``s3://host:port/bucket/prefix``), a Google
Cloud Storage bucket (``gs://bucket/prefix``), an Azure Blob Storage container
(``as://account/container/prefix``), or a local folder.

A source lists its objects as relative keys with an ETag-like fingerprint, and fetches
one object into a new file, checking it is still the object it listed.

Credentials come from the environment, as Triton's do: boto3's usual AWS settings;
``GOOGLE_APPLICATION_CREDENTIALS`` (``STORAGE_EMULATOR_HOST`` for an emulator);
``AZURE_STORAGE_ACCOUNT`` and ``AZURE_STORAGE_KEY`` (``AZURE_STORAGE_BLOB_ENDPOINT`` or
``AZURE_STORAGE_CONNECTION_STRING`` for another endpoint, such as Azurite). The Google and
Azure client libraries are imported only by their sources (extras ``gcs`` and ``azure``).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from conch.core.extras import needs_extra

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


# -- Google Cloud Storage ---------------------------------------------------------------

_GCS_CREDENTIALS_HINT = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a service account key file (JSON) that may "
    "read the bucket"
)


class _HashingSink:
    """A file object for a client's download: writes to ``fd``, at most ``info.size`` bytes,
    hashing what it writes and reporting progress about once a MiB."""

    def __init__(self, fd: int, key: str, info: ObjectInfo, hasher: Any, progress: Progress):
        self.out = os.fdopen(fd, "wb")
        self.key, self.info, self.hasher, self.progress = key, info, hasher, progress
        self.written = 0
        self._unreported = 0

    def write(self, chunk: bytes) -> int:
        self.written += len(chunk)
        if self.written > self.info.size:
            raise ObjectChanged(f"{self.key}: more than the {self.info.size} bytes listed")
        self.out.write(chunk)
        if self.hasher is not None:
            self.hasher.update(chunk)
        if self.progress is not None:
            self._unreported += len(chunk)
            if self._unreported >= _CHUNK:
                self.progress(self._unreported)
                self._unreported = 0
        return len(chunk)

    def close(self) -> None:
        if self.progress is not None and self._unreported:
            self.progress(self._unreported)
            self._unreported = 0
        self.out.close()


def _gcs_key_file(path: str, scopes: list[str]) -> tuple[Any, str | None]:
    """The credentials of a JSON key file, of the two kinds Triton reads: a service
    account's key, or an authorized user's (gcloud's); and the file's project, if any."""
    import json

    from google.oauth2 import credentials as user_credentials
    from google.oauth2 import service_account

    with open(path, encoding="utf-8") as f:
        info = json.load(f)
    kind = info.get("type") if isinstance(info, dict) else None
    if kind == "service_account":
        creds = service_account.Credentials.from_service_account_info(info, scopes=scopes)
        return creds, info.get("project_id")
    if kind == "authorized_user":
        creds = user_credentials.Credentials.from_authorized_user_info(info, scopes=scopes)
        return creds, info.get("quota_project_id")
    raise ValueError(f"a key file of type {kind!r}, not 'service_account' or 'authorized_user'")


class GCSSource:
    """``gs://bucket/prefix`` through google-cloud-storage, with Triton's credentials: the
    key file that ``GOOGLE_APPLICATION_CREDENTIALS`` names (a service account's, or an
    authorized user's); without it Google's application default credentials (the metadata
    server on GCE and GKE, gcloud's login), else anonymous access (public buckets).
    ``STORAGE_EMULATOR_HOST`` (``http://host:port``) points the client at an emulator.

    The fingerprint is ``<generation>#md5=<hash>`` (``crc32c=`` for composite objects): a
    fetch asks for that generation only, and checks the bytes against the listed hash."""

    def __init__(
        self, bucket: str, prefix: str = "", *, client: Any = None, retry_secs: float = 30.0
    ) -> None:
        try:
            from google.cloud import storage  # noqa: F401
        except ImportError as exc:
            raise ImportError(needs_extra("gs:// sources", "google-cloud-storage", "gcs")) from exc
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.description = f"gs://{bucket}/{self.prefix}"
        self.retry_secs = retry_secs
        self._client = client
        self._credentials_from = "given" if client is not None else ""
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The storage client, made at first use (reading credentials can reach the
        network: the metadata server)."""
        with self._lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> Any:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError
        from google.cloud import storage

        scopes = ["https://www.googleapis.com/auth/devstorage.read_only"]
        project = os.environ.get("GOOGLE_CLOUD_PROJECT") or None
        path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", "")
        if path:
            try:
                credentials, found = _gcs_key_file(path, scopes)
            except (OSError, ValueError, GoogleAuthError) as exc:
                raise SourceError(
                    f"cannot list {self.description}: GOOGLE_APPLICATION_CREDENTIALS={path}: "
                    f"{exc}; point it at a service account key file (JSON)"
                ) from exc
            self._credentials_from = f"GOOGLE_APPLICATION_CREDENTIALS={path}"
            return storage.Client(project=project or found or "<none>", credentials=credentials)
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            self._credentials_from = "emulator"
            return storage.Client(project=project or "<none>")  # anonymous, as emulators take
        try:
            credentials, found = google.auth.default(scopes=scopes)
        except DefaultCredentialsError:
            self._credentials_from = "anonymous"
            return storage.Client.create_anonymous_client()
        except GoogleAuthError as exc:
            raise SourceError(
                f"cannot list {self.description}: application default credentials: {exc}; "
                + _GCS_CREDENTIALS_HINT
            ) from exc
        self._credentials_from = "application default credentials"
        return storage.Client(project=project or found or "<none>", credentials=credentials)

    def _retry(self) -> Any:
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY.with_timeout(self.retry_secs)

    def _endpoint(self) -> str:
        return os.environ.get("STORAGE_EMULATOR_HOST") or "storage.googleapis.com"

    def _error(self, what: str, exc: BaseException) -> SourceError:
        """A SourceError for ``exc`` that says what to do about it."""
        from google.api_core import exceptions as gexc
        from google.auth.exceptions import GoogleAuthError

        cause: BaseException = exc
        if isinstance(exc, gexc.RetryError) and exc.cause is not None:
            cause = exc.cause  # retried until the deadline: the last failure says why
        if isinstance(cause, gexc.NotFound):
            why = f"bucket '{self.bucket}' not found"
        elif isinstance(cause, gexc.Unauthorized | gexc.Forbidden):
            code = getattr(cause, "code", "")
            if self._credentials_from == "anonymous":
                why = f"{code} refused without credentials: {_GCS_CREDENTIALS_HINT}"
            else:
                why = (
                    f"{code} refused to the credentials of {self._credentials_from} "
                    f"({cause.message}): give them storage.objects.list and "
                    f"storage.objects.get on the bucket, or {_GCS_CREDENTIALS_HINT}"
                )
        elif isinstance(cause, GoogleAuthError):
            why = f"cannot use the credentials of {self._credentials_from}: {cause}"
        elif isinstance(cause, gexc.GoogleAPICallError):
            why = f"{cause.code} {cause.message}"
        else:  # the connection: requests' errors, a retry deadline
            why = (
                f"cannot reach {self._endpoint()}: {cause}; check the network "
                "(STORAGE_EMULATOR_HOST for an emulator)"
            )
        return SourceError(f"cannot {what} {self.description}: {why}")

    def _errors(self) -> tuple[type[BaseException], ...]:
        import requests
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError

        return (GoogleAPIError, GoogleAuthError, requests.RequestException)

    def list(self) -> Listing:
        listing = Listing()
        client = self.client
        try:
            blobs = client.list_blobs(self.bucket, prefix=self.prefix, retry=self._retry())
            for blob in blobs:
                key = blob.name[len(self.prefix) :]
                # a composite object has only a CRC32C
                md5, crc = blob.md5_hash, blob.crc32c or ""
                digest = f"md5={md5}" if md5 else f"crc32c={crc}"
                listing.objects[key] = ObjectInfo(
                    etag=f"{blob.generation}#{digest}",
                    size=int(blob.size or 0),
                    mtime=blob.updated.timestamp() if blob.updated else 0.0,
                )
        except self._errors() as exc:
            raise self._error("list", exc) from exc
        return listing

    def fetch(self, key: str, info: ObjectInfo, dest: Path, progress: Progress = None) -> None:
        import base64
        import hashlib

        from google.api_core.exceptions import NotFound, PreconditionFailed

        full = self.prefix + key
        url = f"gs://{self.bucket}/{full}"
        generation, _, digest = info.etag.partition("#")
        kind, _, expected = digest.partition("=")
        if kind == "md5":
            hasher: Any = hashlib.md5(usedforsecurity=False)
        elif kind == "crc32c" and expected:
            import google_crc32c

            hasher = google_crc32c.Checksum()
        else:
            hasher = None
        client = self.client
        try:
            blob = client.bucket(self.bucket).blob(full)
            sink = _HashingSink(new_file(dest), key, info, hasher, progress)
            try:
                blob.download_to_file(
                    sink,
                    # the generation listed, not a newer upload (412 otherwise)
                    if_generation_match=int(generation) if generation.isdigit() else None,
                    raw_download=True,  # the stored bytes, whose size and hash were listed
                    checksum=None,  # checked below, against the listing
                    retry=self._retry(),
                )
            finally:
                sink.close()
        except (NotFound, PreconditionFailed) as exc:
            raise ObjectChanged(f"{url} changed since it was listed") from exc
        except self._errors() as exc:
            raise self._error("read", exc) from exc
        if sink.written != info.size:
            raise ObjectChanged(f"{key}: {sink.written} bytes read, {info.size} listed")
        if hasher is not None and base64.b64encode(hasher.digest()).decode() != expected:
            raise ObjectChanged(f"{url} changed since it was listed (its {kind} differs)")


# -- Azure Blob Storage -----------------------------------------------------------------

_AZURE_CREDENTIALS_HINT = (
    "set AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY (the account's access key), or "
    "AZURE_STORAGE_CONNECTION_STRING"
)
_AZURE_SUFFIX = ".blob.core.windows.net"


class AzureBlobSource:
    """``as://account/container/prefix`` through azure-storage-blob, with Triton's settings:
    the account ``AZURE_STORAGE_ACCOUNT`` (else the URL's) and its key ``AZURE_STORAGE_KEY``
    (without one, anonymous access: public containers), at
    ``https://<account>.blob.core.windows.net``. ``AZURE_STORAGE_BLOB_ENDPOINT`` replaces
    that URL (Azurite: ``http://127.0.0.1:10000/devstoreaccount1``; another cloud), and
    ``AZURE_STORAGE_CONNECTION_STRING``, when set, gives endpoint and credentials both.

    The fingerprint is the blob's ETag: a fetch asks for that ETag only (412 otherwise), and
    Azure pins the ranged reads of one download to it."""

    def __init__(
        self,
        account: str,
        container: str,
        prefix: str = "",
        *,
        client: Any = None,
        retries: int = 4,
    ) -> None:
        try:
            from azure.storage.blob import BlobServiceClient, ExponentialRetry
        except ImportError as exc:
            raise ImportError(needs_extra("as:// sources", "azure-storage-blob", "azure")) from exc
        if account.endswith(_AZURE_SUFFIX):  # as://account.blob.core.windows.net/..., as Triton
            account = account[: -len(_AZURE_SUFFIX)]
        self.account, self.container = account, container
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.description = f"as://{account}/{container}/{self.prefix}"
        self.anonymous = False
        self.endpoint_from = ""
        self._broken: str | None = None  # a connection string the client refused
        if client is None:
            options: dict[str, Any] = {
                "retry_policy": ExponentialRetry(
                    initial_backoff=1, increment_base=2, retry_total=max(0, retries)
                ),
                "connection_timeout": 10,
            }
            conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
            if conn:
                self.endpoint_from = "AZURE_STORAGE_CONNECTION_STRING"
                try:
                    client = BlobServiceClient.from_connection_string(conn, **options)
                except ValueError as exc:  # kept as SourceError: the first list reports it
                    self._broken = f"AZURE_STORAGE_CONNECTION_STRING: {exc}"
                    client = None
                self.anonymous = "AccountKey=" not in conn and "SharedAccessSignature=" not in conn
            else:
                name = os.environ.get("AZURE_STORAGE_ACCOUNT") or account
                endpoint = os.environ.get("AZURE_STORAGE_BLOB_ENDPOINT", "")
                self.endpoint_from = "AZURE_STORAGE_BLOB_ENDPOINT" if endpoint else ""
                endpoint = endpoint or f"https://{name}{_AZURE_SUFFIX}"
                key = os.environ.get("AZURE_STORAGE_KEY", "")
                credential = {"account_name": name, "account_key": key} if key else None
                self.anonymous = credential is None
                client = BlobServiceClient(endpoint, credential=credential, **options)
        self.client = client

    def _container(self) -> Any:
        if self._broken is not None:
            raise SourceError(f"cannot list {self.description}: {self._broken}")
        return self.client.get_container_client(self.container)

    def _error(self, what: str, exc: BaseException) -> SourceError:
        """A SourceError for ``exc`` that says what to do about it."""
        from azure.core.exceptions import (
            ClientAuthenticationError,
            HttpResponseError,
            ResourceNotFoundError,
            ServiceRequestError,
        )

        code = getattr(exc, "error_code", None) or ""
        code = str(getattr(code, "value", code))  # a StorageErrorCode, or its text
        message = (getattr(exc, "message", None) or str(exc)).strip().splitlines()
        first = message[0] if message else type(exc).__name__
        endpoint = self.client.url if self.client is not None else "?"
        if isinstance(exc, ResourceNotFoundError):
            why = f"container '{self.container}' not found at {endpoint} ({code or first})"
            if self.anonymous:
                why += f"; if it is private, {_AZURE_CREDENTIALS_HINT}"
        elif isinstance(exc, ClientAuthenticationError) or code in (
            "NoAuthenticationInformation",
            "AuthenticationFailed",
            "AuthorizationFailure",
            "AuthorizationPermissionMismatch",
            "PublicAccessNotPermitted",
        ):
            if self.anonymous:
                why = f"refused without credentials ({code or first}): {_AZURE_CREDENTIALS_HINT}"
            else:
                why = (
                    f"the credentials were refused ({code or first}): check "
                    "AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY (or "
                    "AZURE_STORAGE_CONNECTION_STRING)"
                )
        elif isinstance(exc, ServiceRequestError):
            hint = f" or {self.endpoint_from}" if self.endpoint_from else ""
            why = f"cannot reach {endpoint}: {first}; check the network{hint}"
        elif isinstance(exc, HttpResponseError):
            why = f"{exc.status_code} {code}: {first}"
        else:
            why = f"{type(exc).__name__}: {first}"
        return SourceError(f"cannot {what} {self.description}: {why}")

    def list(self) -> Listing:
        from azure.core.exceptions import AzureError

        listing = Listing()
        try:
            container = self._container()
            for blob in container.list_blobs(name_starts_with=self.prefix, include=["metadata"]):
                key = blob.name[len(self.prefix) :]
                if (blob.metadata or {}).get("hdi_isfolder") == "true":
                    # a folder of an account with a hierarchical namespace: S3's "m/1/"
                    listing.objects[key.rstrip("/") + "/"] = ObjectInfo("dir", 0, 0.0)
                    continue
                listing.objects[key] = ObjectInfo(
                    etag=blob.etag or "",
                    size=int(blob.size or 0),
                    mtime=blob.last_modified.timestamp() if blob.last_modified else 0.0,
                )
        except AzureError as exc:
            raise self._error("list", exc) from exc
        return listing

    def fetch(self, key: str, info: ObjectInfo, dest: Path, progress: Progress = None) -> None:
        from azure.core import MatchConditions
        from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError

        full = self.prefix + key
        url = f"as://{self.account}/{self.container}/{full}"
        try:
            args: dict[str, Any] = {"max_concurrency": 1}
            if info.etag:  # the blob listed, not a newer upload
                args.update(etag=info.etag, match_condition=MatchConditions.IfNotModified)
            stream = self._container().download_blob(full, **args)
            _copy_stream(stream.chunks(), new_file(dest), key, info, progress)
        except (ResourceModifiedError, ResourceNotFoundError) as exc:
            raise ObjectChanged(f"{url} changed since it was listed") from exc
        except AzureError as exc:
            raise self._error("read", exc) from exc


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
) -> S3Source | GCSSource | AzureBlobSource | LocalSource:
    """``s3://bucket/prefix``, ``s3://host:port/bucket/prefix`` (Triton's form for a custom
    endpoint, plain HTTP), ``gs://bucket/prefix``, ``as://account/container/prefix``,
    ``file:///path`` or a folder path. ``endpoint_url`` and ``region`` are S3's. Raises
    ValueError for a malformed URL, ImportError when the scheme's client library is not
    installed."""
    if spec.startswith("gs://"):
        bucket, _, path = spec[len("gs://") :].partition("/")
        if not bucket:
            raise ValueError(f"{spec}: no bucket name (gs://bucket/prefix)")
        return GCSSource(bucket, path)
    if spec.startswith("as://"):
        account, _, rest = spec[len("as://") :].partition("/")
        container, _, path = rest.partition("/")
        if not account:
            raise ValueError(f"{spec}: no account name (as://account/container/prefix)")
        if not container:
            raise ValueError(f"{spec}: no container name (as://account/container/prefix)")
        return AzureBlobSource(account, container, path)
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
        raise ValueError(
            f"{spec}: unsupported source (s3://bucket/prefix, gs://bucket/prefix, "
            "as://account/container/prefix or a folder)"
        )
    return LocalSource(Path(spec))


__all__ = [
    "AzureBlobSource",
    "GCSSource",
    "Listing",
    "LocalSource",
    "ObjectChanged",
    "ObjectInfo",
    "S3Source",
    "Source",
    "SourceError",
    "open_source",
]
