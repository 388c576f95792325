"""bench/run.py as a module, for the unit tests of the benchmark's own code."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def bench_run() -> ModuleType:
    """bench/run.py, imported once. It imports bench/models.py as ``models``, a name the test
    suite's own tests/models.py holds in sys.modules: that one is set aside meanwhile (the
    bench's modules keep their own reference)."""
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_run"] = module  # dataclasses look their module up while defined
    ours = sys.modules.pop("models", None)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("models", None)
        if ours is not None:
            sys.modules["models"] = ours
        sys.path.remove(str(ROOT / "bench"))
    return module
