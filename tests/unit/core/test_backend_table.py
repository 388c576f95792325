"""The backend table (repository knowledge) and the backend classes agree."""

import pytest

from conch.backends import CLASSES, backend_class
from conch.core.backend_table import (
    BACKENDS,
    backend_for_filename,
    backend_for_suffix,
    backend_name_for,
)
from conch.core.errors import ModelLoadError


def test_every_backend_has_facts_and_a_class():
    assert set(CLASSES) == set(BACKENDS)


def test_the_python_backend_class_is_where_the_table_says():
    from conch.backends.python.backend import PythonBackend

    assert backend_class("python") is PythonBackend
    assert BACKENDS["python"].platforms == ()
    assert BACKENDS["python"].default_filename == "model.py"


def test_backend_wins_over_platform_and_platform_selects():
    assert backend_name_for("onnxruntime_onnx", "python") == "python"
    assert backend_name_for("libtorch", "") == "pytorch"
    assert backend_name_for("tensorrt_plan", "") == "tensorrt"


@pytest.mark.parametrize(("platform", "backend"), [("", "nope"), ("nope_plan", "")])
def test_unknown_names_say_what_exists(platform, backend):
    with pytest.raises(ModelLoadError, match="unknown"):
        backend_name_for(platform, backend)


def test_files_select_backends():
    assert backend_for_filename("model.onnx") == "onnxruntime"
    assert backend_for_filename("weights.bin") is None
    assert backend_for_suffix("other.plan") == "tensorrt"
    assert backend_for_suffix("README") is None
