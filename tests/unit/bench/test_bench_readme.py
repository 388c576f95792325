"""bench/README.md stays a page a reader finishes: how to run each bench and one current table
per question, under 600 lines (the dated runs are in git), and every section of it that the
code, tests and docs name in quotes after its path is still one of its headings."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "bench" / "README.md"
HERE = Path(__file__).resolve()
MAX_LINES = 600

# Where the page is cited from, and the files there that can cite it.
CITING = ("platform", "bench", "functions", "docs", "tests/unit", "tests/integration", "tools")
CITING_FILES = ("README.md", "Makefile")
SUFFIXES = {".py", ".md", ".sh", ".pbtxt", ".toml", ".txt"}

# `bench/README.md, "A" and "B"`, `bench/README.md: "A", point 5, and "B"`,
# `bench/README.md ("A")`: the quoted names that follow the path, with the words between them.
_GAP = r"(?:\s|[,:;(]|and\b|point \d+,?)*"
CITATION = re.compile(rf'bench/README\.md((?:{_GAP}"[^"\n]+")+)')
QUOTED = re.compile(r'"([^"]+)"')


def _citing_files() -> list[Path]:
    found = [ROOT / name for name in CITING_FILES]
    for folder in CITING:
        found += [
            path
            for path in (ROOT / folder).rglob("*")
            if path.suffix in SUFFIXES and path.is_file() and path not in (README, HERE)
        ]
    return [path for path in found if path.exists()]


def _cited_names() -> dict[str, list[str]]:
    """Each quoted section name, with the files that cite it. A comment's or docstring's line
    breaks (and the comment signs after them) are read as spaces, as a reader reads them."""
    cited: dict[str, list[str]] = {}
    for path in _citing_files():
        text = re.sub(r"[ \t]*\n[ \t]*(?:#+[ \t]*)?", " ", path.read_text(errors="replace"))
        for match in CITATION.finditer(text):
            for name in QUOTED.findall(match.group(1)):
                cited.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return cited


def _headings() -> list[str]:
    return [
        line.lstrip("#").strip().replace("`", "")
        for line in README.read_text().splitlines()
        if re.match(r"#{1,6} ", line)
    ]


def test_the_page_is_under_600_lines():
    lines = len(README.read_text().splitlines())
    assert lines < MAX_LINES, f"{lines} lines: a new measurement replaces its question's table"


def test_every_section_the_repository_cites_is_a_heading():
    headings = _headings()
    cited = _cited_names()
    assert "Measurements the code cites" in cited  # the citations are found at all
    missing = {
        name: files
        for name, files in cited.items()
        if not any(name.lower() in heading.lower() for heading in headings)
    }
    assert missing == {}
