"""bench/text_embedding.py's pure parts: the sentences it sends, their wire forms, its
tables and its goals' verdicts."""

from __future__ import annotations

import json

import pytest

from unit.bench._bench import bench_module


@pytest.fixture(scope="module")
def te():
    return bench_module("text_embedding")


@pytest.fixture(scope="module")
def corpus():
    return bench_module("te_corpus")


def test_sentences_are_fixed_by_the_seed_and_5_to_40_words(corpus) -> None:
    texts = corpus.sentences(500)
    assert texts == corpus.sentences(500)  # the same set for every server and run
    assert texts != corpus.sentences(500, seed=corpus.SEED + 1)
    assert corpus.sentences(20) == texts[:20]  # a smaller corpus is a prefix
    counts = [len(t.split()) for t in texts]
    # A number may be inserted: at most one word more than the 40 drawn.
    assert min(counts) >= corpus.MIN_WORDS and max(counts) <= corpus.MAX_WORDS + 1
    assert len(set(texts)) == len(texts)
    assert all((t[0].isupper() or t[0].isdigit()) and t[-1] in ".?!" for t in texts)


def test_the_jsonl_is_one_triton_request_per_line_with_ids(corpus) -> None:
    texts = corpus.sentences(3)
    lines = corpus.jsonl(texts).decode().splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "id": f"s{i}",
            "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [t]}],
        }
        for i, t in enumerate(texts)
    ]


def test_perf_analyzer_data_is_one_text_per_request(corpus) -> None:
    doc = corpus.perf_analyzer_data(["a b", "c"])
    assert doc == {
        "data": [
            {"TEXT": {"content": ["a b"], "shape": [1]}},
            {"TEXT": {"content": ["c"], "shape": [1]}},
        ]
    }


def _cells(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_the_online_table_compares_with_the_better_in_process_batch(te) -> None:
    results = te.TeResults()
    P = te.run.Point
    results.online.points += [
        P("conch", te.MODEL, 16, infer_per_s=120.0, p50_ms=130.0, p99_ms=200.0),
        P(te.MLSERVER_TAG, te.MODEL, 16, infer_per_s=100.0, p50_ms=150.0, p99_ms=400.0),
        P("triton", te.MODEL, 16, infer_per_s=150.0, p50_ms=100.0, p99_ms=180.0),
    ]
    results.encoder_batch[16] = 7.6
    results.inprocess = {te.ST_NAME: {1: 50.0, 8: 240.0}, te.STEPS_NAME: {1: 200.0, 8: 160.0}}
    (row,) = _cells(te.format_online_table(results, [16]))
    assert row[:5] == ["16", "120.0", "130.0", "200.0", "7.6"]
    assert row[8] == "1.20"  # ÷ MLServer
    assert row[12] == "0.80"  # ÷ Triton
    # In process: each embedder's better of batch 1 and round(7.6) = 8.
    assert row[13:] == ["240.0 @ 8", "0.50", "200.0 @ 1", "0.60"]


def test_missing_peers_read_as_not_measured(te) -> None:
    results = te.TeResults()
    results.online.points.append(te.run.Point("conch", te.MODEL, 1, infer_per_s=60.0))
    (row,) = _cells(te.format_online_table(results, [1]))
    assert row[5:9] == ["-", "-", "-", "n/a"] and row[13] == "n/a"


def test_goals_pass_and_fail_on_their_thresholds(te) -> None:
    results = te.TeResults()
    assert [v for _, _, v in te.goals(results)] == ["SKIP", "SKIP"]
    results.corpus_encode = {32: 400.0, 64: 500.0, 256: 450.0}
    results.job = te.BatchJob(lines=20_000, seconds=50.0)  # 400 lines/s: 80% of 500
    results.coexist = te.Coexist(
        alone=te.run.Point("conch", te.MODEL, 16, infer_per_s=100.0),
        beside=te.run.Point("conch", te.MODEL, 16, infer_per_s=84.0),
    )
    (_, job_measured, job_ok), (_, co_measured, co_ok) = te.goals(results)
    assert job_ok == "PASS" and "batch_size=64" in job_measured
    assert co_ok == "FAIL" and co_measured.startswith("0.84x")
    results.job = te.BatchJob(lines=20_000, seconds=51.0)
    assert te.goals(results)[0][2] == "FAIL"
    assert te.best_encode(results) == (64, 500.0)
