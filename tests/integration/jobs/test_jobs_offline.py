"""Pure logic of async and batch jobs: URI checks, and job results read as untrusted data."""

from __future__ import annotations

import msgpack
import pytest
import redis

from conch.core.errors import InvalidArgument, Unavailable
from conch.frontend.jobs import batch_job
from conch.wire import job_store
from conch.wire.messages import Reply


@pytest.mark.parametrize(
    "uri",
    ["s3://data/in.jsonl", "s3://my.bucket-1/a/b/c.jsonl", "s3://abc/ü/x y.jsonl"],
)
def test_object_uris_that_are_taken(uri: str) -> None:
    ref = batch_job.parse_uri(uri, "input")
    assert str(ref) == uri


@pytest.mark.parametrize(
    "uri",
    [
        "/etc/passwd",
        "file:///etc/passwd",
        "s3://data",
        "s3://data/",
        "s3://Data/x",  # bucket names are lower case
        "s3://ab/x",  # and at least 3 characters
        "s3://data/../x",
        "s3://data/a/./b",
        "s3://data/a//b",
        "s3://data/a/",
        "s3://data/a\\..\\b",
        "s3://data/a\x00b",
        "s3://data/" + "k" * 1025,
        42,
        None,
    ],
)
def test_object_uris_that_are_refused(uri: object) -> None:
    with pytest.raises(InvalidArgument):
        batch_job.parse_uri(uri, "input")


def test_job_ids_name_nothing_but_jobs() -> None:
    assert job_store.check_id("0123456789abcdef0123456789abcdef")
    for bad in ("", "0123", "../../x", "0123456789ABCDEF0123456789ABCDEF", "g" * 32):
        with pytest.raises(InvalidArgument):
            job_store.check_id(bad)


def test_a_result_round_trips_and_a_failure_keeps_its_status(rclient: redis.Redis) -> None:
    ok = Reply("a" * 32, outputs=[("OUT", "FP32", (1, 2), b"\0" * 8)], version=3)
    bad = Reply("b" * 32, error=Unavailable("queue full"))
    pipe = rclient.pipeline()
    job_store.store(pipe, ok.id, "m", ok, 60)
    job_store.store(pipe, bad.id, "m", bad, 60)
    pipe.execute()
    got = job_store.read(rclient, ok.id)
    assert got.status == job_store.SUCCESS and got.reply is not None
    assert got.reply.outputs == ok.outputs and got.reply.version == 3
    failed = job_store.read(rclient, bad.id)
    assert failed.status == job_store.FAILURE and failed.reply is not None
    assert failed.reply.error is not None and failed.reply.error.status == 503
    assert job_store.read(rclient, "c" * 32).status == job_store.PENDING


@pytest.mark.parametrize(
    "meta",
    [
        b"\xc1 not msgpack",
        msgpack.packb({"status": "SUCCESS"}),
        msgpack.packb({"status": "SUCCESS", "result": {"outputs": [["x"]]}}),
        msgpack.packb(
            {
                "status": "SUCCESS",
                "result": {
                    "outputs": [{"name": "o", "datatype": "EVIL", "shape": [1], "data": b""}]
                },
            }
        ),
    ],
)
def test_an_unreadable_result_is_a_failure_not_a_crash(rclient: redis.Redis, meta: bytes) -> None:
    rclient.set(job_store.result_key("d" * 32), meta)
    got = job_store.read(rclient, "d" * 32)
    assert got.status == job_store.FAILURE and got.reply is not None
    assert got.reply.error is not None and "unreadable job result" in got.reply.error.message


def _split(data: bytes, chunk: int, limit: int) -> list[bytes | None]:
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    return list(batch_job.split_lines(chunks, limit))


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_lines_are_split_across_chunks_and_blank_ones_dropped(chunk: int) -> None:
    data = b'{"a":1}\n\n  \n{"b":2}\r\n{"c":3}'
    assert _split(data, chunk, 100) == [b'{"a":1}', b'{"b":2}\r', b'{"c":3}']


@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_an_overlong_line_is_skipped_without_being_held(chunk: int) -> None:
    data = b"short\n" + b"x" * 50 + b"\nafter\n" + b"y" * 40
    got = _split(data, chunk, 20)
    # A line that overflows is None; one that ends inside the same chunk may come whole,
    # and decode_request's own size check refuses it.
    assert got[0] == b"short" and got[2] == b"after"
    assert got[1] is None or len(got[1]) > 20
    assert got[3] is None or len(got[3]) > 20
    assert len(got) == 4


def test_a_failure_stored_by_celery_keeps_the_error_class_status(rclient: redis.Redis) -> None:
    meta = {
        "status": "FAILURE",
        "result": {
            "exc_type": "InvalidArgument",
            "exc_message": ["bad"],
            "exc_module": "conch.core.errors",
        },
    }
    rclient.set(job_store.result_key("e" * 32), msgpack.packb(meta))
    got = job_store.read(rclient, "e" * 32)
    assert got.reply is not None and got.reply.error is not None
    assert got.reply.error.status == 400 and got.reply.error.message == "bad"
    meta["result"] = {"exc_type": "OSError", "exc_message": ["disk"], "exc_module": "builtins"}
    rclient.set(job_store.result_key("e" * 32), msgpack.packb(meta))
    error = job_store.read(rclient, "e" * 32).reply.error
    assert error is not None and error.status == 500
