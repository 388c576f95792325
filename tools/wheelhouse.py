"""Writes a wheelhouse: conch's own wheel and a wheel of everything it needs, for one Python
version and platform, so that a machine without internet installs conch with
`pip install --no-index --find-links DIR` (docs/deploy.md, "Offline install").

What conch needs is read from pyproject.toml at run time (never a second list). pip downloads
the binary wheels for the target; pip evaluates environment markers for the Python running it,
not for the target (pypa/pip#11010), so the folder is then walked from conch's wheel with the
target's markers, and whatever the walk finds missing is fetched in another round. The walk
also proves the result: every wheel it keeps is installable on the target.
"""

from __future__ import annotations

import argparse
import email.parser
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags, sys_tags
from packaging.utils import (
    NormalizedName,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 6
# The older names pip and PyPI still use for manylinux_2_17, _2_12 and _2_5.
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


class WheelhouseError(Exception):
    """A knob or a download the wheelhouse cannot go on with; the message says what to do."""


@dataclass(frozen=True)
class Target:
    """The Python and platform the wheels are for, and how their markers read there."""

    python: tuple[int, int]
    platforms: tuple[str, ...]

    @property
    def version(self) -> str:
        return f"{self.python[0]}.{self.python[1]}"

    @property
    def interpreter(self) -> str:
        return f"cp{self.python[0]}{self.python[1]}"

    def tags(self) -> frozenset[Tag]:
        return frozenset(
            [
                *cpython_tags(self.python, platforms=self.platforms),
                *compatible_tags(self.python, self.interpreter, self.platforms),
            ]
        )

    def marker_env(self) -> dict[str, str]:
        system, sys_platform, os_name = _platform_system(self.platforms[0])
        return {
            "python_version": self.version,
            "python_full_version": self.version + ".0",
            "implementation_name": "cpython",
            "implementation_version": self.version + ".0",
            "platform_python_implementation": "CPython",
            "platform_system": system,
            "sys_platform": sys_platform,
            "os_name": os_name,
            "platform_machine": _machine(self.platforms[0]),
            "platform_release": "",
            "platform_version": "",
        }

    def is_this_machine(self) -> bool:
        here = {t.platform for t in sys_tags()}
        return sys.version_info[:2] == self.python and bool(here & set(self.platforms))


def _platform_system(tag: str) -> tuple[str, str, str]:
    if tag.startswith(("manylinux", "musllinux", "linux")):
        return "Linux", "linux", "posix"
    if tag.startswith("macosx"):
        return "Darwin", "darwin", "posix"
    return "Windows", "win32", "nt"


def _machine(tag: str) -> str:
    arch = re.sub(r"^(manylinux_\d+_\d+|musllinux_\d+_\d+|manylinux\d+|linux)_", "", tag)
    return {"amd64": "AMD64", "win32": "x86", "arm64": "ARM64"}.get(arch, arch)


def platform_family(tag: str) -> tuple[str, ...]:
    """TAG and every platform tag a machine with TAG also installs: pip's --platform matches
    exactly, so manylinux_2_28_x86_64 becomes _2_28 down to _2_5, their legacy names, and
    linux_x86_64 (what a wheel built there is tagged)."""
    m = re.fullmatch(r"(manylinux|musllinux)_(\d+)_(\d+)_([a-z0-9_]+)", tag)
    if m:
        kind, major, minor, arch = m[1], int(m[2]), int(m[3]), m[4]
        lowest = 5 if kind == "manylinux" else 1
        tags = []
        for n in range(minor, lowest - 1, -1):
            tags.append(f"{kind}_{major}_{n}_{arch}")
            if kind == "manylinux" and major == 2 and n in _LEGACY_MANYLINUX:
                tags.append(f"{_LEGACY_MANYLINUX[n]}_{arch}")
        return (*tags, f"linux_{arch}")
    if re.fullmatch(r"(linux|macosx_\d+_\d+|win)_[a-z0-9_]+|win32", tag):
        return (tag,)
    raise WheelhouseError(
        f"WHEEL_PLATFORM={tag!r} is not a wheel platform tag "
        "(e.g. manylinux_2_28_x86_64, manylinux_2_28_aarch64, macosx_11_0_arm64, win_amd64)"
    )


@dataclass
class Project:
    """conch's pyproject.toml: its name, the Pythons it supports, its requirements and extras."""

    root: Path
    name: str
    requires_python: SpecifierSet
    dependencies: list[Requirement]
    extras: dict[str, list[Requirement]]

    @classmethod
    def read(cls, root: Path) -> Project:
        meta = tomllib.loads((root / "pyproject.toml").read_text())["project"]
        return cls(
            root=root,
            name=meta["name"],
            requires_python=SpecifierSet(meta.get("requires-python", "")),
            dependencies=[Requirement(r) for r in meta.get("dependencies", [])],
            extras={
                extra: [Requirement(r) for r in reqs]
                for extra, reqs in meta.get("optional-dependencies", {}).items()
            },
        )

    def requirements(self, extras: list[str]) -> list[Requirement]:
        return self.dependencies + [r for extra in extras for r in self.extras[extra]]


@dataclass
class Options:
    dest: Path
    target: Target
    extras: list[str]
    exclude: frozenset[NormalizedName] = frozenset()
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    build_python: str = ""


def parse_python(text: str, project: Project) -> tuple[int, int]:
    m = re.fullmatch(r"3\.(\d+)", text)
    if not m:
        raise WheelhouseError(f"WHEEL_PYTHON={text!r} is not a Python version like 3.12")
    if not project.requires_python.contains(text + ".0"):
        raise WheelhouseError(
            f"WHEEL_PYTHON={text}: {project.name} needs Python {project.requires_python}"
        )
    return 3, int(m[1])


def parse_extras(text: str, project: Project) -> list[str]:
    extras = [canonicalize_name(e) for e in text.split(",") if e.strip()]
    unknown = [e for e in extras if e not in project.extras]
    if unknown:
        raise WheelhouseError(
            f"WHEEL_EXTRAS: unknown extra {', '.join(unknown)}; "
            f"{project.name}'s extras are {', '.join(sorted(project.extras))}"
        )
    return extras


# --- the wheels in the folder, and the walk from conch's wheel --------------------------


@dataclass(frozen=True)
class Dist:
    """One wheel (or sdist) file in the folder."""

    name: NormalizedName
    version: Version
    path: Path
    tags: frozenset[Tag]

    @classmethod
    def of(cls, path: Path) -> Dist | None:
        if path.suffix == ".whl":
            name, version, _, tags = parse_wheel_filename(path.name)
            return cls(name, version, path, tags)
        if path.name.endswith((".tar.gz", ".zip")):
            name, version = parse_sdist_filename(path.name)
            return cls(name, version, path, frozenset())
        return None

    def requires(self) -> list[Requirement]:
        with zipfile.ZipFile(self.path) as whl:
            meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
            msg = email.parser.Parser().parsestr(whl.read(meta).decode())
        return [Requirement(r) for r in msg.get_all("Requires-Dist") or []]


def dists(folder: Path) -> dict[NormalizedName, list[Dist]]:
    found: dict[NormalizedName, list[Dist]] = {}
    for path in sorted(folder.iterdir()):
        dist = Dist.of(path)
        if dist is not None:
            found.setdefault(dist.name, []).append(dist)
    return found


@dataclass
class Walk:
    """What installing conch[extras] on the target takes from the folder."""

    chosen: dict[NormalizedName, Dist] = field(default_factory=dict)
    missing: list[Requirement] = field(default_factory=list)
    # Prereleases pip fell back to because no final release has a wheel for the target
    # (tensorrt: its final releases are sdists); pip would install a final release.
    unasked_prereleases: list[Dist] = field(default_factory=list)


def walk(root: Requirement, folder: Path, opts: Options) -> Walk:
    """Follows Requires-Dist from ROOT through the folder's wheels with the target's markers:
    for each name, the newest wheel the target installs that satisfies the requirement."""
    have = dists(folder)
    tags = opts.target.tags()
    env = opts.target.marker_env()
    result = Walk()
    seen: set[tuple[NormalizedName, str]] = set()
    queue = [(root, set(root.extras))]
    while queue:
        req, extras = queue.pop()
        name = canonicalize_name(req.name)
        if name in opts.exclude:
            continue
        fits = [
            d
            for d in have.get(name, [])
            if d.tags & tags and req.specifier.contains(d.version, prereleases=True)
        ]
        if not fits:
            result.missing.append(req)
            continue
        dist = result.chosen.setdefault(name, max(fits, key=lambda d: d.version))
        if dist not in fits:  # an earlier requirement chose a version this one excludes
            result.missing.append(req)
            continue
        if dist.version.is_prerelease and not req.specifier.prereleases:
            result.unasked_prereleases.append(dist)
        for extra in ["", *sorted(extras)]:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for dep in dist.requires():
                if dep.marker is None or dep.marker.evaluate({**env, "extra": extra}):
                    queue.append((dep, set(dep.extras)))
    return result


# --- pip ---------------------------------------------------------------------------------


def pip(*args: str, python: str = sys.executable) -> tuple[int, str]:
    """Runs pip with its own progress display; returns its exit status and what it said on
    stderr (echoed as it comes)."""
    cmd = [python, "-m", "pip", "--disable-pip-version-check", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:
        sys.stderr.write(line)
        said.append(line)
    return proc.wait(), "".join(said)


def target_flags(target: Target) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", target.version, "--implementation", "cp"]
    for tag in target.platforms:
        flags += ["--platform", tag]
    return flags


def download(reqs: list[str], pins: Path, opts: Options) -> tuple[int, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as wanted:
        wanted.write("\n".join(reqs) + "\n")
        wanted.flush()
        extra = []
        for url in opts.extra_index_urls:
            extra += ["--extra-index-url", url]
        for link in [str(opts.dest), *opts.find_links]:
            extra += ["--find-links", link]
        return pip(
            "download",
            *target_flags(opts.target),
            *extra,
            "--dest",
            str(opts.dest),
            "--constraint",
            str(pins),
            "--requirement",
            wanted.name,
        )


def builder(opts: Options) -> str:
    """The interpreter that builds wheels for the target: this one when the target is this
    machine, else WHEEL_BUILD_PYTHON or pythonX.Y on PATH when it runs and is that version,
    else this one all the same (a pure-Python sdist gives a wheel every target installs)."""
    here = {t.platform for t in sys_tags()}
    if opts.target.is_this_machine() or not here & set(opts.target.platforms):
        return sys.executable
    for python in [opts.build_python, f"python{opts.target.version}"]:
        if not python:
            continue
        exe = shutil.which(python)
        if exe is None:
            continue
        probe = subprocess.run(
            [exe, "-c", "import sys, pip; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == opts.target.version:
            return exe
    return sys.executable


def build_sdist_only(spec: str, opts: Options) -> None:
    """A requirement with no wheel on the index for the target (an sdist only, or only
    prereleases): builds its wheel, and keeps it when the target installs it, else says what
    to do."""
    python = builder(opts)
    print(f"wheelhouse: {spec}: no wheel on the index; building one with {python}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        status, _ = pip("wheel", "--no-deps", "--wheel-dir", tmp, spec, python=python)
        if status:
            raise WheelhouseError(
                f"building the wheel of {spec} failed (pip's output above); if its build "
                "fetches the real wheel from another index, name that index in "
                "WHEEL_EXTRA_INDEX_URL"
            )
        wheel = next(Path(tmp).glob("*.whl"))
        if not Dist.of(wheel).tags & opts.target.tags():  # type: ignore[union-attr]
            raise WheelhouseError(
                f"{spec} has no wheel for Python {opts.target.version} on "
                f"{opts.target.platforms[0]} (an sdist only), and the one built here "
                f"({wheel.name}) is not for that target. Either run make wheelhouse where "
                f"python{opts.target.version} is on PATH (or name one with "
                "WHEEL_BUILD_PYTHON=/path/to/python), or build it on a machine of the target "
                f"kind (pip wheel --no-deps '{spec}' -w DIR) and pass WHEEL_FIND_LINKS=DIR."
            )
        shutil.move(wheel, opts.dest / wheel.name)


_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")


# --- the wheelhouse -----------------------------------------------------------------------


def build(project: Project, opts: Options) -> Walk:
    """Writes the folder: conch's wheel, every dependency's, requirements.txt; returns the walk."""
    opts.dest.mkdir(parents=True, exist_ok=True)
    status, _ = pip("wheel", "--no-deps", "--wheel-dir", str(opts.dest), str(project.root))
    if status:
        raise WheelhouseError(f"building {project.name}'s own wheel failed (pip's output above)")
    own = max(dists(opts.dest)[canonicalize_name(project.name)], key=lambda d: d.version)
    root = Requirement(f"{project.name}[{','.join(opts.extras)}]=={own.version}")
    wanted = [
        str(r)
        for r in project.requirements(opts.extras)
        if canonicalize_name(r.name) not in opts.exclude
    ]
    pins = opts.dest / ".pins.txt"
    built: set[str] = set()
    refused: set[str] = set()
    for _ in range(ROUNDS):
        result = walk(root, opts.dest, opts)
        refused |= {f"{d.name}!={d.version}" for d in result.unasked_prereleases}
        pins.write_text(
            "".join(f"{n}=={d.version}\n" for n, d in result.chosen.items())
            + "".join(f"{line}\n" for line in sorted(refused))
        )
        status, said = download(wanted, pins, opts)
        if status:
            m = _NO_MATCH.search(said)
            if m is None or m[1] in built:
                raise WheelhouseError("pip download failed (its output above)")
            build_sdist_only(m[1], opts)
            built.add(m[1])
            continue
        result = walk(root, opts.dest, opts)
        if not result.missing and not result.unasked_prereleases:
            pins.unlink()
            return result
        # What the target's markers ask for beyond what pip took with this machine's, and
        # final releases instead of prereleases.
        wanted = [str(_without_marker(r)) for r in result.missing] or wanted
    raise WheelhouseError(
        f"after {ROUNDS} rounds still missing: {', '.join(wanted)} (pip's output above)"
    )


def _without_marker(req: Requirement) -> Requirement:
    bare = Requirement(str(req))
    bare.marker = None
    return bare


def prune(folder: Path, keep: Walk) -> list[Path]:
    """Removes the folder's wheels the target does not install (those pip took for this
    machine's markers, or left from an earlier run)."""
    kept = {d.path for d in keep.chosen.values()}
    gone = [d.path for ds in dists(folder).values() for d in ds if d.path not in kept]
    for path in gone:
        path.unlink()
    return gone


def write_requirements(folder: Path, root: Requirement, keep: Walk) -> Path:
    """requirements.txt: the exact pins, so the offline install is the one tested here."""
    extras = f"[{','.join(sorted(root.extras))}]" if root.extras else ""
    own = keep.chosen[canonicalize_name(root.name)]
    lines = [f"{root.name}{extras}=={own.version}"]
    lines += [
        f"{name}=={dist.version}"
        for name, dist in sorted(keep.chosen.items())
        if name != canonicalize_name(root.name)
    ]
    path = folder / "requirements.txt"
    path.write_text(
        "# Written by make wheelhouse: pip install --no-index --find-links . -r requirements.txt\n"
        + "\n".join(lines)
        + "\n"
    )
    return path


def install_commands(folder: Path, target: Target, keep: Walk) -> list[str]:
    """The offline install on the target, onnxruntime-gpu's files put back last (they share
    the onnxruntime module with the CPU build that conch itself requires)."""
    pip_ = "conch-venv/bin/pip"
    cmds = [
        f"python{target.version} -m venv conch-venv",
        f"{pip_} install --no-index --find-links {folder} -r {folder}/requirements.txt",
    ]
    gpu = keep.chosen.get(canonicalize_name("onnxruntime-gpu"))
    if gpu is not None:
        cmds += [
            f"{pip_} uninstall -y onnxruntime",
            f"{pip_} install --no-index --find-links {folder} --force-reinstall --no-deps "
            f"onnxruntime-gpu=={gpu.version}",
        ]
    return cmds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=ROOT / "dist" / "wheelhouse")
    ap.add_argument("--python", default="", help="X.Y (default: this Python's)")
    ap.add_argument("--platform", default="manylinux_2_28_x86_64")
    ap.add_argument("--extras", default="", help="comma-separated, e.g. gpu")
    ap.add_argument("--exclude", default="", help="names the target already has, comma-separated")
    ap.add_argument(
        "--extra-index-url",
        default="",
        help="more package indexes, comma-separated: https://download.pytorch.org/whl/cpu "
        "(torch's CPU build), https://pypi.nvidia.com (tensorrt's CUDA libraries)",
    )
    ap.add_argument("--find-links", default="", help="folders of wheels built elsewhere")
    ap.add_argument("--build-python", default="", help="an interpreter of the target version")
    ap.add_argument("--project", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    try:
        project = Project.read(args.project)
        python = args.python or "{}.{}".format(*sys.version_info[:2])
        target = Target(parse_python(python, project), platform_family(args.platform))
        opts = Options(
            dest=args.dest.resolve(),
            target=target,
            extras=parse_extras(args.extras, project),
            exclude=frozenset(canonicalize_name(n) for n in args.exclude.split(",") if n),
            extra_index_urls=[u for u in args.extra_index_url.split(",") if u],
            find_links=[p for p in args.find_links.split(",") if p],
            build_python=args.build_python,
        )
        keep = build(project, opts)
    except WheelhouseError as exc:
        print(f"wheelhouse: error: {exc}", file=sys.stderr)
        return 2
    gone = prune(opts.dest, keep)
    root = Requirement(f"{project.name}[{','.join(opts.extras)}]")
    reqs = write_requirements(opts.dest, root, keep)
    size = sum(d.path.stat().st_size for d in keep.chosen.values())
    print(
        f"\nwheelhouse: {opts.dest}: {len(keep.chosen)} wheels, {size / 2**20:.0f} MiB, for "
        f"Python {target.version} on {args.platform}"
        + (f" ({len(gone)} not needed there removed)" if gone else "")
        + f"; pins in {reqs.name}"
    )
    if opts.exclude:
        print(f"wheelhouse: left out (the target has them): {', '.join(sorted(opts.exclude))}")
    print("Offline install, on the target machine, with the folder copied beside it:")
    for cmd in install_commands(Path(opts.dest.name), target, keep):
        print(f"  {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
