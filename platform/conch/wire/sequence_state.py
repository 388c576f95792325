"""A sequence's implicit state as bytes, so it can live in Redis between steps.

A stateful model's output state is the next step's input state; keeping it in Redis
after each step lets another worker continue the sequence when the one serving it dies.
The bytes are a msgpack list of Triton raw tensors ``[name, datatype, shape, raw]`` (the
broker's own tensor form), never a pickle, and are checked when read back as untrusted:
the tensor form, the names and datatypes the model's states declare, and that each
tensor's bytes hold exactly its shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgpack
import numpy as np

from conch.core import tensors
from conch.core.errors import ConchError
from conch.core.sequence import StateSpec
from conch.wire.messages import MAX_TENSORS, BadMessage, read_tensor, unpack


def pack_state(
    arrays: Mapping[str, np.ndarray], states: Sequence[StateSpec] | None = None
) -> bytes:
    """``arrays`` (state input name -> array) as bytes; with ``states``, each array is sent
    as its state's datatype (BF16 as its bit patterns)."""
    types = {s.input_name: s.datatype for s in states or ()}
    items = []
    for name, arr in arrays.items():
        datatype, raw = tensors.from_numpy(arr, types.get(name))
        items.append([name, datatype, list(np.shape(arr)), raw])
    return msgpack.packb(items, use_bin_type=True)


def unpack_state(data: bytes, states: Sequence[StateSpec] | None = None) -> dict[str, np.ndarray]:
    """The arrays ``pack_state`` wrote; ``BadMessage`` for anything else. With ``states``,
    the names must be exactly the states' inputs and each datatype its state's."""
    items = unpack(data)
    if not isinstance(items, list) or len(items) > MAX_TENSORS:
        raise BadMessage("sequence state is not a bounded list of tensors")
    out: dict[str, np.ndarray] = {}
    types = {s.input_name: s.datatype for s in states} if states is not None else None
    for item in items:
        name, datatype, shape, raw = read_tensor(item)
        if name in out:
            raise BadMessage(f"sequence state holds '{name}' twice")
        if types is not None and types.get(name) != datatype:
            want = types.get(name)
            raise BadMessage(
                f"sequence state '{name}' is {datatype}, the model's state is {want}"
                if want
                else f"sequence state holds '{name}', which is not one of the model's states"
            )
        try:
            out[name] = tensors.to_numpy(datatype, shape, raw, name)
        except ConchError as exc:
            raise BadMessage(f"sequence state '{name}': {exc.message}") from None
    if types is not None and set(out) != set(types):
        raise BadMessage(f"sequence state lacks {sorted(set(types) - set(out))}")
    return out


__all__ = ["pack_state", "unpack_state"]
