"""bench/'s scripts as modules, for the unit tests of the benchmark's own code."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"


@functools.cache
def bench_module(script: str) -> ModuleType:
    """bench/<script>.py, imported once as ``bench_<script>``. The bench scripts import
    bench/models.py as ``models``, a name the test suite's own tests/models.py holds in
    sys.modules: that one is set aside meanwhile (the bench's modules keep their own
    reference), and bench/ leaves sys.path again."""
    name = f"bench_{script}"
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while defined
    ours = sys.modules.pop("models", None)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("models", None)
        if ours is not None:
            sys.modules["models"] = ours
        while str(BENCH) in sys.path:
            sys.path.remove(str(BENCH))
    return module


def bench_run() -> ModuleType:
    """bench/run.py."""
    return bench_module("run")
