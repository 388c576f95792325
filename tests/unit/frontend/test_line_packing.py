"""A batch job's lines packed into requests of many rows, answers split back, and written in
line order (line_packing, tensors.split_rows, batch_job's _InOrder)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from conch.core import inference, tensors
from conch.core.errors import InvalidArgument
from conch.core.model_config import parse_config
from conch.frontend.jobs import batch_job, line_packing


def config(max_batch_size: int) -> object:
    return parse_config(
        f'name: "te" backend: "python" max_batch_size: {max_batch_size}\n'
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'output [ { name: "E" data_type: TYPE_FP32 dims: [ 2 ] } ]\n',
        model="te",
        source="test",
    )


TEXT_CONFIG = config(8)


def text_line(number: int, text: str, **parameters: object) -> line_packing.Line:
    raw = tensors.encode_bytes_elements([text])
    req = inference.InferRequest(
        id=f"r{number}",
        inputs=[inference.InputTensor("TEXT", "BYTES", (1, 1), raw)],
        outputs=None,
        binary_data_output=False,
        parameters=dict(parameters),
    )
    return line_packing.line(number, req, 1)


def test_lines_are_packed_by_size_up_to_the_rows_asked() -> None:
    texts = ["a" * n for n in (9, 1, 5, 3, 7, 2, 8)]
    lines = [text_line(i, t) for i, t in enumerate(texts)]
    packs = line_packing.plan(lines, TEXT_CONFIG, max_rows=3)
    assert [[ln.number for ln in p] for p in packs] == [[1, 5, 3], [2, 4, 6], [0]]


def test_lines_that_differ_in_what_they_ask_are_never_packed_together() -> None:
    lines = [text_line(0, "x"), text_line(1, "y", tone="a"), text_line(2, "z"), text_line(3, "w", tone="b")]  # fmt: skip
    packs = line_packing.plan(lines, TEXT_CONFIG, max_rows=8)
    assert sorted([ln.number for ln in p] for p in packs) == [[0, 2], [1], [3]]


def test_a_model_without_a_batch_dimension_gets_each_line_alone() -> None:
    lines = [text_line(i, "a" * (3 - i)) for i in range(3)]
    packs = line_packing.plan(lines, config(0), 8)
    assert [[ln.number for ln in p] for p in packs] == [[0], [1], [2]]


def test_a_stack_holds_every_line_row_after_row_and_splits_back() -> None:
    lines = [text_line(0, "short"), text_line(1, "a longer one"), text_line(2, "")]
    request = line_packing.stack(lines)
    (tensor,) = request.inputs
    assert tensor.shape == (3, 1)
    assert tensors.to_numpy("BYTES", tensor.shape, tensor.raw).ravel().tolist() == [
        b"short",
        b"a longer one",
        b"",
    ]
    emb = np.arange(6, dtype=np.float32).reshape(3, 2)
    names = np.array([b"s", b"longer", b""], dtype=object)
    outputs = [
        ("E", "FP32", (3, 2), emb.tobytes()),
        ("N", "BYTES", (3,), tensors.encode_bytes_elements(names.tolist())),
    ]
    parts = line_packing.split(outputs, lines)
    for k, part in enumerate(parts):
        (e, n) = part
        assert e[:3] == ("E", "FP32", (1, 2))
        np.testing.assert_array_equal(tensors.to_numpy("FP32", e[2], e[3]), emb[k : k + 1])
        assert tensors.to_numpy("BYTES", n[2], n[3]).tolist() == [names[k]]


def test_an_output_without_a_row_per_row_sent_is_refused() -> None:
    lines = [text_line(0, "x"), text_line(1, "y")]
    with pytest.raises(InvalidArgument, match="does not have the 2 rows"):
        line_packing.split([("E", "FP32", (1, 2), bytes(8))], lines)
    with pytest.raises(InvalidArgument):  # BYTES that end early
        tensors.split_rows("BYTES", (2,), tensors.encode_bytes_elements([b"a"]), [1, 1])


def test_answers_are_written_in_line_order_spilling_past_the_budget() -> None:
    out, spill = io.BytesIO(), io.BytesIO()
    done = batch_job._InOrder(out, spill, budget=10)
    for line in (3, 1, 4, 2):
        done.answer(line, f"answer {line}".encode(), failed=line == 4)
    assert out.getvalue() == b"" and len(done.held) == 1 and len(done.spilled) == 3
    done.answer(0, b"answer 0", failed=False)
    assert out.getvalue().splitlines() == [f"answer {k}".encode() for k in range(5)]
    assert (done.next, done.answered, done.failed) == (5, 5, 1)
    assert done.held_bytes == 0 and not done.spilled and spill.getvalue() == b""
