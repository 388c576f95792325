"""open_source's URL forms for Google Cloud Storage and Azure Blob Storage (Triton's
``gs://bucket/path`` and ``as://account/container/path``), and the endpoint and account each
takes from the environment. Nothing here reaches a network: the clients are only made."""

from __future__ import annotations

import pytest

from repo_sync.sources import open_source

CLOUD_VARS = (
    "GOOGLE_APPLICATION_CREDENTIALS",
    "STORAGE_EMULATOR_HOST",
    "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_BLOB_ENDPOINT",
    "AZURE_STORAGE_CONNECTION_STRING",
)


@pytest.fixture(autouse=True)
def no_cloud_settings(monkeypatch):
    for var in CLOUD_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize(
    ("spec", "bucket", "prefix"),
    [
        ("gs://bucket", "bucket", ""),
        ("gs://bucket/", "bucket", ""),
        ("gs://bucket/a/b", "bucket", "a/b/"),
        ("gs://bucket/a/b/", "bucket", "a/b/"),
    ],
)
def test_gs_urls(spec: str, bucket: str, prefix: str):
    pytest.importorskip("google.cloud.storage")
    from repo_sync.sources import GCSSource

    source = open_source(spec)
    assert isinstance(source, GCSSource)
    assert (source.bucket, source.prefix) == (bucket, prefix)
    assert source.description == f"gs://{bucket}/{prefix}"


@pytest.mark.parametrize(
    ("spec", "account", "container", "prefix"),
    [
        ("as://acct/cont", "acct", "cont", ""),
        ("as://acct/cont/", "acct", "cont", ""),
        ("as://acct/cont/p", "acct", "cont", "p/"),
        ("as://acct/cont/p/q/", "acct", "cont", "p/q/"),
        ("as://acct.blob.core.windows.net/cont/p", "acct", "cont", "p/"),  # as Triton reads it
    ],
)
def test_as_urls(spec: str, account: str, container: str, prefix: str):
    pytest.importorskip("azure.storage.blob")
    from repo_sync.sources import AzureBlobSource

    source = open_source(spec)
    assert isinstance(source, AzureBlobSource)
    assert (source.account, source.container, source.prefix) == (account, container, prefix)
    assert source.description == f"as://{account}/{container}/{prefix}"
    assert source.client.url.rstrip("/") == f"https://{account}.blob.core.windows.net"
    assert source.anonymous  # no AZURE_STORAGE_KEY


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("gs://", "no bucket name"),
        ("gs:///a/b", "no bucket name"),
        ("as://acct", "no container name"),
        ("as://acct/", "no container name"),
        ("as:///cont/p", "no account name"),
        ("as://", "no account name"),
        ("ftp://host/x", "unsupported source"),
    ],
)
def test_malformed_urls_are_refused(spec: str, says: str):
    with pytest.raises(ValueError, match=says) as caught:
        open_source(spec)
    assert spec in str(caught.value)


def test_azure_account_endpoint_and_key_from_the_environment(monkeypatch):
    pytest.importorskip("azure.storage.blob")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "other")  # Triton's: it wins over the URL's
    monkeypatch.setenv("AZURE_STORAGE_KEY", "a2V5")
    source = open_source("as://acct/cont/p")
    assert source.client.url.rstrip("/") == "https://other.blob.core.windows.net"
    assert source.client.account_name == "other" and not source.anonymous

    monkeypatch.setenv("AZURE_STORAGE_BLOB_ENDPOINT", "http://127.0.0.1:10000/devstoreaccount1")
    source = open_source("as://devstoreaccount1/cont")
    assert source.client.url.rstrip("/") == "http://127.0.0.1:10000/devstoreaccount1"

    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        "BlobEndpoint=http://127.0.0.1:10001/devstoreaccount1;",
    )
    source = open_source("as://devstoreaccount1/cont")
    assert source.client.url.rstrip("/") == "http://127.0.0.1:10001/devstoreaccount1"
    assert not source.anonymous


def test_a_malformed_connection_string_is_a_source_error(monkeypatch):
    pytest.importorskip("azure.storage.blob")
    from repo_sync.sources import SourceError

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "not a connection string")
    source = open_source("as://acct/cont")
    with pytest.raises(SourceError, match="AZURE_STORAGE_CONNECTION_STRING"):
        source.list()
