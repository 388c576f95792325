"""Import a script of bench/ as a module, for the tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(script: str, name: str) -> ModuleType:
    """bench/<script>.py as module ``name``. The bench scripts import bench/models.py as
    ``models``, a name the test suite's own tests/models.py holds in sys.modules: that one
    is set aside meanwhile, and bench/ leaves sys.path again."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{script}.py")
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
