#!/usr/bin/env python3
"""Summarise ``py-spy record --format raw`` files: the functions with the most samples.

    bench/pyspy_top.py .cache/bench/profile/gateway-*.txt [--top 30]

For each file: the share of samples whose innermost frame is a function (self), then the
share of samples with a function anywhere on the stack (inclusive), largest first.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path


def _name(frame: str) -> str:
    # py-spy writes "function (path/to/file.py:line)"; keep the function and the file name.
    func, _, where = frame.partition(" (")
    return f"{func} ({Path(where.rstrip(')')).name.split(':')[0]})" if where else func


def summarise(path: Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_name(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for name in set(frames):
            anywhere[name] += n
    lines = [f"== {path.name}: {total} samples", "-- self"]
    lines += [f"{100 * v / total:5.1f}%  {k}" for k, v in own.most_common(top)]
    lines.append("-- inclusive")
    lines += [f"{100 * v / total:5.1f}%  {k}" for k, v in anywhere.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    for f in args.files:
        print(summarise(f, args.top))


if __name__ == "__main__":
    main()
