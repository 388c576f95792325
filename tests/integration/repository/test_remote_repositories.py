"""``--model-repository`` in object storage, through the real path (issue 32, point 1).

A moto S3 server holds the repository; ``conch serve`` (and a worker, a gateway) are
started with Triton's launch line and read it through repo_sync's mirror
(``conch.cli.repository_mirror``). Each test checks what a Triton user would see: the
models served and answering, poll mode following the bucket, explicit loads reading it,
several repositories served as one, and a bucket that cannot be read stopping the start
with a message that names the flag, while what already serves keeps serving.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from conch.devtools.processes import conch
from conch.devtools.redis_server import free_port

from conftest import AZURITE_ACCOUNT, azure_container, gcs_bucket
from harness import Service, start_serve, wait_model_ready, wait_until

ROOT = Path(__file__).resolve().parents[3]
MLP = ROOT / "functions" / "mlp"
ADD_SUB = ROOT / "functions" / "add_sub"
LAUNCH_LINE = (
    "--model-repository=s3://models/triton-repo",
    "--model-control-mode=poll",
    "--repository-poll-secs=30",
    "--strict-model-config=false",
    "--log-verbose=1",
)


def upload(s3, bucket: str, prefix: str, model: Path, name: str | None = None) -> None:
    """``model``'s folder under ``s3://bucket/prefix/<name>/``, as a Triton user uploads it
    (its config's name made ``name``)."""
    for path in sorted(p for p in model.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        key = f"{prefix}/{name or model.name}/{path.relative_to(model).as_posix()}"
        body = path.read_bytes()
        if path.name == "config.pbtxt" and name:  # the config names its folder
            body = body.replace(f'name: "{model.name}"'.encode(), f'name: "{name}"'.encode())
        s3.put_object(Bucket=bucket, Key=key, Body=body)


def remove(s3, bucket: str, prefix: str) -> None:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    for obj in listed:
        s3.delete_object(Bucket=bucket, Key=obj["Key"])


def mlp_answers(url: str, model: str = "mlp") -> None:
    """``model`` at ``url`` answers as onnxruntime does on functions/mlp's file."""
    x = np.random.default_rng(0).standard_normal((3, 64), dtype=np.float32)
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer(model, [inp]).as_numpy("OUTPUT0")
    session = ort.InferenceSession(
        str(MLP / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_allclose(got, session.run(None, {"INPUT0": x})[0], rtol=1e-5, atol=1e-5)


def _post(url: str, path: str) -> int:
    request = urllib.request.Request(f"http://{url}{path}", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _index(url: str) -> dict[str, dict]:
    """The repository index by model name; empty while the gateway is not up."""
    request = urllib.request.Request(f"http://{url}/v2/repository/index", data=b"{}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return {m["name"]: m for m in json.load(resp)}
    except (urllib.error.URLError, ConnectionError):
        return {}


@pytest.fixture(scope="module")
def aws_env(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What a Triton user sets for a custom S3 endpoint (moto's), and a cache of their own
    for this module's processes."""
    cache = tmp_path_factory.mktemp("repository-cache")
    return {"AWS_ENDPOINT_URL": s3_endpoint, "CONCH_MODEL_REPOSITORY_CACHE": str(cache)}


@pytest.fixture(scope="module")
def bucket(s3) -> str:
    s3.create_bucket(Bucket="models")
    return "models"


@pytest.fixture(scope="module")
def launched(
    s3, bucket: str, redis_url: str, log_dir: Path, aws_env: dict[str, str]
) -> Iterator[str]:
    """``conch serve`` started with the Triton launch line unchanged (ports and Redis
    added), serving functions/mlp from s3://models/triton-repo; its HTTP URL once ready."""
    upload(s3, bucket, "triton-repo", MLP)
    svc, url, _ = start_serve(
        Path("unused"), redis_url, log_dir, name="serve-s3", env=aws_env, argv=LAUNCH_LINE
    )
    try:
        wait_model_ready(url, "mlp", 120, svc)
        yield url
    finally:
        svc.stop()


def test_the_triton_launch_line_serves_the_bucket(launched: str) -> None:
    mlp_answers(launched)


def test_a_bucket_that_cannot_be_read_stops_the_start_and_others_keep_serving(
    launched: str, redis_url: str, log_dir: Path, aws_env: dict[str, str]
) -> None:
    bad = {
        "s3://no-such-bucket/triton-repo": "NoSuchBucket",
        f"s3://127.0.0.1:{free_port()}/models/triton-repo": "Could not connect",
    }
    for spec, cause in bad.items():
        svc = Service(
            "worker-bad-bucket",
            conch("worker", f"--model-repository={spec}", "--redis-url", redis_url),
            log_dir,
            env=aws_env,
        )
        try:
            code = svc.proc.wait(timeout=120)
        finally:
            svc.stop()
        log = svc.log()
        assert code != 0
        assert f"conch: --model-repository {spec}" in log and cause in log, log[-2000:]
    mlp_answers(launched)  # the fleet already serving is untouched


def test_poll_mode_follows_the_bucket(
    s3, bucket: str, redis_url: str, log_dir: Path, aws_env: dict[str, str]
) -> None:
    prefix = f"poll-{uuid.uuid4().hex[:8]}"
    upload(s3, "models", prefix, MLP)
    argv = (f"--model-repository=s3://models/{prefix}", "--model-control-mode=poll")
    argv += ("--repository-poll-secs=1",)
    svc, url, _ = start_serve(Path("unused"), redis_url, log_dir, env=aws_env, argv=argv)
    try:
        wait_model_ready(url, "mlp", 120, svc)
        upload(s3, "models", prefix, MLP, name="mlp_added")
        wait_model_ready(url, "mlp_added", 60, svc)
        mlp_answers(url, "mlp_added")
        remove(s3, "models", f"{prefix}/mlp_added")
        client = httpclient.InferenceServerClient(url)
        wait_until(lambda: not client.is_model_ready("mlp_added"), 60, "mlp_added gone", svc)
        assert client.is_model_ready("mlp")
    finally:
        svc.stop()


def test_explicit_mode_loads_from_the_bucket(
    s3, bucket: str, redis_url: str, log_dir: Path, aws_env: dict[str, str]
) -> None:
    prefix = f"explicit-{uuid.uuid4().hex[:8]}"
    upload(s3, "models", prefix, MLP)
    argv = (f"--model-repository=s3://models/{prefix}", "--model-control-mode=explicit")
    argv += ("--repository-poll-secs=1",)
    svc, url, _ = start_serve(Path("unused"), redis_url, log_dir, env=aws_env, argv=argv)
    try:
        wait_until(lambda: "mlp" in _index(url), 120, "the index lists mlp", svc)
        assert _post(url, "/v2/repository/models/mlp/load") == 200
        wait_model_ready(url, "mlp", 60, svc)
        mlp_answers(url)
        # A model uploaded after the start is loaded from the bucket once the mirror has it.
        upload(s3, "models", prefix, MLP, name="mlp_later")
        wait_until(lambda: "mlp_later" in _index(url), 30, "the index lists mlp_later", svc)
        assert _post(url, "/v2/repository/models/mlp_later/load") == 200
        wait_model_ready(url, "mlp_later", 60, svc)
        mlp_answers(url, "mlp_later")
    finally:
        svc.stop()


def test_several_repositories_serve_as_one(
    s3, bucket: str, redis_url: str, log_dir: Path, aws_env: dict[str, str], tmp_path: Path
) -> None:
    """A folder and a bucket, repeated as Triton takes them: the models of both serve, and
    a name in both is unavailable, with the reason, while the others serve."""
    prefix = f"several-{uuid.uuid4().hex[:8]}"
    upload(s3, "models", prefix, MLP)
    upload(s3, "models", prefix, MLP, name="twice")
    folder = tmp_path / "local"
    (folder / "mlp_local").mkdir(parents=True)
    (folder / "mlp_local" / "config.pbtxt").write_text(
        (MLP / "config.pbtxt").read_text().replace('name: "mlp"', 'name: "mlp_local"')
    )
    (folder / "mlp_local" / "1").mkdir()
    (folder / "mlp_local" / "1" / "model.onnx").write_bytes((MLP / "1" / "model.onnx").read_bytes())
    (folder / "twice").symlink_to(folder / "mlp_local", target_is_directory=True)
    argv = (f"--model-repository={folder}", f"--model-repository=s3://models/{prefix}")
    svc, url, _ = start_serve(Path("unused"), redis_url, log_dir, env=aws_env, argv=argv)
    try:
        wait_model_ready(url, "mlp", 120, svc)
        wait_model_ready(url, "mlp_local", 60, svc)
        mlp_answers(url)
        mlp_answers(url, "mlp_local")
        twice = _index(url)["twice"]
        assert twice["state"] == "UNAVAILABLE"
        assert "more than one model repository" in twice["reason"]
    finally:
        svc.stop()


def _files(model: Path, prefix: str) -> dict[str, bytes]:
    return {
        f"{prefix}/{p.relative_to(model).as_posix()}": p.read_bytes()
        for p in sorted(model.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("scheme", ["gs", "as"])
def test_gcs_and_azure_repositories_serve(
    scheme: str, request: pytest.FixtureRequest, redis_url: str, log_dir: Path, aws_env: dict
) -> None:
    """``gs://bucket/path`` against a GCS emulator and ``as://account/container/path``
    against Azurite, each credentialed through the environment as Triton's are."""
    files = _files(MLP, "mlp")
    if scheme == "gs":
        url = f"gs://{gcs_bucket(request.getfixturevalue('gcs'), files, prefix='repo')}/repo"
    else:
        container = azure_container(request.getfixturevalue("azure_blob"), files, prefix="repo")
        url = f"as://{AZURITE_ACCOUNT}/{container}/repo"
    argv = (f"--model-repository={url}", "--model-control-mode=none")
    svc, http_url, _ = start_serve(Path("unused"), redis_url, log_dir, env=aws_env, argv=argv)
    try:
        wait_model_ready(http_url, "mlp", 120, svc)
        mlp_answers(http_url)
    finally:
        svc.stop()
