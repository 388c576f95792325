"""tests/conftest.py gives each test the markers of what it needs, so that
`pytest -m "not slow"` is the quick loop and `redis`, `s3`, `gpu` pick the tests that need
each (read from a real pytest collection of a few modules)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import QUICK_INTEGRATION, TESTS

SLOW = "integration/jobs/test_offline.py"  # real workers, gateways and an S3 server
QUICK = "integration/redis/test_wire_keys.py"  # a real Redis, in a few seconds
UNIT = "unit/test_settings.py"
GPU = "integration/backends/test_tensorrt_backend.py"  # some tests need Redis, some a GPU

# Written as a plugin of the collecting pytest: each test's module and marker names.
PLUGIN = """
import json

def pytest_collection_finish(session):
    marks = {}
    for item in session.items:
        module = item.nodeid.split("::")[0].removeprefix("tests/")
        marks.setdefault(module, []).append(sorted(m.name for m in item.iter_markers()))
    print("MARKS " + json.dumps(marks))
"""


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[list[str]]]:
    """Module -> the marker names of each of its tests."""
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "print_marks.py").write_text(PLUGIN)
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*argv, "-p", "print_marks", *(str(TESTS / m) for m in (SLOW, QUICK, UNIT, GPU))],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        env={**os.environ, "PYTHONPATH": str(folder)},
        timeout=120,
    )
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("MARKS ")]
    return json.loads(line.removeprefix("MARKS "))


def _with(marks: dict[str, list[list[str]]], name: str, every: bool = False) -> set[str]:
    """The modules whose tests (any, or ``every`` one) carry marker ``name``."""
    test = all if every else any
    return {m for m, tests in marks.items() if test(name in t for t in tests)}


def test_the_quick_loop_leaves_out_slow_integration_modules_only(marks):
    assert _with(marks, "slow", every=True) == {SLOW}
    assert _with(marks, "slow") == {SLOW}


@pytest.mark.parametrize(
    ("mark", "needs"), [("redis", {SLOW, QUICK, GPU}), ("s3", {SLOW}), ("gpu", {GPU})]
)
def test_each_marker_is_on_the_tests_that_need_it(marks, mark: str, needs: set[str]):
    assert _with(marks, mark) == needs


def test_every_module_listed_as_quick_exists():
    assert sorted(m for m in QUICK_INTEGRATION if not (TESTS / m).exists()) == []
