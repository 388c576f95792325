"""A Python model's BLS call checked as a client's request is checked, before it is made.

``pb_utils`` hands the BLS port a ``BlsRequest`` with what the model set, unchecked. Every
port checks it the same way, here: the queue's (``conch.frontend.bls``, whose call becomes
a message on the target's queue) and an embedded server's (``conch.embedded``, whose call
runs in the same process). So a model gets the same answer to a bad call wherever it runs.

A call must also never wait on itself: the instance making it is busy until it returns, so
a call to a model that is waiting on that instance (the caller, or a model earlier in the
call chain) would deadlock. ``refusal`` answers such a call at once with the cycle named
(``conch.frontend.bls`` says why the rule is per model name, not per instance).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.core import inference, tensors, validation
from conch.core.call_context import CallContext
from conch.core.errors import ConchError, Internal, InvalidArgument
from conch.core.model_config import wire_type
from conch.core.model_spec import BlsRequest

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig
    from conch.core.repository import ModelEntry

MAX_DEPTH = 16  # models on one path, from the outer request's model to the deepest call


def refusal(ctx: CallContext, target: str) -> ConchError | None:
    """Why a call from ``ctx`` to ``target`` must not be made (a cycle, or a path longer
    than ``MAX_DEPTH``), or None."""
    cycle = ctx.cycle(target)
    if cycle is not None:
        return InvalidArgument(
            f"BLS call from model '{ctx.model}' to model '{target}' would wait on itself "
            f"({' -> '.join(cycle)}): '{target}' is busy waiting for this call, so conch "
            "refuses it instead of deadlocking"
        )
    path = [*ctx.longest(), target]
    if len(path) > MAX_DEPTH:
        return InvalidArgument(
            f"BLS call from model '{ctx.model}' to model '{target}' would make a call chain "
            f"of {len(path)} models ({' -> '.join(path)}); conch allows at most {MAX_DEPTH}"
        )
    return None


def target_name(request: BlsRequest) -> str:
    """The model a call names; a call that names none is refused."""
    target = request.model_name
    if not isinstance(target, str) or not target:
        raise InvalidArgument(
            f"a BLS request needs a model_name (a non-empty string), got {target!r}"
        )
    return target


def decoupled_refused(target: str) -> ConchError:
    """A plain ``exec()`` to a decoupled model, in Triton's words and with its code."""
    return Internal(
        f"Model '{target}' is using the decoupled transaction policy. The current "
        "BLS request call doesn't support models using the decoupled transaction "
        "policy. Please use 'decoupled=True' argument to the 'exec' or 'async_exec' "
        "calls for decoupled models."
    )


@dataclass
class CheckedCall:
    """A BLS call that may be made: the version it asks for (as text: "" and "-1" are the
    latest) and the request, checked against the target's config, with its parameters
    (and its own ``timeout`` in microseconds, when it set one)."""

    version: str
    request: inference.InferRequest


def check(request: BlsRequest, entry: ModelEntry) -> CheckedCall:
    """``request`` checked against ``entry`` (the model it names) as the gateway checks a
    client's request; raises the ``ConchError`` that answers the call."""
    target = entry.name
    version = _version(entry, request.model_version)
    request_id = request.request_id
    if not isinstance(request_id, str):
        raise InvalidArgument(
            f"BLS request to model '{target}': request_id must be a string, "
            f"got {type(request_id).__name__}"
        )
    wanted = _outputs(request.requested_output_names, target)
    neutral = inference.InferRequest(
        id=request_id,
        inputs=[inference.InputTensor(*t) for t in _inputs(request.inputs, entry.config, target)],
        outputs=[inference.RequestedOutput(n, True) for n in wanted] or None,
        binary_data_output=True,
        parameters={},
    )
    validation.validate_request(neutral, entry.config, model_name=target)
    params = _parameters(request.parameters, target)
    timeout_us = request.timeout
    if isinstance(timeout_us, bool) or not isinstance(timeout_us, int | np.integer):
        raise InvalidArgument(
            f"BLS request to model '{target}': timeout must be an integer number of "
            f"microseconds, got {timeout_us!r}"
        )
    if timeout_us > 0:
        params["timeout"] = int(timeout_us)
    neutral.parameters = params
    return CheckedCall(version, neutral)


def _version(entry: ModelEntry, version: Any) -> str:
    """The version a call asks for, as text ("" and "-1" are the latest)."""
    if isinstance(version, bool) or not isinstance(version, int | np.integer | str):
        raise InvalidArgument(
            f"BLS request to model '{entry.name}': model_version must be an integer, "
            f"got {version!r}"
        )
    return str(version)


def _inputs(given: Sequence[tuple[str, Any]], config: ModelConfig, target: str) -> list[tuple]:
    expected = {i.name: wire_type(i.data_type) for i in config.input}
    out: list[tuple] = []
    seen: set[str] = set()
    for name, arr in given:
        if name in seen:
            raise InvalidArgument(
                f"BLS request to model '{target}': {inference.already_in_request('input', name)}"
            )
        seen.add(name)
        as_bf16 = expected.get(name) == "BF16" and (
            arr.dtype == np.uint16 or arr.dtype.name == "bfloat16"
        )
        try:
            datatype, raw = tensors.from_numpy(arr, "BF16" if as_bf16 else None)
        except ConchError as exc:
            raise InvalidArgument(f"input '{name}' for model '{target}': {exc.message}") from None
        out.append((name, datatype, tuple(int(d) for d in arr.shape), raw))
    return out


def _outputs(names: Iterable[Any], target: str) -> list[str]:
    wanted: list[str] = []
    for name in names:
        if not isinstance(name, str):
            raise InvalidArgument(
                f"BLS request to model '{target}': requested output names must be "
                f"strings, got {name!r}"
            )
        if name in wanted:
            raise InvalidArgument(
                f"BLS request to model '{target}': {inference.already_in_request('output', name)}"
            )
        wanted.append(name)
    return wanted  # empty: every output, as in Triton


def _parameters(raw: str, target: str) -> dict[str, Any]:
    try:
        params = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise InvalidArgument(
            f"BLS request to model '{target}': parameters are not JSON: {exc}"
        ) from None
    if not isinstance(params, dict):
        raise InvalidArgument(
            f"BLS request to model '{target}': parameters must be a dict (a JSON object)"
        )
    for key, value in params.items():
        if not isinstance(value, str | int | float):  # bool is an int
            raise InvalidArgument(
                f"BLS request to model '{target}': parameter '{key}' must be a string, "
                f"integer, boolean or number, got {type(value).__name__}"
            )
    return {k: v for k, v in params.items() if k not in inference.RESERVED_PARAMETERS}


__all__ = ["MAX_DEPTH", "CheckedCall", "check", "decoupled_refused", "refusal", "target_name"]
