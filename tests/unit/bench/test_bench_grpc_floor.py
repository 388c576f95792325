"""bench/grpc_floor.py's own gRPC layer and its order of runs (issue 28, point 1)."""

from __future__ import annotations

import argparse

import pytest

from unit.bench._bench import bench_module


@pytest.fixture(scope="module")
def floor():
    return bench_module("grpc_floor")


def test_a_message_is_prefixed_by_its_flag_and_length_and_unframes_back(floor) -> None:
    message = floor._grpc_message(b"abc")
    assert message == b"\x00\x00\x00\x00\x03abc"
    assert floor._grpc_unary(message) == b"abc"
    assert floor._grpc_unary(floor._grpc_message(b"")) == b""


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x00\x00",  # a prefix cut short
        b"\x00\x00\x00\x00\x04abc",  # shorter than its length says
        b"\x00\x00\x00\x00\x02abc",  # more than one message's worth
        b"\x01\x00\x00\x00\x03abc",  # compressed: the floors take none
    ],
)
def test_anything_but_one_uncompressed_message_is_refused(floor, body: bytes) -> None:
    with pytest.raises(ValueError):
        floor._grpc_unary(body)


def test_trailers_carry_the_status_and_a_percent_encoded_message(floor) -> None:
    assert floor._grpc_trailers(0) == [(b"grpc-status", b"0")]
    assert floor._grpc_trailers(12, "no such method: é%") == [
        (b"grpc-status", b"12"),
        (b"grpc-message", b"no such method%3A %C3%A9%25"),
    ]


def test_concurrency_takes_one_level_or_several(floor) -> None:
    assert floor._concurrencies("16") == [16]
    assert floor._concurrencies("1,16,64") == [1, 16, 64]
    with pytest.raises(argparse.ArgumentTypeError):
        floor._concurrencies("0,16")


def test_each_round_takes_every_concurrency_and_at_each_every_server_in_turn(floor) -> None:
    args = argparse.Namespace(rounds=2, concurrency=[1, 16])
    assert floor._turns(args, ["a", "b"]) == [
        (1, 1, "a"),
        (1, 1, "b"),
        (1, 16, "a"),
        (1, 16, "b"),
        (2, 1, "a"),
        (2, 1, "b"),
        (2, 16, "a"),
        (2, 16, "b"),
    ]


def test_the_floors_and_the_dataplane_variants_are_all_served(floor) -> None:
    assert set(floor.SERVERS) <= set(floor.SERVE)
    conch = ("gateway", "grpc", "grpc-h2")  # conch's own processes, started by the command line
    variants = {serve for serve in floor.DATAPLANE.values() if serve not in conch}
    assert variants == {"h2-dataplane", "grpclib-dataplane"} <= set(floor.SERVE)
