"""The repository's path rules as repo_sync applies them: where a source key lands, or why it is refused."""

from __future__ import annotations

import pytest

from conch.core import repository_keys as keys
from conch.core.repository_keys import RefusedKey, classify


@pytest.mark.parametrize(
    ("key", "kind", "model", "version", "path"),
    [
        ("m/config.pbtxt", keys.MODEL_FILE, "m", None, "config.pbtxt"),
        ("m/labels.txt", keys.MODEL_FILE, "m", None, "labels.txt"),
        ("m/1/model.onnx", keys.VERSION_FILE, "m", 1, "model.onnx"),
        ("m/20/sub/dir/w.bin", keys.VERSION_FILE, "m", 20, "sub/dir/w.bin"),
        ("m/1/sub/.ready", keys.VERSION_FILE, "m", 1, "sub/.ready"),
        ("m/1/modèle.onnx", keys.VERSION_FILE, "m", 1, "modèle.onnx"),
        ("my.model-2_x/3/model.pt", keys.VERSION_FILE, "my.model-2_x", 3, "model.pt"),
        # Triton takes any folder name that cannot climb out: commas, spaces, letters.
        ("a,b/1/model.py", keys.VERSION_FILE, "a,b", 1, "model.py"),
        ("good name/1/model.onnx", keys.VERSION_FILE, "good name", 1, "model.onnx"),
        ("modèle/config.pbtxt", keys.MODEL_FILE, "modèle", None, "config.pbtxt"),
        ("m:1/1/model.onnx", keys.VERSION_FILE, "m:1", 1, "model.onnx"),
        ("m/1/", keys.VERSION_DIR, "m", 1, ""),
        ("m/1/.ready", keys.READY, "m", 1, ""),
    ],
)
def test_repository_keys(key, kind, model, version, path):
    place = classify(key)
    assert (place.kind, place.model, place.version, place.path) == (kind, model, version, path)


@pytest.mark.parametrize(
    "key",
    [
        "",  # the prefix itself
        "README.md",  # files at the root
        "m/",  # a model folder marker
        ".git/config",  # hidden folders
        "m/01/model.onnx",  # zero-padded: not a version, as in Triton
        "m/0/model.onnx",
        "m/v1/model.onnx",
        "m/configs/h100.pbtxt",
        "m/configs/",
        "m/1/sub/",
        "m/1234567890123456789/model.onnx",  # beyond int64
    ],
)
def test_ignored_keys(key):
    assert classify(key).kind == keys.IGNORED


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("../evil", "'..'"),
        ("/abs", "absolute"),
        ("/m/1/model.onnx", "absolute"),
        ("m/1/../../x", "'..'"),
        ("m/../../etc/passwd", "'..'"),
        ("m\\..\\x", "backslash"),
        ("m/1/a\\b", "backslash"),
        ("m/1/a\x00b", "U+0000"),
        ("m/1/a\x01b", "U+0001"),
        ("m/1/a\nb", "U+000A"),
        ("m/1/a\x7fb", "U+007F"),
        ("m/1/\u202egnp.onnx", "U+202E"),  # right-to-left override
        ("m/1/a\u2028b", "U+2028"),  # line separator
        ("m/1/a\u200bb", "U+200B"),  # zero-width space
        ("m//1/x", "empty"),
        ("m/1//x", "empty"),
        ("m/./1/x", "'.'"),
        ("m/1/./x", "'.'"),
        (" /1/model.onnx", "not a valid model name: it is empty"),
        ("m/1", "version folder"),
        ("m/" + "a" * 256, "255 bytes"),
        ("m/1/" + "x" * 1100, "1024"),
    ],
)
def test_refused_keys(key, reason):
    with pytest.raises(RefusedKey) as caught:
        classify(key)
    assert reason in caught.value.reason
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        ("  ", "empty"),
        ("..", "'.'"),
        (".hidden", "'.'"),
        ("a/b", "'/'"),
        ("a\\b", "backslash"),
        ("a\tb", "U+0009"),
        ("a\u200bb", "U+200B"),
        ("é" * 128, "255 bytes"),
    ],
)
def test_model_names_refused(name: str, problem: str) -> None:
    assert problem in (keys.model_name_problem(name) or "")
    assert not keys.is_model_name(name)


@pytest.mark.parametrize("name", ["a,b", "a b", "modèle", "m:1", "x.y-z_1", "a" * 255, "()[]{}"])
def test_model_names_taken_as_triton_takes_them(name: str) -> None:
    assert keys.model_name_problem(name) is None
