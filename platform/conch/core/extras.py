"""conch's optional extras, and the one command that adds an extra to this installation.

``make serve`` installs only what serving ``functions/`` needs, so a model or a source that
needs another framework (TensorFlow, OpenVINO, FIL's LightGBM and Treelite, grpcio, the GCS
and Azure SDKs) meets a missing package. Its error then names the command to run, written
for the way conch was installed: from a checkout (``pip install -e``, as the Makefile does)
the command installs from that checkout into the same interpreter; from a package index it
is the plain ``pip install 'conch[extra]'``.
"""

from __future__ import annotations

import json
import shlex
import sys
from functools import cache
from importlib import metadata
from urllib.parse import unquote, urlparse


@cache
def _checkout() -> str | None:
    """The folder conch was installed from in editable mode, else None."""
    # Every record of conch is read: run from a checkout, the egg-info setuptools leaves
    # there is found before the venv's record, and only the latter says how it was installed.
    raws = (d.read_text("direct_url.json") for d in metadata.distributions(name="conch"))
    raw = next((r for r in raws if r), None)
    if raw is None:
        return None
    direct = json.loads(raw)
    if not direct.get("dir_info", {}).get("editable"):
        return None
    url = urlparse(direct.get("url", ""))
    return unquote(url.path) if url.scheme == "file" else None


def install_command(extra: str) -> str:
    """The shell command that installs ``extra`` into the interpreter running conch."""
    checkout = _checkout()
    if checkout is None:
        return f"pip install {shlex.quote(f'conch[{extra}]')}"
    target = shlex.quote(f"{checkout}[{extra}]")
    return f"{shlex.quote(sys.executable)} -m pip install -e {target}"


def needs_extra(what: str, package: str, extra: str) -> str:
    """A sentence for an error: ``what`` needs ``package``, and the command that adds it."""
    return f"{what} needs {package}, which is not installed: run {install_command(extra)}"


__all__ = ["install_command", "needs_extra"]
