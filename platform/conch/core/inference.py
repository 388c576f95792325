"""An infer request and response on neutral types: what every frontend decodes into.

The HTTP adapter's codec decodes Triton's JSON and binary-tensor framing into these;
the batch-job driver decodes JSON lines into them; the data plane checks and queues
them without knowing which protocol carried them. Tensors stay in Triton's raw binary
form end to end (no re-encoding between the body, Redis and the backend).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conch.core.tensors import WireTensor

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

# Request parameters Triton interprets itself; they are kept in InferRequest.parameters.
RESERVED_PARAMETERS = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "binary_data_output",
    }
)
# The longest a streamed request's responses may be kept for a client that reconnects
# (``--stream-keep-secs``; ``conch.wire.stream_log``).
MAX_STREAM_KEEP_S = 7 * 24 * 3600
# The one ``triton_`` request parameter a client may send (Triton's frontends set it).
ALLOWED_TRITON_PARAMETERS = frozenset({"triton_enable_empty_final_response"})


def already_in_request(kind: str, name: str) -> str:
    """Triton's words for a tensor a request names twice (``kind``: ``input`` or
    ``output``), whichever protocol or BLS call carried it: its core refuses both so."""
    return f"{kind} '{name}' already exists in request"


@dataclass
class InputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes | memoryview  # Triton binary bytes (an HTTP body's own, as a view of it)


@dataclass
class RequestedOutput:
    name: str
    binary: bool
    class_count: int = 0


@dataclass
class InferRequest:
    id: str
    inputs: list[InputTensor]
    # None = all outputs, each binary per binary_data_output
    outputs: list[RequestedOutput] | None
    binary_data_output: bool
    # request params (priority, timeout, custom), reserved keys kept
    parameters: dict[str, Any]

    def narrowed(self, held: Iterable[str]) -> InferRequest:
        """This request asking only for those of its outputs in ``held``: a decoupled
        model's response need not hold every output asked for (a last one may hold none)."""
        if self.outputs is None:
            return self
        names = set(held)
        if all(o.name in names for o in self.outputs):
            return self
        return dataclasses.replace(self, outputs=[o for o in self.outputs if o.name in names])

    # What a queue message carries of the request (gateway infer, jobs, batch lines).
    def wire_inputs(self) -> list[WireTensor]:
        return [WireTensor(t.name, t.datatype, tuple(t.shape), t.raw) for t in self.inputs]

    def output_names(self, config: ModelConfig) -> list[str]:
        """The outputs asked for, in order; all of the model's when none are listed."""
        if self.outputs is None:
            return [o.name for o in config.output]
        return [o.name for o in self.outputs]

    def custom_parameters(self) -> dict[str, Any]:
        """The parameters a model sees: the request's, less the protocol's own."""
        return {k: v for k, v in self.parameters.items() if k not in RESERVED_PARAMETERS}


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes
