"""Shared fixtures (a private redis-server and a moto S3 server per test session), and the
markers that say what each test needs, applied here from what it uses so they cannot drift.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import boto3
import pytest
import redis

from conch.devtools.processes import wait_until
from conch.devtools.redis_server import free_port, start_private

TESTS = Path(__file__).parent

# A test that asks for one of these fixtures, or whose module can start a redis-server of
# its own, needs Redis; one that asks for these, the S3 server.
REDIS_FIXTURES = frozenset({"redis_url", "rclient"})
REDIS_STARTERS = frozenset(
    {
        ("harness", "start_redis"),
        ("harness", "DurableRedis"),
        ("harness", "start_serve"),  # conch serve starts one when given no Redis
        ("conch.devtools.redis_server", "start_private"),
    }
)
S3_FIXTURES = frozenset({"s3_endpoint", "s3"})

# The modules under integration/ that finish in a few seconds (measured on a whole run of
# the suite), so `pytest -m "not slow"` keeps them; every other one there is slow.
QUICK_INTEGRATION = frozenset(
    {
        "integration/autoscale/test_autoscale_pool.py",
        "integration/backends/test_tensorrt_backend.py",
        "integration/cache/test_response_cache_parts.py",
        "integration/deploy/test_dashboard.py",
        "integration/jobs/test_jobs_offline.py",
        "integration/redis/test_dispatch.py",
        "integration/redis/test_redis_client.py",
        "integration/redis/test_redis_link.py",
        "integration/redis/test_unix_socket.py",
        "integration/redis/test_wire_keys.py",
        "integration/redis/test_work_owed.py",
        "integration/repository/test_repo_sync_rules.py",
        "integration/serving/test_unsupported_config.py",
    }
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``redis``, ``s3`` and ``slow`` on the tests that need them (``gpu`` is on the tests
    themselves: each skips without a CUDA GPU)."""
    starts_redis: dict[ModuleType | None, bool] = {}
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        module = getattr(item, "module", None)
        if module not in starts_redis:
            starts_redis[module] = _starts_redis(module)
        if fixtures & REDIS_FIXTURES or starts_redis[module]:
            item.add_marker(pytest.mark.redis)
        if fixtures & S3_FIXTURES:
            item.add_marker(pytest.mark.s3)
        where = item.path.relative_to(TESTS).as_posix()
        if where.startswith("integration/") and where not in QUICK_INTEGRATION:
            item.add_marker(pytest.mark.slow)


def _starts_redis(module: ModuleType | None) -> bool:
    """Whether ``module`` holds a way to start a redis-server (``REDIS_STARTERS``)."""
    if module is None:
        return False
    held = (
        (getattr(v, "__module__", None), getattr(v, "__qualname__", None))
        for v in vars(module).values()
    )
    return not REDIS_STARTERS.isdisjoint(held)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    server = start_private()
    yield server.url
    server.stop()


@pytest.fixture()
def rclient(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from models import build_repository

    return build_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server process on a free loopback port, and dummy AWS settings for boto3."""
    saved = dict(os.environ)
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp_path_factory.mktemp("aws") / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path_factory.mktemp("aws") / "none"),
    )
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(var, None)
    port = free_port()
    log_file = tmp_path_factory.mktemp("moto") / "moto.log"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    try:
        proc = _serve(argv, port, log_file, "moto server")
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            _end(proc)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def s3(s3_endpoint: str):
    return boto3.client("s3", endpoint_url=s3_endpoint)


def _serve(
    argv: list[str], port: int, log_file: Path, what: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start ``argv`` (a server on 127.0.0.1:``port``) and wait until it accepts connections."""
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def answers() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def watch() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} did not start: {log_file.read_text()}")

    if not wait_until(answers, 30, watch=watch, every=0.05):
        _end(proc)
        raise RuntimeError(f"{what} did not start: {log_file.read_text()}")
    return proc


def _end(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Google Cloud Storage emulator (the gcp-storage-emulator package, in memory) on a free
    loopback port, and STORAGE_EMULATOR_HOST pointing google-cloud-storage at it."""
    pytest.importorskip("gcp_storage_emulator", reason="pip install -e '.[dev]'")
    port = free_port()
    log_file = tmp_path_factory.mktemp("gcs") / "gcs.log"
    argv = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1"]
    proc = _serve([*argv, "--port", str(port), "--in-memory"], port, log_file, "the GCS emulator")
    url = f"http://127.0.0.1:{port}"
    saved = dict(os.environ)
    os.environ["STORAGE_EMULATOR_HOST"] = url
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        os.environ.pop(var, None)
    try:
        yield url
    finally:
        _end(proc)
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def gcs(gcs_endpoint: str):
    """A google-cloud-storage client of the emulator (anonymous, as emulators take)."""
    from google.cloud import storage

    return storage.Client(project="conch-tests")


def gcs_bucket(gcs, files: dict[str, bytes], prefix: str = "") -> str:
    """A new bucket holding ``files`` (relative key -> bytes) under ``prefix``; its name."""
    import uuid

    bucket = gcs.create_bucket(f"models-{uuid.uuid4().hex[:12]}")
    for rel, data in files.items():
        bucket.blob(f"{prefix}/{rel}" if prefix else rel).upload_from_string(data)
    return bucket.name


# Azurite's well-known development account (published in Azure's documentation).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_BLOB = TESTS.parent / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"


@pytest.fixture(scope="session")
def azure_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's blob service (npm's azurite, installed by `make azurite`) on a free loopback
    port, and Triton's AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY for its development
    account, with AZURE_STORAGE_BLOB_ENDPOINT naming it; the endpoint's URL."""
    pytest.importorskip("azure.storage.blob", reason="pip install -e '.[azure]'")
    if not AZURITE_BLOB.exists():
        pytest.skip("run make test (it installs azurite)")
    port = free_port()
    folder = tmp_path_factory.mktemp("azurite")
    argv = [str(AZURITE_BLOB), "--blobHost", "127.0.0.1", "--blobPort", str(port)]
    argv += ["--location", str(folder / "data"), "--silent", "--skipApiVersionCheck"]
    argv += ["--disableTelemetry"]
    proc = _serve(argv, port, folder / "azurite.log", "azurite")
    url = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    saved = dict(os.environ)
    os.environ.update(
        AZURE_STORAGE_ACCOUNT=AZURITE_ACCOUNT,
        AZURE_STORAGE_KEY=AZURITE_KEY,
        AZURE_STORAGE_BLOB_ENDPOINT=url,
    )
    os.environ.pop("AZURE_STORAGE_CONNECTION_STRING", None)
    try:
        yield url
    finally:
        _end(proc)
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def azure_blob(azure_endpoint: str):
    """An azure-storage-blob service client of Azurite, with the development account's key."""
    from azure.storage.blob import BlobServiceClient

    key = {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}
    return BlobServiceClient(azure_endpoint, credential=key)


def azure_container(azure_blob, files: dict[str, bytes], prefix: str = "") -> str:
    """A new container holding ``files`` (relative key -> bytes) under ``prefix``; its name."""
    import uuid

    container = azure_blob.create_container(f"models-{uuid.uuid4().hex[:12]}")
    for rel, data in files.items():
        container.upload_blob(f"{prefix}/{rel}" if prefix else rel, data)
    return container.container_name
