"""The docs stay true: architecture.md has a row for every module and none for a gone one;
the README's first screen links the architecture and every section, and every link lands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PACKAGE = ROOT / "platform" / "conch"
ROW = re.compile(r"^\| ((?:`[^`]+`(?:, )?)+) \|")


def _documented() -> set[str]:
    """The module paths the map's rows name; ``a/b.py``, ``c.py`` names ``a/b.py`` and ``a/c.py``."""
    named: set[str] = set()
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        match = ROW.match(line)
        if not match:
            continue
        folder = ""
        for name in re.findall(r"`([^`]+)`", match.group(1)):
            if "/" in name:
                folder = name.rpartition("/")[0] + "/"
                named.add(name)
            else:
                named.add(folder + name)
    return {n for n in named if n.endswith(".py")}


def _modules() -> set[str]:
    return {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }


def test_every_module_has_a_row_in_the_map():
    assert sorted(_modules() - _documented()) == []


def test_every_row_names_a_module_that_exists():
    assert sorted(n for n in _documented() if not (PACKAGE / n).exists()) == []


FIRST_SCREEN = 30  # lines


def _slug(heading: str) -> str:
    """A Markdown heading's anchor, as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {_slug(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


def test_the_readme_first_screen_links_the_architecture_and_every_section():
    readme = ROOT / "README.md"
    first = "\n".join(readme.read_text().splitlines()[:FIRST_SCREEN])
    assert "(docs/architecture.md)" in first
    sections = {
        _slug(line[3:]) for line in readme.read_text().splitlines() if line.startswith("## ")
    }
    assert sections - set(re.findall(r"\]\(#([^)]+)\)", first)) == set()
    linked = set(re.findall(r"\(docs/architecture\.md#([^)]+)\)", first))
    assert (
        _anchors(ROOT / "docs" / "architecture.md") - linked - {"conchs-architecture-rooms-by-role"}
        == set()
    )


def test_every_anchor_link_lands_on_a_heading():
    for doc in (ROOT / "README.md", ROOT / "docs" / "architecture.md"):
        text = doc.read_text()
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
            where = doc.parent / target if target else doc
            assert anchor in _anchors(where), f"{doc.name}: {target}#{anchor}"
