#!/usr/bin/env python3
"""A/B two commits of conch with ``bench/run.py``, alternating, in one sitting.

    .venv/bin/python bench/ab.py 508211a HEAD
    .venv/bin/python bench/ab.py 508211a HEAD --rounds 3 -- --models mlp --concurrency 16

This machine's throughput drifts by ±10 % over minutes, so comparing two ``make bench``
runs taken at different times says little. This script checks each commit out into its
own worktree (``.cache/bench/ab/<commit>``), then runs each commit's own ``bench/run.py``
in ABBA order (A B B A, repeated ``--rounds`` times), so drift hits both sides alike. Each
run serves conch from its own worktree (``PYTHONPATH``) with this venv's packages.

It prints, per model and concurrency, every run's infer/s for A and for B, their means and
B ÷ A; the logs and ``ab.json`` go to ``.cache/bench/ab/<time>/``. The default run.py
arguments are the issue's A/B: both models at concurrency 16 and 64, no MLServer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AB = ROOT / ".cache" / "bench" / "ab"
DEFAULT_RUN_ARGS = [
    "--skip-mlserver",
    "--models",
    "mlp,mlp_large",
    "--concurrency",
    "16,64",
    "--window-ms",
    "2000",
]


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def checkout(ref: str) -> tuple[str, Path]:
    """A worktree of ``ref`` (made once), sharing this tree's perf_analyzer set-up."""
    sha = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = AB / sha[:12]
    if not tree.exists():
        AB.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--detach", str(tree), sha)
    shared = ROOT / ".cache" / "perf_analyzer"
    link = tree / ".cache" / "perf_analyzer"
    if shared.exists() and not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(shared)
    return sha, tree


def run_once(tree: Path, run_args: list[str], log: Path) -> dict:
    """One ``bench/run.py`` of the commit in ``tree``; its results.json."""
    runs = tree / ".cache" / "bench" / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    env = {**os.environ, "PYTHONPATH": f"{tree / 'platform'}{os.pathsep}{tree}"}
    # Triton's numbers do not depend on the conch commit, and the commit's worktree has no
    # .cache/bench/triton-venv: skip it where that run.py knows the flag.
    if "--skip-triton" in (tree / "bench" / "run.py").read_text():
        run_args = [*run_args, "--skip-triton"]
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, str(tree / "bench" / "run.py"), *run_args],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"bench/run.py in {tree} exited {proc.returncode}; see {log}")
    new = sorted(set(runs.iterdir()) - before)
    if not new:
        raise RuntimeError(f"bench/run.py in {tree} wrote no results; see {log}")
    return json.loads((new[-1] / "results.json").read_text())


def order(rounds: int) -> list[str]:
    return ["A", "B", "B", "A"] * rounds


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_args = DEFAULT_RUN_ARGS
    if "--" in argv:
        cut = argv.index("--")
        argv, run_args = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", help="commit A (e.g. the commit before a change)")
    p.add_argument("after", help="commit B (e.g. HEAD)")
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds (default 2: 8 runs)")
    args = p.parse_args(argv)

    sides = {"A": checkout(args.before), "B": checkout(args.after)}
    out_dir = AB / time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True)
    seen: dict[tuple[str, int], dict[str, list[float]]] = {}
    for k, side in enumerate(order(args.rounds), 1):
        sha, tree = sides[side]
        print(f"[ab {time.strftime('%H:%M:%S')}] run {k}: {side} = {sha[:12]}", file=sys.stderr)
        results = run_once(tree, run_args, out_dir / f"run{k:02d}-{side}-{sha[:12]}.log")
        for point in results["points"]:
            if point["server"] != "conch" or point.get("infer_per_s") is None:
                continue
            key = (point["model"], point["concurrency"])
            seen.setdefault(key, {"A": [], "B": []})[side].append(point["infer_per_s"])

    (out_dir / "ab.json").write_text(
        json.dumps(
            {
                "A": sides["A"][0],
                "B": sides["B"][0],
                "order": order(args.rounds),
                "run_args": run_args,
                "infer_per_s": [
                    {"model": m, "concurrency": c, **values} for (m, c), values in seen.items()
                ],
            },
            indent=2,
        )
    )
    print(f"A = {sides['A'][0][:12]} ({args.before}), B = {sides['B'][0][:12]} ({args.after})")
    print(f"order {' '.join(order(args.rounds))}; bench/run.py {' '.join(run_args)}\n")
    print(
        "| model | conc | A infer/s (in run order) | B infer/s (in run order) | mean A | mean B | B ÷ A |"
    )
    print("|---|---|---|---|---|---|---|")
    for (model, c), values in sorted(seen.items()):
        a, b = values["A"], values["B"]
        if not a or not b:
            continue
        ma, mb = statistics.fmean(a), statistics.fmean(b)
        print(
            f"| {model} | {c} | {', '.join(f'{v:,.0f}' for v in a)} | "
            f"{', '.join(f'{v:,.0f}' for v in b)} | {ma:,.0f} | {mb:,.0f} | {mb / ma:.3f} |"
        )
    print(f"\nlogs and ab.json: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
