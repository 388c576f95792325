"""``conch.frontend.shared_memory`` without a server: keys, names, the bounds of regions
and of tensors in them, and registrations shared by processes through Redis (a dict
here), on files under a temporary folder standing in for /dev/shm."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conch.core.errors import AlreadyExists, Forbidden, InvalidArgument, NotFound
from conch.frontend.shared_memory import (
    RegionOutput,
    SharedMemory,
    check_key,
    check_name,
    output_slots,
)


class FakeRedis:
    """The hash commands ``SharedMemory`` uses."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, str]] = {}

    def hsetnx(self, key: str, field: str, value: str) -> bool:
        h = self.hashes.setdefault(key, {})
        if field in h:
            return False
        h[field] = value
        return True

    def hget(self, key: str, field: str) -> str | None:
        return self.hashes.get(key, {}).get(field)

    def hmget(self, key: str, fields: list[str]) -> list[str | None]:
        return [self.hget(key, f) for f in fields]

    def hgetall(self, key: str) -> dict[str, str]:
        return dict(self.hashes.get(key, {}))

    def hdel(self, key: str, field: str) -> None:
        self.hashes.get(key, {}).pop(field, None)

    def delete(self, key: str) -> None:
        self.hashes.pop(key, None)


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    (tmp_path / "obj").write_bytes(bytes(range(64)))
    return tmp_path


def plane(root: Path, redis: Any = None, enabled: bool = True) -> SharedMemory:
    return SharedMemory(redis or FakeRedis(), enabled, root=root, host="h")


@pytest.mark.parametrize(
    "key", ["/obj", "/input_simple", "/a.b-c:d", "/" + "x" * 255, "/...", "/.hidden"]
)
def test_posix_names_are_keys(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize(
    "key",
    [
        "",
        "obj",
        "/",
        "/.",
        "/..",
        "../etc/passwd",
        "/../etc",
        "/a/b",
        "//a",
        "/a b",
        "/a\0b",
        "/" + "x" * 256,
        "/é",
        7,
        None,
    ],
)
def test_other_keys_are_refused(key: Any) -> None:
    with pytest.raises(InvalidArgument):
        check_key(key)


@pytest.mark.parametrize("name", ["", "a\nb", "x" * 1025, 3])
def test_bad_region_names(name: Any) -> None:
    with pytest.raises(InvalidArgument):
        check_name(name)


def test_register_bounds_the_region_by_the_object(root: Path) -> None:
    shm = plane(root)
    shm.register("whole", "/obj", 0, 64)
    shm.register("tail", "/obj", 60, 4)
    for offset, size in ((0, 65), (60, 5), (64, 1), (0, 0)):
        with pytest.raises(InvalidArgument, match="invalid args"):
            shm.register("bad", "/obj", offset, size)
    for offset, size in ((-1, 4), (0, -4), (0, 1.5), (True, 4)):
        with pytest.raises(InvalidArgument, match="must be a non-negative integer"):
            shm.register("bad", "/obj", offset, size)
    assert [r["name"] for r in shm.status()] == ["tail", "whole"]


def test_missing_objects_links_and_folders_are_refused(root: Path) -> None:
    (root / "link").symlink_to(root / "obj")
    (root / "dir").mkdir()
    shm = plane(root)
    for key in ("/missing", "/link", "/dir"):
        with pytest.raises(InvalidArgument, match="Unable to open shared memory region"):
            shm.register("r", key, 0, 4)
    assert shm.status() == []


def test_names_are_unique_across_processes(root: Path) -> None:
    redis = FakeRedis()
    plane(root, redis).register("r", "/obj", 0, 8)
    with pytest.raises(AlreadyExists, match="'r' already in manager"):
        plane(root, redis).register("r", "/obj", 8, 8)


def test_inputs_read_and_outputs_write_through_any_process(root: Path) -> None:
    redis = FakeRedis()
    plane(root, redis).register("r", "/obj", 16, 32)
    other = plane(root, redis)  # another gateway process: maps it on first use
    raw = other.input_bytes(
        "IN",
        "UINT8",
        (4,),
        {"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": 2},
    )
    assert raw == bytes([18, 19, 20, 21])
    out = other.output("OUT", False, 0, {"shared_memory_region": "r", "shared_memory_byte_size": 8})
    assert isinstance(out, RegionOutput) and out.binary
    slot = output_slots([out])["OUT"]
    slot.write(np.arange(2, dtype=np.float32).tobytes())
    assert (root / "obj").read_bytes()[16:24] == np.arange(2, dtype=np.float32).tobytes()
    with pytest.raises(InvalidArgument, match="should be at least 12 bytes"):
        slot.write(bytes(12))


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": 32}, "Invalid offset for"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": 28}, r"Invalid offset \+ byte size"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 3}, "expected 4 bytes"),
        ({"shared_memory_region": "r"}, "must be given together"),
        ({"shared_memory_byte_size": 4}, "must be given together"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -4}, "non-negative"),
        ({"shared_memory_region": "", "shared_memory_byte_size": 4}, "non-empty string"),
        ({"shared_memory_region": "nope", "shared_memory_byte_size": 4}, "Unable to find"),
    ],
)  # fmt: skip
def test_bad_regions_in_a_request(root: Path, params: dict, match: str) -> None:
    shm = plane(root)
    shm.register("r", "/obj", 16, 32)
    with pytest.raises(InvalidArgument, match=match):
        shm.input_bytes("IN", "FP32", (1,), params)


def test_unregistered_elsewhere_is_never_used_stale(root: Path) -> None:
    redis = FakeRedis()
    first, second = plane(root, redis), plane(root, redis)
    first.register("r", "/obj", 0, 8)
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 4}
    assert second.input_bytes("IN", "UINT8", (4,), params) == bytes(range(4))
    first.unregister("r")
    with pytest.raises(InvalidArgument, match="Unable to find shared memory region: 'r'"):
        second.input_bytes("IN", "UINT8", (4,), params)
    first.register("r", "/obj", 32, 8)  # the same name anew: the new region is read
    assert second.input_bytes("IN", "UINT8", (4,), params) == bytes(range(32, 36))
    second.unregister()
    assert first.status() == []
    first.unregister("never-registered")  # no error, as in Triton


def test_status_of_one_region(root: Path) -> None:
    shm = plane(root)
    shm.register("r", "/obj", 4, 8)
    assert shm.status("r") == [{"name": "r", "key": "/obj", "offset": 4, "byte_size": 8}]
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'x'"):
        shm.status("x")


def test_off_unless_allowed(root: Path) -> None:
    shm = plane(root, enabled=False)
    for call in (
        lambda: shm.register("r", "/obj", 0, 8),
        lambda: shm.status(),
        lambda: shm.unregister(),
        lambda: shm.cuda_status(),
        lambda: shm.input_bytes("IN", "FP32", (1,), {"shared_memory_region": "r"}),
    ):
        with pytest.raises(Forbidden, match="--allow-client-shm=true") as err:
            call()
        assert err.value.status == 403


def test_cuda_is_refused_with_the_reason(root: Path) -> None:
    shm = plane(root)
    with pytest.raises(InvalidArgument, match="CUDA shared memory is not supported"):
        shm.cuda_register()
    assert shm.cuda_status() == []
    shm.cuda_unregister()
    with pytest.raises(NotFound):
        shm.cuda_status("g")


def test_regions_are_kept_per_host(root: Path) -> None:
    redis = FakeRedis()
    SharedMemory(redis, True, root=root, host="a").register("r", "/obj", 0, 8)
    assert SharedMemory(redis, True, root=root, host="b").status() == []
    assert os.path.exists(root / "obj")
