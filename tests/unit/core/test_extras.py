"""The command an error gives for a missing extra fits how conch was installed."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from conch.core import extras


@pytest.fixture(autouse=True)
def _fresh() -> None:
    extras._checkout.cache_clear()
    yield
    extras._checkout.cache_clear()


def test_from_a_checkout_the_command_installs_the_extra_from_it_into_this_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(extras, "_checkout", lambda: "/srv/my conch")
    words = shlex.split(extras.install_command("fil"))
    assert words == [sys.executable, "-m", "pip", "install", "-e", "/srv/my conch[fil]"]


def test_from_an_index_the_command_is_pip_install_of_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(extras, "_checkout", lambda: None)
    assert extras.install_command("openvino") == "pip install 'conch[openvino]'"


def test_this_checkout_is_found_as_make_install_left_it() -> None:
    # make install (pip install -e) records the checkout in conch's direct_url.json.
    checkout = extras._checkout()
    if checkout is None:
        pytest.skip("conch is not installed in editable mode here")
    assert (Path(checkout) / "pyproject.toml").is_file()


def test_the_sentence_names_what_needs_which_package_and_the_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(extras, "_checkout", lambda: None)
    said = extras.needs_extra("the fil backend", "lightgbm", "fil")
    assert said == (
        "the fil backend needs lightgbm, which is not installed: run pip install 'conch[fil]'"
    )
