"""make wheelhouse (tools/wheelhouse.py): the real script downloads into a temporary folder,
and pip, offline, resolves conch from that folder alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "wheelhouse.py"
MANYLINUX_X86_64 = [
    *(f"manylinux_2_{n}_x86_64" for n in range(28, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
EXTRAS = ", ".join(
    sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
)


def wheelhouse(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=240,
    )


def offline_resolve(folder: Path, report: Path, *args: str) -> dict:
    """pip's resolution from the folder alone (no index, no pip configuration), no install."""
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--quiet"),
            *("--no-index", "--find-links", str(folder), "--only-binary=:all:"),
            *("--ignore-installed", "--report", str(report), *args),
        ],
        check=True,
        timeout=120,
    )
    return json.loads(report.read_text())


def pins(folder: Path) -> dict[str, str]:
    """requirements.txt's name -> pinned version."""
    reqs = [
        Requirement(line)
        for line in (folder / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    return {canonicalize_name(r.name): str(r.specifier).removeprefix("==") for r in reqs}


def test_make_wheelhouse_for_this_python_installs_conch_offline(tmp_path: Path) -> None:
    dest = tmp_path / "wheelhouse"
    venv = Path(sys.prefix)
    done = subprocess.run(
        # -o: the venv running the tests is the one to use, never reinstalled here.
        [
            *(
                "make",
                "--no-print-directory",
                "-C",
                str(ROOT),
                "-o",
                str(venv / ".conch-installed"),
            ),
            *(f"VENV={venv}", "wheelhouse", f"WHEELHOUSE={dest}"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "wheels," in done.stdout
    assert "pip install --no-index --find-links wheelhouse -r wheelhouse/requirements.txt" in (
        done.stdout
    )
    files = {parse_wheel_filename(p.name)[0]: p.name for p in dest.glob("*.whl")}
    assert files["conch"] == "conch-0.1.0-py3-none-any.whl"
    # gunicorn_h1c is an sdist only on the index: its wheel was built here for this Python.
    assert "gunicorn-h1c" in files
    pinned = pins(dest)
    assert pinned["conch"] == "0.1.0"
    assert set(pinned) == set(files)

    resolved = offline_resolve(dest, tmp_path / "report.json", "conch")
    got = {canonicalize_name(i["metadata"]["name"]): i for i in resolved["install"]}
    assert got["conch"]["download_info"]["url"] == (dest / files["conch"]).as_uri()
    assert all(i["download_info"]["url"].startswith(dest.as_uri()) for i in got.values())
    for name in ("torch", "celery", "onnxruntime", "tritonclient", "gunicorn-h1c"):
        assert got[name]["metadata"]["version"] == pinned[name], name
    # Wheels only a Python older than this one's patch release takes (markers on
    # python_full_version) may be left over; nothing pip takes is missing from the pins.
    assert set(got) <= set(pinned)


def test_python_312_with_the_gpu_extra_gets_only_wheels_python_312_installs(tmp_path: Path) -> None:
    dest = tmp_path / "wh312"
    # torch for 3.12 is PyPI's multi-GB CUDA build: left out (as for a target that has it),
    # and so are gunicorn_h1c, which needs a Python 3.12 to build, and tensorrt, whose
    # libraries are on NVIDIA's index only.
    done = wheelhouse(
        *("--dest", str(dest), "--python", "3.12", "--extras", "gpu"),
        *("--exclude", "torch,gunicorn_h1c,tensorrt"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "for Python 3.12 on manylinux_2_28_x86_64" in done.stdout
    assert "left out (the target has them): gunicorn-h1c, tensorrt, torch" in done.stdout
    # The gpu extra: onnxruntime-gpu's files go back over conch's onnxruntime, last.
    gpu = pins(dest)["onnxruntime-gpu"]
    assert done.stdout.rstrip().splitlines()[-4:] == [
        "  python3.12 -m venv conch-venv",
        "  conch-venv/bin/pip install --no-index --find-links wh312 -r wh312/requirements.txt",
        "  conch-venv/bin/pip uninstall -y onnxruntime",
        "  conch-venv/bin/pip install --no-index --find-links wh312 --force-reinstall --no-deps "
        f"onnxruntime-gpu=={gpu}",
    ]

    supported = {
        *cpython_tags((3, 12), platforms=MANYLINUX_X86_64),
        *compatible_tags((3, 12), "cp312", MANYLINUX_X86_64),
    }
    wheels = sorted(dest.glob("*.whl"))
    assert len(wheels) > 30
    interpreters = set()
    for wheel in wheels:
        name, _, _, tags = parse_wheel_filename(wheel.name)
        assert tags & supported, wheel.name
        assert name not in ("torch", "gunicorn-h1c", "tensorrt")
        interpreters |= {t.interpreter for t in tags}
    assert "cp312" in interpreters and "cp311" not in interpreters

    # Every pin comes from the folder alone for a CPython 3.12 (pip download checks tags and
    # Requires-Python for the target; each pin on its own: torch, gunicorn_h1c and tensorrt, left
    # out, are the target's).
    again = tmp_path / "again"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--isolated", "download", "--quiet", "--no-deps"),
            *("--no-index", "--find-links", str(dest), "--only-binary=:all:", "-d", str(again)),
            *("--python-version", "3.12", "--implementation", "cp"),
            *(f"--platform={p}" for p in MANYLINUX_X86_64),
            *("-r", str(dest / "requirements.txt")),
        ],
        check=True,
        timeout=120,
    )
    assert sorted(p.name for p in again.iterdir()) == [p.name for p in wheels]


def test_a_package_with_only_an_sdist_and_no_python_to_build_it_fails_clearly(
    tmp_path: Path,
) -> None:
    # No python3.12 on this PATH: gunicorn_h1c (an sdist only) cannot be built for 3.12.
    done = wheelhouse(
        "--dest",
        str(tmp_path / "wh"),
        "--python",
        "3.12",
        "--exclude",
        "torch",
        PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin",
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("wheelhouse: error: gunicorn_h1c>=0.6 has no wheel for Python 3.12")
    assert "WHEEL_BUILD_PYTHON" in last and "WHEEL_FIND_LINKS" in last


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--extras", "gpu,nope"],
            f"WHEEL_EXTRAS: unknown extra nope; conch's extras are {EXTRAS}",
        ),
        (["--python", "3.9"], "WHEEL_PYTHON=3.9: conch needs Python >=3.11"),
        (["--python", "3.x"], "WHEEL_PYTHON='3.x' is not a Python version like 3.12"),
        (["--platform", "x86-64"], "WHEEL_PLATFORM='x86-64' is not a wheel platform tag"),
    ],
)
def test_a_bad_knob_fails_before_any_download(tmp_path: Path, args: list[str], says: str) -> None:
    done = wheelhouse("--dest", str(tmp_path / "wh"), *args)
    assert done.returncode == 2
    assert done.stderr.startswith(f"wheelhouse: error: {says}")
    assert not (tmp_path / "wh").exists()
