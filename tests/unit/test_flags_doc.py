"""docs/flags.md is what the settings' declarations give, and no other page copies a
flag's default by hand: a default lives in its declaration and the generated page only."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

from conch.devtools import flags_doc
from conch.settings import FLAGS, Settings, shown_default

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PAGE = ROOT / flags_doc.PAGE


def test_the_flags_page_is_what_the_declarations_give():
    assert PAGE.read_text() == flags_doc.render(), (
        f"docs/flags.md is stale: run `{flags_doc.COMMAND}` and commit docs/flags.md"
    )


def test_the_check_mode_fails_on_a_stale_page(tmp_path: Path, capsys):
    (tmp_path / "docs").mkdir()
    assert flags_doc.main(["--check", "--root", str(tmp_path)]) == 1
    assert flags_doc.COMMAND in capsys.readouterr().err
    assert flags_doc.main(["--root", str(tmp_path)]) == 0
    assert flags_doc.main(["--check", "--root", str(tmp_path)]) == 0
    page = tmp_path / flags_doc.PAGE
    page.write_text(page.read_text() + "a line written by hand\n")
    assert flags_doc.main(["--check", "--root", str(tmp_path)]) == 1


def test_every_flag_and_variable_has_its_row():
    text = flags_doc.render()
    for flag in FLAGS:
        assert f"`{flag.name}" in text, flag.name
    for f in fields(Settings):
        for name in f.metadata["env"]:
            assert f"`{name}`" in text, name


def test_a_default_shows_in_its_row():
    rows = {
        line.split("`")[1].split()[0]: line
        for line in flags_doc.render().splitlines()
        if line.startswith("| `--")
    }
    assert "| `8000` |" in rows["--http-port"]
    assert "| `h2` |" in rows["--grpc-transport"]
    assert "| `CONCH_REQUEST_TIMEOUT_S` |" in rows["--request-timeout-secs"]


# A default copied by hand: a flag or variable, then within its clause (up to the next
# flag or variable named) "(V)", "(V s)" or "default V"/"default: V", V being its declared
# default as a flag spells it.
def _copies(text: str, name: str, value: str) -> list[str]:
    found = []
    for match in re.finditer(re.escape(name) + r"(?![\w-])", text):
        after = text[match.end() : match.end() + 160]
        clause = re.split(r"[.;]\s|\n\n|`(?:--|[A-Z]+_)", after)[0]
        number = re.escape(value)
        if re.search(rf"^`?\s*\(\s*{number}\b|default:?\s+(is\s+)?{number}\b", clause):
            found.append(f"{name} ... {clause[:60]!r}")
    return found


def _declared_defaults() -> list[tuple[str, str]]:
    named = []
    for f in fields(Settings):
        shown = None if f.default is MISSING else shown_default(f.default)
        if shown is None:
            continue
        flags = [fl.name for fl in f.metadata["flags"] if not fl.ignored]
        named += [(name, shown) for name in (*flags, *f.metadata["env"])]
    return named


def _pages() -> list[Path]:
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [ROOT / "README.md", *(p for p in docs if p != PAGE)]


def test_the_copy_finder_finds_a_copy():
    assert _copies("`--scale-poll-secs` (2) it reads", "--scale-poll-secs", "2")
    assert _copies("`--grpc-port`\n(8001), then", "--grpc-port", "8001")
    assert _copies("`CONCH_MAX_ATTEMPTS` (default 3)", "CONCH_MAX_ATTEMPTS", "3")
    assert not _copies("`--scale-poll-secs` ([flags](flags.md)) 2", "--scale-poll-secs", "2")


def test_no_page_copies_a_default_by_hand():
    copies = [
        f"{page.relative_to(ROOT)}: {copy}"
        for page in _pages()
        for name, value in _declared_defaults()
        for copy in _copies(page.read_text(), name, value)
    ]
    assert copies == [], "say 'see docs/flags.md' instead of the default:\n" + "\n".join(copies)
