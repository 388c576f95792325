"""The HTTP API against its own OpenAPI document, on the real path.

The gateway serves the document (``GET /v2/openapi.json``) and a page to browse it
(``GET /v2/docs``) that loads nothing from elsewhere. Then schemathesis, run as a user runs
it (its CLI, settings in tests/schemathesis.toml), fuzzes every operation of the document
against a real stack (private Redis, a worker, the gateway under gunicorn, explicit model
control): valid and invalid requests, bounded in examples and in time. Every answer must be
no 5xx and match the document (status, content type, headers, body). After the run the
worker and the gateway's worker process must still be the ones that started, and a
plain infer call must still be answered.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from conch.frontend.http import openapi

from harness import ROOT, Service, fresh_db, serving
from models import add_model, identity_model

MODELS = ("add", "identity", "spare")  # spare: the one the load and unload fuzzing may take away
FUZZ_SECONDS = 25  # schemathesis' --max-time: it stops generating once this is spent
FUZZ_DEADLINE_S = 180  # past this the run has hung: the test fails


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, log_dir: Path, s3_endpoint: str
) -> Iterator[tuple[str, Service, Service]]:
    repo = tmp_path_factory.mktemp("openapi") / "models"
    add_model(repo / "add")
    identity_model(repo / "identity")
    add_model(repo / "spare")
    with serving(
        repo,
        fresh_db(redis_url, 15),
        log_dir,
        MODELS,
        flags=("--model-control-mode", "explicit", "--load-model", "*"),
        # Batch jobs the fuzzing starts read and write S3: the local one, never the internet's.
        worker_env={"AWS_ENDPOINT_URL": s3_endpoint},
    ) as running:
        yield running


def test_the_document_and_its_page_are_served(stack: tuple[str, Service, Service]) -> None:
    url = stack[0]
    r = requests.get(f"http://{url}/v2/openapi.json", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    assert r.json() == openapi.document()
    page = requests.get(f"http://{url}/v2/docs", timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert '"url": "/v2/openapi.json"' in page.text
    # Everything the page loads comes from the gateway itself: it works offline.
    assert not re.search(r"(?:src|href)=\"(?:https?:)?//", page.text)
    assets = re.findall(r"(?:src|href)=\"([^\"]+)\"", page.text)
    assert {"/v2/docs/swagger-ui-bundle.js", "/v2/docs/swagger-ui.css"} <= set(assets)
    for asset in assets:
        got = requests.get(urljoin(f"http://{url}/v2/docs", asset), timeout=10)
        assert got.status_code == 200 and got.content, asset
    missing = requests.get(f"http://{url}/v2/docs/no-such-file.js", timeout=10)
    assert missing.status_code == 404 and missing.json() == {"error": "Not Found"}


def test_every_answer_matches_the_document(
    stack: tuple[str, Service, Service], tmp_path: Path
) -> None:
    url, worker, gateway = stack
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(ROOT / "tests" / "schemathesis.toml"),
        "run",
        f"http://{url}/v2/openapi.json",
        "--max-time",
        str(FUZZ_SECONDS),
        "--seed",
        "13",
    ]
    # cwd: schemathesis and hypothesis keep their caches there, not in the checkout.
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
    run = subprocess.run(
        cmd,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=FUZZ_DEADLINE_S,
        check=False,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-12000:]
    assert re.search(r"\d+ generated, \d+ passed", report), report[-4000:]

    # Nothing crashed: the same worker, and the gateway's first worker process only.
    assert worker.alive(), worker.log()[-4000:]
    assert gateway.alive(), gateway.log()[-4000:]
    assert gateway.log().count("Booting worker") == 1, gateway.log()[-4000:]
    client = httpclient.InferenceServerClient(url)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    inputs = [httpclient.InferInput(name, [2, 4], "FP32") for name in ("A", "B")]
    for i in inputs:
        i.set_data_from_numpy(a)
    result = client.infer("add", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUT"), a + a)
