"""Building the model repositories Triton's ``test.sh`` scripts build, on a CPU.

A test.sh copies models out of Triton's generated data repositories
(``/data/inferenceserver/<version>/qa_*_model_repository``) and edits their configs with
``sed`` and ``echo >>``. Here the data repositories come from Triton's own generators
(``qa/common/gen_qa_*.py``) run with this venv's onnx and torch, each once a run and only
when a chosen case needs it, and the edits are the functions below, each named for the
shell it stands for. Models on Triton's C++ ``identity`` backend are served as written, on
conch's own (``conch.backends.identity``); the TensorRT models one test reads get an ONNX
stand-in (``plan_stand_in.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PLAN_STAND_IN = str(Path(__file__).with_name("plan_stand_in.py"))

# Each data repository a test.sh copies from, and the generator runs that make it (those of
# gen_qa_model_repository's ONNX and PyTorch scripts; the TensorRT and OpenVINO models need
# a GPU or a backend conch does not have, but for the TensorRT reshape models that
# L0_infer_reshape reads, which plan_stand_in.py stands in for).
DATA: dict[str, tuple[tuple[str, ...], ...]] = {
    "qa_identity_model_repository": (
        ("gen_qa_identity_models.py", "--onnx"),
        ("gen_qa_identity_models.py", "--libtorch"),
    ),
    "qa_reshape_model_repository": (
        ("gen_qa_reshape_models.py", "--onnx", "--variable"),
        ("gen_qa_reshape_models.py", "--libtorch", "--variable"),
        (PLAN_STAND_IN,),
    ),
    "qa_ensemble_model_repository/qa_identity_model_repository": (
        ("gen_qa_identity_models.py", "--ensemble"),
    ),
    "qa_ensemble_model_repository/qa_reshape_model_repository": (
        ("gen_qa_reshape_models.py", "--ensemble"),
    ),
}


class Build:
    """Where a repository is built from: Triton's extracted files under ``src`` and the
    data repositories, generated under ``data`` on first use (a log of each run beside)."""

    def __init__(self, src: Path, data: Path) -> None:
        self.src = src
        self.data_root = data

    def qa(self, rel: str) -> Path:
        return self.src / "qa" / rel

    def example(self, name: str) -> Path:
        """A model of Triton's docs/examples/model_repository (L0_http's ``models``)."""
        return self.src / "docs" / "examples" / "model_repository" / name

    def data(self, name: str) -> Path:
        """The data repository ``name`` (a key of ``DATA``), generated if not yet."""
        dest = self.data_root / name
        done = dest.with_name(dest.name + ".done")
        if not done.exists():
            dest.mkdir(parents=True, exist_ok=True)
            log = dest.with_name(dest.name + ".log")
            common = self.qa("common")
            env = {**os.environ, "PYTHONPATH": python_path(common)}
            with open(log, "ab") as out:
                for script, *flags in DATA[name]:
                    argv = [sys.executable, script, *flags, f"--models_dir={dest}"]
                    ran = subprocess.run(argv, cwd=common, env=env, stdout=out, stderr=out)
                    if ran.returncode:
                        raise RuntimeError(f"{' '.join(argv[1:])} failed; see {log}")
            done.touch()
        return dest


def python_path(*first: Path | str) -> str:
    """``PYTHONPATH`` with ``first`` before this process's own."""
    return os.pathsep.join(str(p) for p in (*first, os.environ.get("PYTHONPATH")) if p)


def copy(src: Path, dest: Path) -> Path:
    """``cp -r src dest``: a model folder, to the name ``dest``."""
    shutil.copytree(src, dest, dirs_exist_ok=True)
    return dest


def copy_all(src: Path, repo: Path) -> None:
    """``cp -r src/* repo/.``: every model of a data repository."""
    for model in sorted(p for p in src.iterdir() if p.is_dir()):
        copy(model, repo / model.name)


def sed(config: Path, pattern: str, replacement: str, *, every: bool = False) -> None:
    """``sed -i "s/pattern/replacement/"`` (``every``: ``.../g``): the first match on each
    line, or every one. ``pattern`` is a Python regex; ``^`` anchors at each line."""
    count = 0 if every else 1
    lines = config.read_text().splitlines(keepends=True)
    config.write_text("".join(re.sub(pattern, replacement, line, count=count) for line in lines))


def sed_first(config: Path, old: str, new: str) -> None:
    """``sed -i "0,/old/{s/old/new/}"``: the first ``old`` in the whole file only."""
    config.write_text(config.read_text().replace(old, new, 1))


def append(config: Path, text: str) -> None:
    """``echo "..." >> config.pbtxt``: lines added at the end."""
    with open(config, "a") as out:
        out.write("\n" + text.strip("\n") + "\n")


def nop_version_dirs(repo: Path) -> None:
    """util.sh's ``create_nop_version_dir``: a version folder for every ``nop_*`` model."""
    for model in repo.glob("nop_*"):
        (model / "1").mkdir(parents=True, exist_ok=True)
