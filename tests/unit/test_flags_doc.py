"""docs/flags.md is what the settings' declarations give."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from conch.devtools import flags_doc
from conch.settings import FLAGS, Settings

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
