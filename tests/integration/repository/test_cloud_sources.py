"""repo_sync's gs:// and as:// sources against real servers on loopback: Google Cloud
Storage's emulator (gcp-storage-emulator) and Azure's (Azurite), reached through the official
client libraries with Triton's environment variables, as a user reaches GCS and Azure."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from conch.devtools.redis_server import free_port
from repo_sync.sources import (
    AzureBlobSource,
    GCSSource,
    ObjectChanged,
    SourceError,
    open_source,
)
from repo_sync.sync import MANIFEST, Syncer, SyncOptions

from conftest import AZURITE_ACCOUNT, AZURITE_KEY, azure_container, gcs_bucket

CONFIG = b'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
PREFIX = "prod/repo"


def model_tree() -> dict[str, bytes]:
    """A repository of two models, with nested keys and a multi-MiB file."""
    return {
        "resnet/config.pbtxt": CONFIG,
        "resnet/labels.txt": b"cat\ndog\n",
        "resnet/1/model.onnx": os.urandom(3 * 1024 * 1024 + 17),
        "resnet/2/model.onnx": b"two",
        "resnet/2/assets/vocab.txt": b"v2",
        "py/config.pbtxt": b'backend: "python"\n',
        "py/1/model.py": b"# one\n",
    }


class GCSStore:
    """A bucket of the GCS emulator, written with google-cloud-storage."""

    scheme = "gs"

    def __init__(self, gcs, files: dict[str, bytes]) -> None:
        self.gcs = gcs
        self.name = gcs_bucket(gcs, files, PREFIX)
        self.url = f"gs://{self.name}/{PREFIX}"
        self.missing_url = "gs://no-such-bucket-here/models"
        self.missing_name = "no-such-bucket-here"

    def put(self, rel: str, data: bytes) -> None:
        self.gcs.bucket(self.name).blob(f"{PREFIX}/{rel}").upload_from_string(data)

    def delete(self, rel: str) -> None:
        self.gcs.bucket(self.name).blob(f"{PREFIX}/{rel}").delete()


class AzureStore:
    """A container of Azurite's development account, written with azure-storage-blob."""

    scheme = "as"

    def __init__(self, azure_blob, files: dict[str, bytes]) -> None:
        self.client = azure_blob
        self.name = azure_container(azure_blob, files, PREFIX)
        self.url = f"as://{AZURITE_ACCOUNT}/{self.name}/{PREFIX}"
        self.missing_url = f"as://{AZURITE_ACCOUNT}/no-such-container-here/models"
        self.missing_name = "no-such-container-here"

    def put(self, rel: str, data: bytes) -> None:
        blob = self.client.get_container_client(self.name).get_blob_client(f"{PREFIX}/{rel}")
        blob.upload_blob(data, overwrite=True)

    def delete(self, rel: str) -> None:
        self.client.get_container_client(self.name).delete_blob(f"{PREFIX}/{rel}")


@pytest.fixture(params=["gs", "as"])
def store(request: pytest.FixtureRequest):
    files = model_tree()
    if request.param == "gs":
        made: GCSStore | AzureStore = GCSStore(request.getfixturevalue("gcs"), files)
    else:
        made = AzureStore(request.getfixturevalue("azure_blob"), files)
    made.files = files  # type: ignore[union-attr]
    return made


def fetch_bytes(source, key: str, info, folder: Path) -> tuple[bytes, int]:
    """Fetch ``key`` into a new file of ``folder``: its bytes, and the progress reported."""
    dest = folder / f"{len(list(folder.iterdir()))}.part"
    reported: list[int] = []
    source.fetch(key, info, dest, reported.append)
    return dest.read_bytes(), sum(reported)


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.relative_to(root).parts[0].startswith(".")
    }


# -- listing and fetching ---------------------------------------------------------------


def test_lists_and_fetches_a_model_tree(store, tmp_path: Path):
    source = open_source(store.url)
    assert isinstance(source, GCSSource if store.scheme == "gs" else AzureBlobSource)
    assert source.description == f"{store.url}/"
    listing = source.list()
    assert listing.refused == []
    assert {k: i.size for k, i in listing.objects.items()} == {
        k: len(v) for k, v in store.files.items()
    }
    assert all(i.etag and i.mtime > 0 for i in listing.objects.values())
    for key, info in listing.objects.items():
        data, reported = fetch_bytes(source, key, info, tmp_path)
        assert data == store.files[key], key
        assert reported == info.size, key


def test_the_fingerprint_changes_when_an_object_is_replaced(store):
    source = open_source(store.url)
    before = source.list().objects
    store.put("resnet/2/model.onnx", b"TWO")  # same size, other bytes
    after = source.list().objects
    assert after["resnet/2/model.onnx"].etag != before["resnet/2/model.onnx"].etag
    assert after["resnet/2/model.onnx"].size == 3
    unchanged = set(before) - {"resnet/2/model.onnx"}
    assert all(after[k].etag == before[k].etag for k in unchanged)
    assert source.list().objects == after  # the same objects: the same fingerprints


def test_an_object_replaced_after_listing_is_not_fetched(store, tmp_path: Path):
    source = open_source(store.url)
    listed = source.list().objects
    store.put("resnet/2/model.onnx", b"TWO")
    with pytest.raises(ObjectChanged, match="changed since it was listed"):
        source.fetch("resnet/2/model.onnx", listed["resnet/2/model.onnx"], tmp_path / "a")
    store.put("resnet/labels.txt", b"cat\ndog\nbird\n")  # a new size
    with pytest.raises(ObjectChanged):
        source.fetch("resnet/labels.txt", listed["resnet/labels.txt"], tmp_path / "b")
    store.delete("py/1/model.py")
    with pytest.raises(ObjectChanged):
        source.fetch("py/1/model.py", listed["py/1/model.py"], tmp_path / "c")
    # the object listed now is fetched
    info = source.list().objects["resnet/2/model.onnx"]
    assert fetch_bytes(source, "resnet/2/model.onnx", info, tmp_path)[0] == b"TWO"


# -- what goes wrong, said --------------------------------------------------------------


def test_an_unknown_bucket_or_container_is_named(store):
    with pytest.raises(SourceError) as caught:
        open_source(store.missing_url).list()
    message = str(caught.value)
    assert store.missing_url in message and f"'{store.missing_name}' not found" in message


def test_gcs_credentials_that_cannot_be_read_or_used(gcs, monkeypatch, tmp_path: Path):
    url = f"gs://{gcs_bucket(gcs, {'m/config.pbtxt': CONFIG})}/"
    missing = tmp_path / "no-such-key.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(missing))
    with pytest.raises(SourceError) as caught:
        open_source(url).list()
    assert f"GOOGLE_APPLICATION_CREDENTIALS={missing}" in str(caught.value)
    assert url in str(caught.value)
    assert "service account key file" in str(caught.value)

    # a service account whose token cannot be had (its token server: a closed port here)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    key = tmp_path / "key.json"
    key.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "conch-tests",
                "private_key_id": "1",
                "private_key": pem,
                "client_email": "repo-sync@conch-tests.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": f"http://127.0.0.1:{free_port()}/token",
            }
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    with pytest.raises(SourceError) as caught:
        GCSSource(url.removeprefix("gs://").strip("/"), retry_secs=1).list()
    assert f"cannot use the credentials of GOOGLE_APPLICATION_CREDENTIALS={key}" in str(
        caught.value
    )


def test_azure_without_credentials_says_which_variables_to_set(azure_blob, monkeypatch):
    url = f"as://{AZURITE_ACCOUNT}/{azure_container(azure_blob, {'m/config.pbtxt': CONFIG})}"
    monkeypatch.delenv("AZURE_STORAGE_KEY")
    with pytest.raises(SourceError) as caught:
        open_source(url).list()
    assert url in str(caught.value)
    assert "set AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY" in str(caught.value)

    monkeypatch.setenv("AZURE_STORAGE_KEY", "AAAA" + AZURITE_KEY[4:])  # another key
    with pytest.raises(SourceError, match=r"credentials were refused.*AZURE_STORAGE_KEY"):
        open_source(url).list()


def test_an_unreachable_endpoint_is_named(gcs, azure_blob, monkeypatch):
    closed = free_port()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{closed}")
    started = time.monotonic()
    with pytest.raises(SourceError, match=rf"cannot reach http://127.0.0.1:{closed}"):
        GCSSource("models", "repo", retry_secs=1).list()
    monkeypatch.setenv("AZURE_STORAGE_BLOB_ENDPOINT", f"http://127.0.0.1:{closed}/acct")
    with pytest.raises(
        SourceError, match=rf"cannot reach http://127.0.0.1:{closed}/acct.*AZURE_STORAGE_BLOB"
    ):
        AzureBlobSource("acct", "models", "repo", retries=0).list()
    assert time.monotonic() - started < 30


def test_azure_connection_string_and_folder_blobs(azure_blob, azure_endpoint, monkeypatch):
    """AZURE_STORAGE_CONNECTION_STRING gives endpoint and key; a hierarchical namespace's
    folder blob (metadata hdi_isfolder) lists as S3's folder marker, ``m/1/``."""
    name = azure_container(azure_blob, {"ens/config.pbtxt": b'platform: "ensemble"\n'})
    azure_blob.get_container_client(name).upload_blob(
        "ens/1", b"", metadata={"hdi_isfolder": "true"}
    )
    for var in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_BLOB_ENDPOINT"):
        monkeypatch.delenv(var)
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
        f"AccountKey={AZURITE_KEY};BlobEndpoint={azure_endpoint};",
    )
    listing = open_source(f"as://{AZURITE_ACCOUNT}/{name}").list()
    assert sorted(listing.objects) == ["ens/1/", "ens/config.pbtxt"]
    assert listing.objects["ens/1/"].size == 0


# -- a whole sync -----------------------------------------------------------------------


def test_a_sync_pass_mirrors_the_tree(store, tmp_path: Path):
    cache = tmp_path / "cache"
    with Syncer(open_source(store.url), cache, options=SyncOptions(poll_secs=0.05)) as syncer:
        result = syncer.sync_settled()  # no .ready markers: taken once stable
        assert result.listed and result.errors == [] and result.pending == []
        assert tree_bytes(cache) == store.files
        assert sorted(json.loads((cache / MANIFEST).read_text())["models"]) == ["py", "resnet"]

        store.put("resnet/2/model.onnx", b"TWO")
        store.put("py/1/.ready", b"")
        syncer.sync_once()
        result = syncer.sync_settled()
        assert result.errors == []
        assert (cache / "resnet/2/model.onnx").read_bytes() == b"TWO"
        assert (cache / "resnet/1/model.onnx").read_bytes() == store.files["resnet/1/model.onnx"]
        assert not (cache / "py/1/.ready").exists()
