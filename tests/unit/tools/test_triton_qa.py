"""make triton-qa's own logic (tools/triton_qa): which cases run, how a run's result reads,
the repository edits that stand for a test.sh's sed and echo (their models served as
written, identity models included), and reading Triton's checkout. The files of Triton's
it reads are never here: the configs below are written for these tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

import conch
from conch.core.model_config import parse_config
from tools.triton_qa import cases, run
from tools.triton_qa.cases import GROUPS, Group, unit
from tools.triton_qa.repository import (
    Build,
    append,
    nop_version_dirs,
    sed,
    sed_first,
)
from tools.triton_qa.run import Result, outcome, reason, select, summary, table
from tools.triton_qa.source import SourceError, resolve

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

# The rows of issue 40's table: each must stay in the chosen set.
ISSUE_ROWS = (
    *(
        f"L0_infer_zero/infer_zero_test.py :: {t}"
        for t in (
            *("test_ff1", "test_bb1_0"),
            *(f"test_ff3_{i}" for i in range(5)),
            *(f"test_hh1_{i}" for i in range(3)),
            *(f"test_hh3_{i}" for i in range(5)),
        )
    ),
    *(
        f"L0_model_queue/model_queue_test.py :: {t}"
        for t in ("test_priority_levels", "test_max_priority_levels", "test_priority_with_policy")
    ),
    *(f"L0_infer_reshape/infer_reshape_test.py :: test_ff{i}" for i in (2, 3, 4)),
    "L0_http/http_test.py :: test_content_encoding_chunked_manually",
    "L0_http/http_test.py :: test_descriptive_status_code",
    "L0_metrics/metrics_queue_size_test.py :: test_sequence_batch_scheduler_direct",
    "L0_metrics/metrics_queue_size_test.py :: test_sequence_batch_scheduler_oldest",
    "L0_backend_python/lifecycle/lifecycle_test.py :: test_infer_pymodel_error",
    "L0_http/http_input_size_limit_test.py :: test_json_dtype_size_expansion_exceeds_limit_error",
    *(
        f"L0_model_config/compare_status.py :: onnx/{t}"
        for t in ("cpu_instance", "empty_config", "no_config")
    ),
)


def _config(model: Path) -> ModelConfig:
    return parse_config(
        (model / "config.pbtxt").read_text(), model=model.name, source="config.pbtxt"
    )


def _labels(groups: list[Group] | tuple[Group, ...]) -> list[str]:
    return [c.label for g in groups for c in g.cases]


def test_the_chosen_set_holds_every_row_of_the_issue_once():
    labels = _labels(GROUPS)
    assert len(ISSUE_ROWS) == 30
    assert sorted(set(ISSUE_ROWS) - set(labels)) == []
    assert len(labels) == len(set(labels))
    assert len({g.name for g in GROUPS}) == len(GROUPS)


def test_every_group_reads_qa_common_and_its_cases_folders():
    lifecycle = next(g for g in GROUPS if g.name == "python_lifecycle")
    assert lifecycle.needs == {"qa/common", "qa/L0_backend_python/lifecycle", "qa/python_models"}
    assert all("qa/common" in g.needs for g in GROUPS)


def test_a_test_sh_that_restarts_per_case_gives_a_server_per_case():
    queue = [g for g in GROUPS if g.name.startswith("model_queue.")]
    assert [len(g.cases) for g in queue] == [1] * 7
    assert {g.cases[0].case for g in queue} == set(cases.QUEUE_POLICIES)


def test_select_keeps_the_cases_a_pattern_names_and_drops_empty_groups():
    a = Group("alpha", lambda b, r: None, unit("L0_a/a_test.py", "A", "test_one", "test_two"))
    b = Group("beta", lambda b, r: None, unit("L0_b/b_test.py", "B", "test_one"))
    assert _labels(select([a, b], [])) == _labels([a, b])
    assert _labels(select([a, b], ["test_two"])) == ["L0_a/a_test.py :: test_two"]
    assert _labels(select([a, b], ["beta", "a_test.py :: test_one"])) == [
        "L0_a/a_test.py :: test_one",
        "L0_b/b_test.py :: test_one",
    ]
    assert select([a, b], ["nothing"]) == []


def test_a_unittest_case_runs_alone_by_class_and_name():
    [case] = unit("L0_x/x_test.py", "XTest", "test_y")
    assert case.argv == ("XTest.test_y",)
    assert case.label == "L0_x/x_test.py :: test_y"


UNITTEST_FAILURE = """\
E
======================================================================
ERROR: test_ff1 (__main__.InferZeroTest.test_ff1)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "infer_util.py", line 9, in infer_zero
    raise error
tritonclient.utils.InferenceServerException: [500] model 'm' returned a bad output
----------------------------------------------------------------------
Ran 1 test in 0.018s

FAILED (errors=1)
"""


def test_outcome_reads_the_exit_status_and_the_last_error_line():
    assert outcome(0, "Ran 1 test in 0.1s\n\nOK\n") == ("passed", "")
    assert outcome(1, UNITTEST_FAILURE) == (
        "failed",
        "tritonclient.utils.InferenceServerException: [500] model 'm' returned a bad output",
    )
    assert outcome(None, "") == ("failed", "timed out")
    assert outcome(1, "Model config doesn't match any expected output:\nconfig {\n}\n") == (
        "failed",
        "Model config doesn't match any expected output:",
    )
    assert outcome(0, "s\nRan 1 test in 0.0s\n\nOK (skipped=1)\n")[0] == "skipped"
    assert reason("") == "no output"
    assert len(reason("AssertionError: " + "x" * 500)) == 160


def test_the_table_has_a_line_a_case_and_the_summary_counts_them():
    one, two, three = unit("L0_x/x_test.py", "X", "test_a", "test_bb", "test_c")
    results = [
        Result(one, "passed"),
        Result(two, "failed", "AssertionError: 1 != 2"),
        Result(three, "skipped", "needs a GPU"),
    ]
    assert table(results).splitlines() == [
        "L0_x/x_test.py :: test_a   passed",
        "L0_x/x_test.py :: test_bb  failed   AssertionError: 1 != 2",
        "L0_x/x_test.py :: test_c   skipped  needs a GPU",
    ]
    assert summary(results) == "1 passed, 1 failed, 1 skipped"
    assert summary(results[:2]) == "1 passed, 1 failed"


def test_the_run_enters_a_network_namespace_of_its_own(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    argv = run.private_network_argv(["-k", "http"])
    assert argv[:4] == ["unshare", "--net", "--map-root-user", "--"]
    assert argv[-4:] == ["-m", "tools.triton_qa", "-k", "http"]
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "--map-root-user" not in run.private_network_argv([])


# -- the repository edits ---------------------------------------------------------------


def test_sed_replaces_the_first_match_on_each_line_or_every_one(tmp_path: Path):
    config = tmp_path / "config.pbtxt"
    config.write_text('name: "m"\ndims: [ 1 ] dims: [ 2 ]\ndims: [ 3 ]\n')
    sed(config, r"dims:.*?\]", "dims: [ -1 ]")
    assert config.read_text() == 'name: "m"\ndims: [ -1 ] dims: [ 2 ]\ndims: [ -1 ]\n'
    sed(config, r"dims: \[ 2 \]", "dims: [ 4 ]", every=True)
    sed(config, r"^name:.*", 'name: "n"')
    assert config.read_text() == 'name: "n"\ndims: [ -1 ] dims: [ 4 ]\ndims: [ -1 ]\n'
    sed_first(config, "-1", "1")
    append(config, "instance_group [ { kind: KIND_CPU } ]\n")
    assert config.read_text() == (
        'name: "n"\ndims: [ 1 ] dims: [ 4 ]\ndims: [ -1 ]\n\ninstance_group [ { kind: KIND_CPU } ]\n'
    )


def test_nop_models_get_the_version_folder_util_sh_makes(tmp_path: Path):
    (tmp_path / "nop_TYPE_FP32_1").mkdir()
    (tmp_path / "other").mkdir()
    nop_version_dirs(tmp_path)
    assert (tmp_path / "nop_TYPE_FP32_1" / "1").is_dir()
    assert not (tmp_path / "other" / "1").exists()


def test_a_model_queue_recipe_edits_the_config_as_its_test_sh_does(tmp_path: Path):
    """The recipe on a custom_zero_1_float32 written here: dims made variable, the batch
    size 32, one CPU instance, the case's policy, and the ensemble beside it."""
    qa = tmp_path / "src" / "qa"
    custom = qa / "custom_models" / "custom_zero_1_float32"
    custom.mkdir(parents=True)
    (custom / "config.pbtxt").write_text(
        'name: "custom_zero_1_float32"\nbackend: "identity"\nmax_batch_size: 1\n'
        'input [\n  {\n    name: "INPUT0"\n    data_type: TYPE_FP32\n    dims: [ 1 ]\n  }\n]\n'
        'output [\n  {\n    name: "OUTPUT0"\n    data_type: TYPE_FP32\n    dims: [ 1 ]\n  }\n]\n'
    )
    (qa / "L0_model_queue" / "ensemble_zero_1_float32").mkdir(parents=True)
    repo = tmp_path / "repo"
    repo.mkdir()
    cases.queue_models(cases.QUEUE_POLICIES["test_priority_with_policy"])(
        Build(tmp_path / "src", tmp_path / "data"), repo
    )
    config = _config(repo / "custom_zero_1_float32")
    assert config.backend == "identity" and config.max_batch_size == 32
    assert list(config.input[0].dims) == [-1] and list(config.output[0].dims) == [-1]
    assert [(g.kind, g.count) for g in config.instance_group] == [
        (config.instance_group[0].KIND_CPU, 1)
    ]
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [4, 8, 32]
    assert batching.priority_levels == 2 and batching.default_priority_level == 2
    assert batching.priority_queue_policy[2].timeout_action == batching.default_queue_policy.REJECT
    assert (repo / "ensemble_zero_1_float32" / "1").is_dir()
    # Served as written, on conch's identity backend, from its empty version folder.
    assert list((repo / "custom_zero_1_float32" / "1").iterdir()) == []
    shutil.rmtree(repo / "ensemble_zero_1_float32")  # its config is not written here
    x = np.array([[0.5, 1.5, 2.5]], np.float32)
    with conch.Server(repo).start(wait_until_ready=True) as server:
        [response] = server.model("custom_zero_1_float32").infer({"INPUT0": x})
    np.testing.assert_array_equal(response.outputs["OUTPUT0"], x)


# -- Triton's checkout ------------------------------------------------------------------


def _git(*args: str, cwd: Path) -> str:
    who = {
        f"GIT_{role}_{what}": "t" for role in ("AUTHOR", "COMMITTER") for what in ("NAME", "EMAIL")
    }
    env = {**os.environ, **who}
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_a_bare_git_dir_is_read_at_its_ref_and_a_work_tree_as_it_is(tmp_path: Path):
    tree = tmp_path / "server"
    (tree / "qa" / "common").mkdir(parents=True)
    (tree / "qa" / "L0_a").mkdir()
    (tree / "qa" / "common" / "util.py").write_text("first\n")
    (tree / "qa" / "L0_a" / "a_test.py").write_text("a\n")
    _git("init", "-q", cwd=tree)
    _git("add", ".", cwd=tree)
    _git("commit", "-qm", "one", cwd=tree)
    first = _git("rev-parse", "HEAD", cwd=tree)
    (tree / "qa" / "common" / "util.py").write_text("second\n")
    _git("commit", "-qam", "two", cwd=tree)
    _git("clone", "-q", "--bare", str(tree), str(tmp_path / "bare.git"), cwd=tmp_path)
    (tree / "qa" / "common" / "util.py").write_text("edited, not committed\n")

    bare = resolve(str(tmp_path / "bare.git"), first)
    assert (bare.ref, bare.commit) == (first, first)
    bare.extract(["qa/common"], tmp_path / "out1")
    assert (tmp_path / "out1" / "qa" / "common" / "util.py").read_text() == "first\n"
    assert not (tmp_path / "out1" / "qa" / "L0_a").exists()

    work = resolve(str(tree))
    assert work.ref is None and work.commit == _git("rev-parse", "HEAD", cwd=tree)
    work.extract(["qa/common", "qa/L0_a"], tmp_path / "out2")
    assert (
        tmp_path / "out2" / "qa" / "common" / "util.py"
    ).read_text() == "edited, not committed\n"
    assert (tmp_path / "out2" / "qa" / "L0_a" / "a_test.py").exists()


def test_no_checkout_says_how_to_get_one(tmp_path: Path):
    with pytest.raises(SourceError) as missing:
        resolve(str(tmp_path / "nowhere"))
    assert (
        f"git clone --depth 1 https://github.com/triton-inference-server/server {tmp_path / 'nowhere'}"
        in str(missing.value)
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError):
        resolve(str(tmp_path / "empty"))


def test_no_checkout_exits_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert run.main(["--triton-repo", str(tmp_path / "nowhere")]) == 2
    assert "git clone --depth 1" in capsys.readouterr().err


def test_a_recipe_that_fails_fails_its_group_before_a_server_starts(tmp_path: Path):
    def broken(b: Build, repo: Path) -> None:
        raise FileNotFoundError("qa/L0_gone/config.pbtxt")

    group = Group("gone", broken, unit("L0_gone/gone_test.py", "G", "test_a", "test_b"))
    results = run.run_groups([group], Build(tmp_path / "src", tmp_path / "data"), tmp_path, 1)
    assert [(r.case.case, r.status, r.note) for r in results] == [
        (t, "failed", "repository not built: qa/L0_gone/config.pbtxt") for t in ("test_a", "test_b")
    ]
    assert not (tmp_path / "logs" / "gone" / "serve.log").exists()
