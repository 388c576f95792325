"""Triton's ``model_warmup``: sample requests run through a model before it is ready.

Each warmup entry becomes ``batch_size`` requests (batch 1 each when the model batches)
executed together, ``count`` times (0 means once), exactly as the backend will later see
a dynamic batch. Data is zeros, random values, or a raw file in ``<model>/warmup/``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from conch.backends import Backend, BackendRequest, ModelSpec
from conch.core import tensors
from conch.core.datatypes import WIRE_TO_NUMPY
from conch.core.errors import ConchError, ModelLoadError
from conch.core.model_config import wire_type

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"


def _sample(
    spec: ModelSpec, name: str, inp: Any, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    datatype = wire_type(inp.data_type)
    kind = inp.WhichOneof("input_data_type")
    count = int(np.prod(shape)) if shape else 1
    if kind == "input_data_file":
        path = (spec.path / WARMUP_FOLDER / inp.input_data_file).resolve()
        if not path.is_relative_to((spec.path / WARMUP_FOLDER).resolve()) or not path.is_file():
            raise ModelLoadError(
                f"warmup file '{inp.input_data_file}' for input '{name}' is not in {spec.path / WARMUP_FOLDER}"
            )
        try:
            return tensors.to_numpy(datatype, shape, path.read_bytes(), name)
        except ConchError as exc:
            raise ModelLoadError(
                f"warmup file '{inp.input_data_file}' for input '{name}': {exc.message}"
            ) from None
    if datatype == "BYTES":
        # Triton sends empty strings for both zero and random data.
        return np.array([b""] * count, dtype=object).reshape(shape)
    dtype = WIRE_TO_NUMPY[datatype]
    if kind == "random_data" and datatype != "BOOL":
        if dtype.kind == "f" or datatype == "BF16":
            return rng.standard_normal(shape).astype(dtype)
        return rng.integers(0, 100, size=shape).astype(dtype)
    if kind == "random_data":
        return rng.integers(0, 2, size=shape).astype(bool)
    return np.zeros(shape, dtype=dtype)


def warmup_requests(spec: ModelSpec) -> list[tuple[str, list[BackendRequest], int]]:
    """(name, the batch, times to run it) for each warmup entry of the config."""
    config = spec.config
    outputs = [o.name for o in config.output]
    rng = np.random.default_rng(0)
    out: list[tuple[str, list[BackendRequest], int]] = []
    for w in config.model_warmup:
        label = w.name or "warmup"
        batch = max(1, w.batch_size)
        if config.max_batch_size == 0 and batch != 1:
            raise ModelLoadError(
                f"warmup '{label}': batch_size must be 1 for a model that does not batch"
            )
        requests = []
        for _ in range(batch):
            inputs = {}
            for name, inp in w.inputs.items():
                dims = tuple(int(d) for d in inp.dims)
                shape = (1, *dims) if config.max_batch_size > 0 else dims
                inputs[name] = _sample(spec, name, inp, shape, rng)
            requests.append(BackendRequest(inputs, outputs, request_id=f"warmup:{label}"))
        out.append((label, requests, max(1, w.count)))
    return out


def run_warmup(backend: Backend, spec: ModelSpec) -> None:
    """Run every warmup sample; any failure fails the model's load, with the reason."""
    try:
        plan = warmup_requests(spec)
    except ModelLoadError as exc:
        raise ModelLoadError(f"model '{spec.name}': {exc.message}") from None
    for label, requests, count in plan:
        started = time.perf_counter()
        for _ in range(count):
            for result in backend.execute(requests):
                if isinstance(result, ConchError):
                    raise ModelLoadError(
                        f"model '{spec.name}' failed warmup '{label}': {result.message}"
                    )
        log.info(
            "model '%s' version %d instance %s: warmup '%s' (%d x %d requests) took %.0f ms",
            spec.name,
            spec.version,
            backend.instance.name,
            label,
            count,
            len(requests),
            (time.perf_counter() - started) * 1000,
        )
