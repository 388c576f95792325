"""Check a decoded infer request against the model's config before it is queued.

Doing this in the gateway means a bad request is a 400 at once, with Triton's wording,
instead of a failure inside a worker after it has waited in a queue (and possibly
poisoned a dynamic batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conch.core.errors import InvalidArgument
from conch.core.inference import InferRequest
from conch.core.model_config import per_config, wire_type

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def _dims_match(actual: Sequence[int], expected: Sequence[int]) -> bool:
    if len(actual) != len(expected):
        return False
    return all(e == -1 or a == e for a, e in zip(actual, expected, strict=True))


@dataclass(frozen=True, slots=True)
class _Input:
    """One input of a config, as a request is checked against it."""

    wire_type: str | None  # None: a data_type with no name (checked as it comes)
    data_type: int
    dims: tuple[int, ...]
    exact: bool  # no variable (-1) dim: a tuple shape matches by equality
    optional: bool
    ragged: bool


@dataclass(frozen=True, slots=True)
class _Expected:
    """What ``validate_request`` reads of a config, read once per config."""

    inputs: dict[str, _Input]  # in config order
    required: frozenset[str]
    max_batch: int
    outputs: frozenset[str]


@per_config
def _expected(config: ModelConfig) -> _Expected:
    inputs = {}
    for inp in config.input:
        dims = tuple(int(d) for d in inp.dims)
        try:
            wire: str | None = wire_type(inp.data_type)
        except ValueError:
            wire = None
        inputs[inp.name] = _Input(
            wire, inp.data_type, dims, -1 not in dims, inp.optional, inp.allow_ragged_batch
        )
    return _Expected(
        inputs,
        frozenset(n for n, i in inputs.items() if not i.optional),
        int(config.max_batch_size),
        frozenset(out.name for out in config.output),
    )


def validate_request(
    req: InferRequest, config: ModelConfig, *, model_name: str | None = None
) -> int:
    """Check inputs and requested outputs against ``config`` (an ``inference.ModelConfig``).

    ``model_name`` (default ``config.name``) is the name messages use. Returns the
    request's batch size: the shared first dimension when the model batches
    (``max_batch_size > 0``), else 1.
    """
    model = model_name or config.name
    prefix = f"[request id: {req.id}] " if req.id else ""
    expected = _expected(config)
    by_name = expected.inputs
    max_batch = expected.max_batch

    given = set()
    for tensor in req.inputs:
        if tensor.name not in by_name:
            allowed = ", ".join(f"'{n}'" for n in by_name)
            raise InvalidArgument(
                f"{prefix}unexpected inference input '{tensor.name}' for model '{model}', "
                f"allowed inputs are: {allowed}"
            )
        given.add(tensor.name)

    if not expected.required <= given:
        required = [n for n in by_name if n in expected.required]
        missing = [n for n in required if n not in given]
        count = (
            f"{len(by_name)} inputs"
            if len(required) == len(by_name)
            else f"number of inputs between {len(required)} and {len(by_name)}"
        )
        raise InvalidArgument(
            f"{prefix}expected {count} but got {len(req.inputs)} inputs for "
            f"model '{model}'. Got input(s) {sorted(given)}, but missing required input(s) "
            f"{missing}. Please provide all required input(s)."
        )

    batch: int | None = None
    for tensor in req.inputs:
        inp = by_name[tensor.name]
        if tensor.datatype != inp.wire_type:
            expected_type = inp.wire_type or wire_type(inp.data_type)
            raise InvalidArgument(
                f"{prefix}inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{model}' expects '{expected_type}'"
            )
        dims = inp.dims
        shape = tensor.shape
        if max_batch > 0:
            if not shape:
                raise InvalidArgument(
                    f"{prefix}input '{tensor.name}' for model '{model}' has no batch "
                    f"dimension. Expected {_shape_str([-1, *dims])}, got []"
                )
            this_batch = int(shape[0])
            if this_batch < 1 or this_batch > max_batch:
                raise InvalidArgument(
                    f"{prefix}inference request batch-size must be <= {max_batch} and >= 1 "
                    f"for model '{model}', got {this_batch} for input '{tensor.name}'"
                )
            if not inp.ragged:
                if batch is None:
                    batch = this_batch
                elif this_batch != batch:
                    raise InvalidArgument(
                        f"{prefix}input '{tensor.name}' batch size {this_batch} does not "
                        f"match other inputs' batch size {batch} for model '{model}'"
                    )
            if not _fits(shape[1:], inp):
                raise InvalidArgument(
                    f"{prefix}unexpected shape for input '{tensor.name}' for model "
                    f"'{model}'. Expected {_shape_str([-1, *dims])}, got "
                    f"{_shape_str(shape)}. NOTE: Setting a non-zero max_batch_size in the "
                    f"model config requires a batch dimension to be prepended to each "
                    f"input shape."
                )
        elif not _fits(shape, inp):
            raise InvalidArgument(
                f"{prefix}unexpected shape for input '{tensor.name}' for model '{model}'. "
                f"Expected {_shape_str(dims)}, got {_shape_str(shape)}"
            )

    if req.outputs is not None:
        for want in req.outputs:
            if want.name not in expected.outputs:
                raise InvalidArgument(
                    f"{prefix}unexpected inference output '{want.name}' for model '{model}'"
                )

    if max_batch > 0:
        if batch is None:  # every input is ragged: take the first one's batch
            batch = int(req.inputs[0].shape[0]) if req.inputs else 1
        return batch
    return 1


def _fits(shape: Sequence[int], inp: _Input) -> bool:
    """Whether ``shape`` (after any batch dimension) is one the input takes."""
    if inp.exact and type(shape) is tuple:
        return shape == inp.dims
    return _dims_match(shape, inp.dims)
