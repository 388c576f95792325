"""Check a decoded infer request against the model's config before it is queued.

Doing this in the gateway means a bad request is a 400 at once, with Triton's wording,
instead of a failure inside a worker after it has waited in a queue (and possibly
poisoned a dynamic batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from conch.core.errors import InvalidArgument
from conch.core.inference import InferRequest
from conch.core.model_config import wire_type

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def _dims_match(actual: Sequence[int], expected: Sequence[int]) -> bool:
    if len(actual) != len(expected):
        return False
    return all(e == -1 or a == e for a, e in zip(actual, expected, strict=True))


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
    by_name = {inp.name: inp for inp in config.input}
    max_batch = int(config.max_batch_size)

    for tensor in req.inputs:
        if tensor.name not in by_name:
            allowed = ", ".join(f"'{n}'" for n in by_name)
            raise InvalidArgument(
                f"{prefix}unexpected inference input '{tensor.name}' for model '{model}', "
                f"allowed inputs are: {allowed}"
            )

    given = {t.name for t in req.inputs}
    required = [n for n, inp in by_name.items() if not inp.optional]
    missing = [n for n in required if n not in given]
    if missing:
        expected = (
            f"{len(by_name)} inputs"
            if len(required) == len(by_name)
            else f"number of inputs between {len(required)} and {len(by_name)}"
        )
        raise InvalidArgument(
            f"{prefix}expected {expected} but got {len(req.inputs)} inputs for "
            f"model '{model}'. Got input(s) {sorted(given)}, but missing required input(s) "
            f"{missing}. Please provide all required input(s)."
        )

    batch: int | None = None
    for tensor in req.inputs:
        inp = by_name[tensor.name]
        expected_type = wire_type(inp.data_type)
        if tensor.datatype != expected_type:
            raise InvalidArgument(
                f"{prefix}inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{model}' expects '{expected_type}'"
            )
        dims = [int(d) for d in inp.dims]
        shape = tensor.shape
        if max_batch > 0:
            expected_shape = [-1, *dims]
            if not shape:
                raise InvalidArgument(
                    f"{prefix}input '{tensor.name}' for model '{model}' has no batch "
                    f"dimension. Expected {_shape_str(expected_shape)}, got []"
                )
            this_batch = int(shape[0])
            if this_batch < 1 or this_batch > max_batch:
                raise InvalidArgument(
                    f"{prefix}inference request batch-size must be <= {max_batch} and >= 1 "
                    f"for model '{model}', got {this_batch} for input '{tensor.name}'"
                )
            if not inp.allow_ragged_batch:
                if batch is None:
                    batch = this_batch
                elif this_batch != batch:
                    raise InvalidArgument(
                        f"{prefix}input '{tensor.name}' batch size {this_batch} does not "
                        f"match other inputs' batch size {batch} for model '{model}'"
                    )
            if not _dims_match(shape[1:], dims):
                raise InvalidArgument(
                    f"{prefix}unexpected shape for input '{tensor.name}' for model "
                    f"'{model}'. Expected {_shape_str(expected_shape)}, got "
                    f"{_shape_str(shape)}. NOTE: Setting a non-zero max_batch_size in the "
                    f"model config requires a batch dimension to be prepended to each "
                    f"input shape."
                )
        elif not _dims_match(shape, dims):
            raise InvalidArgument(
                f"{prefix}unexpected shape for input '{tensor.name}' for model '{model}'. "
                f"Expected {_shape_str(dims)}, got {_shape_str(shape)}"
            )

    if req.outputs is not None:
        output_names = {out.name for out in config.output}
        for want in req.outputs:
            if want.name not in output_names:
                raise InvalidArgument(
                    f"{prefix}unexpected inference output '{want.name}' for model '{model}'"
                )

    if max_batch > 0:
        if batch is None:  # every input is ragged: take the first one's batch
            batch = int(req.inputs[0].shape[0]) if req.inputs else 1
        return batch
    return 1
