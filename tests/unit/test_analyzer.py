"""``conch analyze``'s pure parts (``conch.devtools.analyzer``): the grid (default first,
each combination once, invalid ones left out and said), a candidate applied to a config,
the private copy of a model's folder, the ranking within a p99 budget, the table, and
``--write``."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.core.model_config import parse_config
from conch.devtools import analyzer
from conch.devtools.analyzer import AnalyzeError, Candidate, Point, Result

MLP = """
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _cfg(text: str = MLP):
    return parse_config(text, model="mlp", source="test")


def test_the_default_is_read_from_the_config() -> None:
    base = analyzer.from_config(_cfg())
    assert base == Candidate(64, 500, (), 1, "", default=True)
    assert base.label == "default (mbs=64 delay=500us pref=- inst=1)"
    plain = analyzer.from_config(_cfg(MLP.replace("dynamic_batching", "#")))
    assert plain.delay_us is None and plain.instances == 1


def test_the_grid_starts_with_the_default_and_holds_each_combination_once() -> None:
    base = analyzer.from_config(_cfg())
    grid, skipped = analyzer.build_grid(base, max_batch_sizes=[8, 64], delays_us=[0, 500])
    assert grid[0] is base
    assert [c.knobs[:2] for c in grid[1:]] == [(8, 0), (8, 500), (64, 0)]  # (64, 500) is base
    assert not any(c.default for c in grid[1:])
    assert skipped == []


def test_axes_not_given_hold_the_default_value() -> None:
    base = analyzer.from_config(_cfg())
    grid, _ = analyzer.build_grid(base, instance_counts=[1, 2, 3], form="process")
    assert [(c.max_batch_size, c.delay_us, c.instances, c.form) for c in grid[1:]] == [
        (64, 500, 1, "process"),
        (64, 500, 2, "process"),
        (64, 500, 3, "process"),
    ]


def test_invalid_combinations_are_left_out_and_said() -> None:
    base = analyzer.from_config(_cfg())
    grid, skipped = analyzer.build_grid(base, max_batch_sizes=[8, 32], preferred=[(), (16,)])
    assert [(c.max_batch_size, c.preferred) for c in grid[1:]] == [(8, ()), (32, ()), (32, (16,))]
    assert len(skipped) == 1 and "mbs=8" in skipped[0] and "above max_batch_size" in skipped[0]


def test_a_model_that_does_not_batch_sweeps_only_its_instances() -> None:
    base = analyzer.from_config(_cfg(MLP.replace("max_batch_size: 64", "max_batch_size: 0")))
    grid, skipped = analyzer.build_grid(base, max_batch_sizes=[8], instance_counts=[2])
    assert [(c.max_batch_size, c.instances) for c in grid] == [(0, 1), (0, 2)]
    assert "does not batch" in skipped[0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_batch_sizes": [0]},
        {"delays_us": [-1]},
        {"instance_counts": [0]},
        {"preferred": [(0,)]},
        {"form": "fiber"},
        {"max_batch_sizes": list(range(1, 40)), "delays_us": [0, 1]},  # past the bound
    ],
)
def test_a_grid_out_of_bounds_is_refused(kwargs: dict) -> None:
    with pytest.raises(AnalyzeError):
        analyzer.build_grid(analyzer.from_config(_cfg()), **kwargs)


def test_flags_parse() -> None:
    assert analyzer.parse_ints("8, 32,", "--x") == [8, 32]
    assert analyzer.parse_preferred("none,8,4+8") == [(), (8,), (4, 8)]
    with pytest.raises(AnalyzeError):
        analyzer.parse_ints("8,a", "--x")
    with pytest.raises(AnalyzeError):
        analyzer.parse_preferred("4x8")


def test_models_it_cannot_drive_are_refused() -> None:
    analyzer.check_model(_cfg(), "mlp")
    for extra in ("sequence_batching { }", "model_transaction_policy { decoupled: true }"):
        with pytest.raises(AnalyzeError):
            analyzer.check_model(
                _cfg(MLP.replace("dynamic_batching { max_queue_delay_microseconds: 500 }", extra)),
                "mlp",
            )
    with pytest.raises(AnalyzeError, match="ensemble"):
        analyzer.check_model(_cfg('name: "e" platform: "ensemble"'), "e")


def test_apply_sets_the_candidates_values_on_a_copy() -> None:
    cfg = _cfg()
    out = analyzer.apply(cfg, Candidate(16, 0, (4, 8), 2, "process"))
    assert (out.max_batch_size, out.dynamic_batching.max_queue_delay_microseconds) == (16, 0)
    assert list(out.dynamic_batching.preferred_batch_size) == [4, 8]
    assert [g.count for g in out.instance_group] == [2]
    assert out.parameters["instance_form"].string_value == "process"
    assert cfg.max_batch_size == 64 and not cfg.parameters  # the original is untouched
    assert not analyzer.apply(cfg, Candidate(8, None, (), 1)).HasField("dynamic_batching")
    # The text round-trips through conch's own parser.
    back = parse_config(analyzer.config_text(out), model="mlp", source="t")
    assert back == out


def test_stage_links_everything_but_the_config(tmp_path: Path) -> None:
    model = tmp_path / "src" / "mlp"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"x" * 100)
    (model / "labels.txt").write_text("a\n")
    (model / "config.pbtxt").write_text(MLP)
    (model / "config.pbtxt.orig").write_text(MLP)
    dest = analyzer.stage(model, analyzer.apply(_cfg(), Candidate(8, 0, (), 1)), tmp_path / "r")
    assert dest == tmp_path / "r" / "mlp"
    assert sorted(p.name for p in dest.iterdir()) == ["1", "config.pbtxt", "labels.txt"]
    assert (dest / "1").is_symlink() and (dest / "labels.txt").is_symlink()
    assert (dest / "1" / "model.onnx").read_bytes() == b"x" * 100
    assert (
        parse_config((dest / "config.pbtxt").read_text(), model="mlp", source="t").max_batch_size
        == 8
    )


def _result(candidate: Candidate, *points: tuple[int, float, float]) -> Result:
    return Result(candidate, [Point(c, ips, p99 / 2, p99) for c, ips, p99 in points])


DEFAULT = Candidate(64, 500, (), 1, default=True)
SMALL = Candidate(8, 500, (), 1)
TWO = Candidate(64, 500, (), 2)


def test_the_best_point_is_the_highest_throughput_within_the_budget() -> None:
    r = _result(DEFAULT, (1, 100, 5), (8, 500, 40), (32, 900, 120))
    assert r.best(50).concurrency == 8
    assert r.best(None).concurrency == 32
    assert r.best(1) is None


def test_ranking_is_best_first_and_leaves_out_what_misses_the_budget() -> None:
    results = [
        _result(DEFAULT, (1, 100, 5), (8, 500, 40)),
        _result(SMALL, (1, 120, 4), (8, 700, 45)),
        _result(TWO, (1, 90, 60)),  # nothing within 50 ms
    ]
    ranked = analyzer.rank(results, 50)
    assert [(r.candidate, p.infer_per_s) for r, p in ranked] == [(SMALL, 700), (DEFAULT, 500)]
    # A tie on throughput and p99 keeps the default ahead.
    tie = [_result(SMALL, (8, 500, 40)), _result(DEFAULT, (8, 500, 40))]
    assert analyzer.rank(tie, 50)[0][0].candidate is DEFAULT
    # A point that was not measured never counts.
    failed = Result(SMALL, [Point(8, error="refused")])
    assert analyzer.rank([failed], None) == []


def test_the_table_and_json_mark_and_rank(tmp_path: Path) -> None:
    sweep = analyzer.Sweep("mlp", 50.0)
    sweep.results = [
        _result(DEFAULT, (1, 100, 5), (8, 500, 40)),
        _result(SMALL, (1, 120, 4), (8, 700, 45)),
        _result(TWO, (1, 90, 60)),
    ]
    sweep.not_measured = [Candidate(8, 0, (), 1)]
    text = analyzer.table(sweep).splitlines()
    body = [line for line in text[2:] if line.strip()]
    assert body[0].split()[0] == "1" and SMALL.label in body[0]
    assert body[1].endswith("yes *")  # SMALL's best point
    assert DEFAULT.label in body[2] and body[2].split()[0] == "2"
    assert TWO.label in body[4] and body[4].split()[0] == "-" and body[4].endswith("no")
    summary = analyzer.summary(sweep)
    assert "best within p99 <= 50 ms: " + SMALL.label in summary
    assert "(1.40x)" in summary and "not measured (--budget-s): mbs=8 delay=0us" in summary
    data = sweep.to_json()
    assert data["best"] == SMALL.label
    assert [c["rank"] for c in data["configs"]] == [2, 1, None]
    assert data["configs"][2]["points"][0]["meets_budget"] is False


def test_write_best_keeps_a_backup_and_says_what_changed(tmp_path: Path) -> None:
    model = tmp_path / "mlp"
    model.mkdir()
    (model / "config.pbtxt").write_text(MLP)
    said = analyzer.write_best(model, _cfg(), Candidate(8, 0, (), 2))
    assert "max_batch_size 64 -> 8" in said and "instance count 1 -> 2" in said
    assert (model / "config.pbtxt.orig").read_text() == MLP
    cfg = parse_config((model / "config.pbtxt").read_text(), model="mlp", source="t")
    assert (cfg.max_batch_size, cfg.instance_group[0].count) == (8, 2)
    # Written again, the older backup is kept; the default writes nothing.
    analyzer.write_best(model, cfg, Candidate(16, 0, (), 1))
    assert (model / "config.pbtxt.orig").read_text() == MLP
    assert "left as it is" in analyzer.write_best(model, cfg, DEFAULT)


def test_the_picture_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    sweep = analyzer.Sweep("mlp", 50.0)
    sweep.results = [_result(DEFAULT, (1, 100, 5), (8, 500, 40)), _result(SMALL, (1, 120, 4))]
    assert analyzer.picture(sweep, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    analyzer.html_page(sweep, tmp_path / "p.png", tmp_path / "index.html")
    assert 'src="p.png"' in (tmp_path / "index.html").read_text()
