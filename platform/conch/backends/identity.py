"""Triton's ``identity`` backend (``backend: "identity"``): each output a copy of its input.

Triton tests itself with it: its qa repositories serve the ``nop_*`` steps of ensembles, the
``custom_*`` models and models such as ``identity_delay`` on it, often with a delay to hold
a queue or a batch open. conch serves those configs unchanged. The behaviour is that of
triton-inference-server/identity_backend (``src/identity.cc``), read there and written anew:

- **Pairs by name.** ``OUTPUT<k>`` answers ``INPUT<k>``. A config is refused at load, in
  Triton's words, unless it has as many inputs as outputs, every input is named
  ``INPUT...`` and every output ``OUTPUT...``, every output's suffix is an input's, and the
  two of a pair have one data type and one shape (each one's ``reshape`` where it has one).
- **The request's tensor as it came**: its data type and its shape, so variable
  dimensions, empty tensors and BYTES come back as sent; the config's ``reshape`` applies
  on the way in and out as for every backend (``Backend.reshaped``). Only the requested
  outputs are answered.
- **An optional input** that a request leaves out, whose output it asks for, is answered
  with zeros: the input's config shape, variable dimensions as 1, behind the request's
  batch size (its first input's first dimension) where the model batches.
- **Parameters.** ``execute_delay_ms``: one sleep per execution (a whole batch), before
  the copies; with ``instance_wise_delay_multiplier`` the instance at index *i* sleeps
  that many times *i* delays (at least one), so instances of one model finish at
  different times. ``creation_delay_sec``: a sleep while the model loads.
- **Its custom metric**, ``input_byte_size_counter{model, version}``: the bytes of every
  input copied to an output (``conch.core.custom_metrics``, shown on the metrics port).
- **Any instance kind.** Triton's GPU build copies on the device a ``KIND_GPU`` instance
  names; the bytes are the same, so conch copies them on the host for every kind.

The model has no file: a version is its folder (``conch.core.backend_table``). Not done:
the response parameters (``param0`` ... ``param3``) that Triton's copy attaches to each
response to show the parameters API; conch's backends answer with tensors only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.backends.autocomplete import int_parameter, type_name
from conch.backends.base import Backend, BackendRequest, BackendResult
from conch.core import custom_metrics
from conch.core.datatypes import WIRE_TO_NUMPY
from conch.core.errors import ModelLoadError, Unsupported
from conch.core.model_config import wire_type
from conch.core.tensors import encode_bytes_elements, shape_text

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)

INPUT_PREFIX, OUTPUT_PREFIX = "INPUT", "OUTPUT"
METRIC = "input_byte_size_counter"
METRIC_HELP = "Cumulative input_byte_size across all identity model requests"


@dataclass(frozen=True)
class Pair:
    """One output and the input it copies."""

    output: str
    input: str
    optional: bool  # the input may be left out: then zeros of ``zeros_shape`` answer
    zeros_shape: tuple[int, ...]  # the input's model shape, variable dimensions as 1
    numpy_type: np.dtype  # the input's config data type, for those zeros

    def zeros(self, lead: tuple[int, ...]) -> np.ndarray:
        """What answers for the input left out: zeros (BYTES: empty elements)."""
        shape = lead + self.zeros_shape
        if self.numpy_type.kind == "O":
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, self.numpy_type)


def _model_shape(entry: Any) -> list[int]:
    """An input's or output's shape as the model sees it: its ``reshape``, else its dims."""
    return [int(d) for d in (entry.reshape.shape if entry.HasField("reshape") else entry.dims)]


def pairs(config: ModelConfig) -> list[Pair]:
    """The config's output/input pairs, or the load error Triton's identity backend gives."""

    def refuse(why: str) -> ModelLoadError:
        return ModelLoadError(f"model '{config.name}': {why}")

    if len(config.input) != len(config.output):
        raise refuse("model configuration must have equal input/output pairs")
    inputs: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    for inp, out in zip(config.input, config.output, strict=True):
        if not inp.name.startswith(INPUT_PREFIX):
            raise refuse(f"expected input name to follow INPUT<index> pattern, got '{inp.name}'")
        if not out.name.startswith(OUTPUT_PREFIX):
            raise refuse(f"expected output name to follow OUTPUT<index> pattern, got '{out.name}'")
        inputs[inp.name[len(INPUT_PREFIX) :]] = inp
        outputs[out.name[len(OUTPUT_PREFIX) :]] = out
    found = []
    for index, out in sorted(outputs.items()):
        inp = inputs.get(index)
        if inp is None:
            raise refuse("expected input and output indices to match")
        if inp.data_type != out.data_type:
            raise refuse(
                "expected input and output datatype to match, got "
                f"{type_name(inp.data_type)} and {type_name(out.data_type)}"
            )
        shape = _model_shape(inp)
        if shape != _model_shape(out):
            raise refuse(
                "expected input and output shape to match, got "
                f"{shape_text(shape)} and {shape_text(_model_shape(out))}"
            )
        found.append(
            Pair(
                output=out.name,
                input=inp.name,
                optional=inp.optional,
                zeros_shape=tuple(1 if d < 0 else d for d in shape),
                numpy_type=WIRE_TO_NUMPY[wire_type(inp.data_type)],
            )
        )
    return found


def byte_size(arr: np.ndarray) -> int:
    """A tensor's size as Triton counts an input's bytes (BYTES: length-prefixed)."""
    if arr.dtype.kind == "O":
        return len(encode_bytes_elements(arr.ravel().tolist()))
    return int(arr.nbytes)


class IdentityBackend(Backend):
    """Answers each request with copies of its inputs (see the module's docstring)."""

    labels: custom_metrics.Labels | None = None  # its metric's, once it holds it

    def load(self) -> None:
        config = self.spec.config
        self.pairs = {p.output: p for p in pairs(config)}
        delay_ms = int_parameter(config, "execute_delay_ms", 0)
        multiplier = int_parameter(config, "instance_wise_delay_multiplier", 0)
        if delay_ms < 0 or multiplier < 0:
            raise ModelLoadError(
                f"model '{self.spec.name}': execute_delay_ms and instance_wise_delay_multiplier "
                "must not be negative"
            )
        self.delay_s = delay_ms * max(multiplier * self._index(), 1) / 1000
        self.batches = config.max_batch_size > 0
        creation_s = int_parameter(config, "creation_delay_sec", 0)
        if creation_s > 0:
            log.info("model '%s': creation delay of %d s", self.spec.name, creation_s)
            time.sleep(creation_s)
        labels = custom_metrics.labels_key(
            {"model": self.spec.name, "version": str(self.spec.version)}
        )
        custom_metrics.REGISTRY.hold_family(METRIC, METRIC_HELP, custom_metrics.COUNTER)
        custom_metrics.REGISTRY.hold_metric(METRIC, labels, None)
        self.labels = labels

    def _index(self) -> int:
        """The instance's index (its name is ``<group>_<index>``). Triton counts instances
        across a model's groups; the configs that set a multiplier have one group."""
        tail = self.instance.name.rpartition("_")[2]
        return int(tail) if tail.isdigit() else 0

    def execute(self, requests: list[BackendRequest]) -> list[BackendResult | None]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return [self._answer(request) for request in requests]

    def _answer(self, request: BackendRequest) -> BackendResult:
        inputs = self.reshaped(request.inputs, inputs=True)
        out: dict[str, np.ndarray] = {}
        copied = 0
        for name in request.outputs:
            pair = self.pairs[name]
            arr = inputs.get(pair.input)
            if arr is not None:
                out[name] = arr
                copied += byte_size(arr)
            elif pair.optional:
                out[name] = pair.zeros(self._lead(inputs))
            else:
                return Unsupported(f"failed to get input '{pair.input}'")
        if copied and self.labels is not None:
            custom_metrics.REGISTRY.increment(METRIC, self.labels, copied)
        return self.reshaped(out, inputs=False)

    def _lead(self, inputs: dict[str, np.ndarray]) -> tuple[int, ...]:
        """The batch dimension an optional input's zeros take: the request's first input's
        first dimension, where the model batches and the request has one."""
        first = next(iter(inputs.values()), None)
        if not self.batches or first is None or first.ndim == 0 or first.shape[0] == 0:
            return ()
        return (first.shape[0],)

    def unload(self) -> None:
        if self.labels is not None:
            custom_metrics.REGISTRY.drop_metric(METRIC, self.labels)
            custom_metrics.REGISTRY.drop_family(METRIC)
            self.labels = None


__all__ = ["METRIC", "IdentityBackend", "Pair", "byte_size", "pairs"]
