"""A batch job's lines packed into requests of many rows, and their answers split back.

Sent one message each, every line of a batch job pays its own trip through the model's
queue (three on an ensemble of three steps), and a model that pads a request to its longest
row (a tokenizer) pads each line to whatever the batcher happens to put beside it. So the
driver reads a block of lines ahead, groups those the model can run as one request (same
inputs, datatypes and non-batch shapes, same outputs and parameters asked for), orders each
group by size, so that rows of about one length travel together, which is what
sentence-transformers' ``encode`` does by sorting its corpus, and stacks runs of them along
the batch dimension into one request. Each line still gets its own answer line.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from conch.core import inference, tensors
from conch.wire.messages import WireTensor

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig


@dataclass(frozen=True)
class Line:
    """One valid line of a job: its place in the file, its request and its batch rows."""

    number: int
    request: inference.InferRequest
    rows: int
    size: int  # bytes of its input tensors: the ordering key within a group


def line(number: int, request: inference.InferRequest, rows: int) -> Line:
    return Line(number, request, rows, sum(len(t.raw) for t in request.inputs))


def pack_key(request: inference.InferRequest, config: ModelConfig) -> Hashable | None:
    """What lines must share to be stacked into one request; None when this one runs alone
    (the model has no batch dimension, or takes ragged batches)."""
    if config.max_batch_size <= 0 or any(i.allow_ragged_batch for i in config.input):
        return None
    inputs = tuple(sorted((t.name, t.datatype, tuple(t.shape[1:])) for t in request.inputs))
    outputs = (
        None if request.outputs is None else tuple((o.name, o.class_count) for o in request.outputs)
    )
    try:
        parameters = orjson.dumps(request.parameters, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    return inputs, outputs, parameters


def plan(lines: Sequence[Line], config: ModelConfig, max_rows: int) -> list[list[Line]]:
    """``lines`` as packs of at most ``max_rows`` rows: each group of lines that can be
    stacked, ordered by size, cut into runs; a line that cannot be stacked is a pack alone."""
    groups: dict[Hashable, list[Line]] = {}
    packs: list[list[Line]] = []
    for ln in lines:
        key = pack_key(ln.request, config)
        if key is None:
            packs.append([ln])
        else:
            groups.setdefault(key, []).append(ln)
    for group in groups.values():
        group.sort(key=lambda ln: ln.size)  # stable: equal sizes keep the file's order
        pack: list[Line] = []
        rows = 0
        for ln in group:
            if pack and rows + ln.rows > max_rows:
                packs.append(pack)
                pack, rows = [], 0
            pack.append(ln)
            rows += ln.rows
        if pack:
            packs.append(pack)
    return packs


def stack(pack: Sequence[Line]) -> inference.InferRequest:
    """One request holding every line of ``pack`` (lines ``plan`` grouped), row after row."""
    first = pack[0].request
    if len(pack) == 1:
        return first
    inputs = []
    for t in first.inputs:
        parts = [next(i for i in ln.request.inputs if i.name == t.name) for ln in pack]
        rows = sum(int(p.shape[0]) for p in parts)
        inputs.append(
            inference.InputTensor(
                t.name, t.datatype, (rows, *t.shape[1:]), b"".join(p.raw for p in parts)
            )
        )
    return inference.InferRequest(
        id="",
        inputs=inputs,
        outputs=first.outputs,
        binary_data_output=first.binary_data_output,
        parameters=dict(first.parameters),
    )


def split(outputs: Sequence[WireTensor], pack: Sequence[Line]) -> list[list[WireTensor]]:
    """A stacked request's outputs cut back into each line's own (``InvalidArgument`` when
    an output does not have one row per row sent)."""
    rows = [ln.rows for ln in pack]
    per_line: list[list[WireTensor]] = [[] for _ in pack]
    for name, datatype, shape, raw in outputs:
        parts = tensors.split_rows(datatype, shape, raw, rows, name)
        for mine, part, r in zip(per_line, parts, rows, strict=True):
            mine.append(WireTensor(name, datatype, (r, *tuple(shape)[1:]), part))
    return per_line
