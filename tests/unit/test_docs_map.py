"""The docs stay true: architecture.md has a row for every module and none for a gone one;
the README's first screen links the architecture and every section, its map links every
page of docs/, each page says first what it is for, and every relative link lands on a
file (and an #anchor on a heading of it)."""

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


def _prose(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _anchors(path: Path) -> set[str]:
    """Its headings' anchors, a repeated one numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()):
        if re.match(r"#{1,6} ", line):
            slug = _slug(line.lstrip("#"))
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


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


DOCS = ROOT / "docs"
LINKED = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "bench" / "README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _links(path: Path) -> list[str]:
    """The targets of its Markdown links and images, code spans and blocks left out."""
    prose = re.sub(r"`[^`]*`", "", "\n".join(_prose(path.read_text())))
    return LINK.findall(prose)


def _broken(path: Path) -> list[str]:
    broken = []
    for target in _links(path):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not _lands(where, anchor):
            broken.append(target)
    return broken


def _lands(where: Path, anchor: str) -> bool:
    """The file exists, and so does the heading an anchor names in it."""
    if not where.exists():
        return False
    return not anchor or (where.suffix == ".md" and anchor in _anchors(where))


def test_every_relative_link_lands():
    broken = {str(p.relative_to(ROOT)): _broken(p) for p in LINKED if p.exists()}
    assert {page: links for page, links in broken.items() if links} == {}


def test_the_link_check_finds_a_broken_link(tmp_path: Path):
    (tmp_path / "a.md").write_text("# A\n\n## Here it is\n")
    page = tmp_path / "b.md"
    page.write_text(
        "# B\n\n[ok](a.md#here-it-is) [gone](c.md) [no heading](a.md#there) "
        "[self](#b) `[in code](c.md)`\n\n```\n[in a block](d.md)\n```\n"
    )
    assert _broken(page) == ["c.md", "a.md#there"]


def test_the_readme_maps_every_page_of_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in DOCS.glob("*.md") if f"(docs/{p.name})" not in readme] == []


def test_each_page_says_first_what_it_is_for():
    for page in sorted(DOCS.glob("*.md")):
        lines = [line for line in _prose(page.read_text()) if line.strip()]
        assert lines[0].startswith("# "), page.name
        assert re.match(r"[A-Za-z`]", lines[1]), f"{page.name}: {lines[1]!r}"


def test_the_readme_stays_a_page():
    assert len((ROOT / "README.md").read_text().splitlines()) < 300
