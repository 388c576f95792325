"""model_warmup runs before a model is reported ready, and a failing warmup says why."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient

from harness import start_gateway, start_worker, wait_model_ready, wait_until
from models import add_model, slow_model

WARM_SLOW = """
model_warmup [ {
  name: "zeros" batch_size: 2 count: 6
  inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
} ]
"""

WARM_FILE = """
model_warmup [ {
  name: "from_file" batch_size: 1
  inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "a.bin" } }
  inputs { key: "B" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } }
} ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("warmup") / "models"
    slow_model(root / "warm_slow")
    with (root / "warm_slow" / "config.pbtxt").open("a") as f:
        f.write(WARM_SLOW)
    add_model(root / "warm_file", extra=WARM_FILE)
    (root / "warm_file" / "warmup").mkdir()
    (root / "warm_file" / "warmup" / "a.bin").write_bytes(np.arange(4, dtype="<f4").tobytes())
    add_model(root / "warm_missing", extra=WARM_FILE)  # no warmup/a.bin
    add_model(root / "warm_short", extra=WARM_FILE)
    (root / "warm_short" / "warmup").mkdir()
    (root / "warm_short" / "warmup" / "a.bin").write_bytes(b"\0" * 12)  # one float short
    return root


def index(url: str) -> dict[str, dict]:
    return {
        m["name"]: m for m in httpclient.InferenceServerClient(url).get_model_repository_index()
    }


def test_warmup_runs_before_ready_and_bad_warmups_say_why(
    repo: Path, redis_url: str, log_dir: Path
) -> None:
    db = redis_url.rsplit("/", 1)[0] + "/7"
    redis.Redis.from_url(db).flushdb()
    gateway, url = start_gateway(repo, db, log_dir)
    worker = start_worker(repo, db, log_dir)
    try:
        # The slow model's warmup takes seconds: meanwhile it is LOADING, not ready.
        wait_until(
            lambda: index(url).get("warm_slow", {}).get("state") == "LOADING", 60, "LOADING", worker
        )
        assert not httpclient.InferenceServerClient(url).is_model_ready("warm_slow")
        wait_model_ready(url, "warm_slow", 60, worker, gateway)
        log = worker.log()
        assert (
            "model 'warm_slow' version 1 instance warm_slow_0: warmup 'zeros' (6 x 2 requests)"
            in log
        )
        # Ready means warmed: the warmup line was written before readiness was reported.
        assert log.index("warmup 'zeros'") < log.index(
            "ready with 1 instance(s)", log.index("'warm_slow'")
        )

        wait_model_ready(url, "warm_file", 30, worker)
        a = np.ones((1, 4), np.float32)
        inputs = []
        for name in ("A", "B"):
            i = httpclient.InferInput(name, [1, 4], "FP32")
            i.set_data_from_numpy(a)
            inputs.append(i)
        out = httpclient.InferenceServerClient(url).infer("warm_file", inputs).as_numpy("OUT")
        np.testing.assert_array_equal(out, a + a)

        wait_until(
            lambda: (
                index(url)["warm_short"].get("state") == "UNAVAILABLE"
                and "reason" in index(url)["warm_short"]
            ),
            30,
            "warm_short to fail",
            worker,
        )
        rows = index(url)
        assert (
            "a.bin" in rows["warm_missing"]["reason"]
            and "warm_missing" in rows["warm_missing"]["reason"]
        )
        assert "a.bin" in rows["warm_short"]["reason"]
        assert not httpclient.InferenceServerClient(url).is_model_ready("warm_missing")
        time.sleep(0.1)
        assert worker.alive()
    finally:
        gateway.stop()
        worker.stop()
