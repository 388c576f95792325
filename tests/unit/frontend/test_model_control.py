"""The load API's checks before anything is published (``conch.frontend.model_control``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.cli import parser
from conch.core.errors import InvalidArgument
from conch.frontend import model_control
from conch.settings import Settings


def test_a_file_name_past_name_max_is_the_clients_400_not_a_server_error(tmp_path: Path):
    """L0_http's test_load_oversized_file_parameter: a 'file:' key whose one path segment is
    256 bytes. Triton answers 500 (its test marks 400 as the right answer, TRI-958); conch
    refuses it before publishing, with uploads on (off, the default, it is a 403)."""
    argv = ["gateway", "--model-repository", str(tmp_path), "--model-control-mode=explicit"]
    settings = Settings.from_args(parser().parse_args([*argv, "--allow-model-upload"]))
    with pytest.raises(InvalidArgument) as caught:
        model_control.load(
            None, settings, "onnx_zero_1_float32", config="{}", files={"file:" + "A" * 256: b"a"}
        )
    assert caught.value.status == 400
    assert caught.value.message.endswith("has a path segment longer than 255 bytes")
