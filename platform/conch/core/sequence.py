"""Triton's sequence batching, protocol-neutral: the config, a request's sequence, the controls.

A stateful model (``sequence_batching`` in its config) sees the requests of one sequence in
order, with control inputs the server makes (START, END, READY, CORRID) and, with implicit
state, the previous step's output state fed back as an input. This module is what every
room agrees on about that: ``SequenceSpec`` read once from the config with Triton's load
errors, the sequence a request names (``sequence_params``, ``check_request``) with Triton's
request errors, the control tensors for a batch (``control_tensors``) exactly as Triton
feeds them, and each state's first value (``SequenceSpec.initial_state``). Routing, slots
and idle timeouts belong to the worker and the gateway; keeping state in Redis to the wire
(``conch.wire.sequence_state``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.core.datatypes import ITEMSIZE, WIRE_TO_NUMPY
from conch.core.errors import ConchError, InvalidArgument, ModelLoadError
from conch.core.model_config import model_config_pb2, wire_type
from conch.core.tensors import to_numpy

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

# Triton's default when max_sequence_idle_microseconds is 0 or unset.
DEFAULT_IDLE_US = 1_000_000
# Where a state's ``initial_state.data_file`` lives: ``<model dir>/initial_state/<file>``.
INITIAL_STATE_DIR = "initial_state"

# Control kinds, as ``ControlSpec.kind`` spells them.
START, END, READY, CORRID = "start", "end", "ready", "corrid"
_KIND_NAMES = {
    "CONTROL_SEQUENCE_START": START,
    "CONTROL_SEQUENCE_END": END,
    "CONTROL_SEQUENCE_READY": READY,
    "CONTROL_SEQUENCE_CORRID": CORRID,
}
# The datatypes Triton allows for a CORRID control (wire names).
CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")

# The request parameters of Triton's sequence extension.
SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END = "sequence_id", "sequence_start", "sequence_end"
SEQUENCE_PARAMETERS = frozenset({SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END})
_UINT64_MAX = 2**64 - 1


# --------------------------------------------------------------------------- the config


@dataclass(frozen=True)
class ControlSpec:
    """One control input: its tensor, its kind, its datatype and its false/true values."""

    name: str
    kind: str  # START | END | READY | CORRID
    datatype: str  # Triton wire datatype: FP32, INT32 or BOOL; CORRID: one of CORRID_TYPES
    false_value: float | int | bool = 0
    true_value: float | int | bool = 1


@dataclass(frozen=True)
class StateSpec:
    """One implicit state: the model reads ``input_name`` and writes ``output_name``."""

    input_name: str
    output_name: str
    datatype: str  # Triton wire datatype
    dims: tuple[int, ...]  # without the batch dimension; -1 where variable
    initial_dims: tuple[int, ...] | None = None  # initial_state's dims, when it has one
    initial_zero: bool = False
    initial_file: str = ""  # initial_state.data_file, under <model dir>/initial_state/
    same_buffer: bool = False  # use_same_buffer_for_input_output (no effect on results)
    growable: bool = False  # use_growable_memory (no effect on results)

    def first_shape(self) -> tuple[int, ...]:
        """The state's shape on a sequence's first step, without the batch dimension:
        the initial state's dims, else the state's dims with each -1 as 1 (Triton's rule)."""
        if self.initial_dims is not None:
            return self.initial_dims
        return tuple(1 if d == -1 else d for d in self.dims)


@dataclass(frozen=True)
class SequenceSpec:
    """A model's ``sequence_batching``, read once and checked with Triton's load errors."""

    strategy: str  # "direct" | "oldest"
    idle_s: float  # max_sequence_idle_microseconds / 1e6 (Triton's 1 s when 0)
    max_batch_size: int
    max_candidate_sequences: int  # Oldest: sequences batched together per instance; 0 unset
    preferred_batch_size: tuple[int, ...]  # Oldest; max_batch_size when the config has none
    max_queue_delay_s: float  # the strategy's max_queue_delay_microseconds / 1e6
    preserve_ordering: bool  # Oldest
    minimum_slot_utilization: float  # Direct
    controls: tuple[ControlSpec, ...]
    states: tuple[StateSpec, ...]

    @classmethod
    def from_config(cls, config: ModelConfig) -> SequenceSpec | None:
        """The model's spec, None without ``sequence_batching``; ``ModelLoadError`` when
        the section is one Triton refuses to load."""
        if not config.HasField("sequence_batching"):
            return None
        sb = config.sequence_batching
        model = config.name
        if sb.iterative_sequence:
            raise ModelLoadError(
                f"model '{model}': sequence_batching.iterative_sequence is not supported by "
                "conch (it serves decoupled iterative models with no sequence batcher)"
            )
        oldest = sb.WhichOneof("strategy_choice") == "oldest"
        max_batch = int(config.max_batch_size)
        preferred: tuple[int, ...] = ()
        if oldest:
            for size in sb.oldest.preferred_batch_size:
                if size <= 0:
                    raise ModelLoadError(
                        f"sequence batching preferred batch size must be positive for {model}"
                    )
                if size > max_batch:
                    raise ModelLoadError(
                        f"sequence batching preferred batch size must be <= max batch size "
                        f"for {model}"
                    )
            preferred = tuple(int(s) for s in sb.oldest.preferred_batch_size)
            if not preferred and max_batch > 0:
                preferred = (max_batch,)
        util = float(sb.direct.minimum_slot_utilization)
        if not 0.0 <= util <= 1.0:
            raise ModelLoadError(
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] "
                f"for {model}"
            )
        delay_us = (sb.oldest if oldest else sb.direct).max_queue_delay_microseconds
        idle_us = sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US
        return cls(
            strategy="oldest" if oldest else "direct",
            idle_s=idle_us / 1e6,
            max_batch_size=max_batch,
            max_candidate_sequences=int(sb.oldest.max_candidate_sequences) if oldest else 0,
            preferred_batch_size=preferred,
            max_queue_delay_s=delay_us / 1e6,
            preserve_ordering=bool(sb.oldest.preserve_ordering) if oldest else False,
            minimum_slot_utilization=util,
            controls=_controls(sb, model),
            states=_states(sb, model, max_batch),
        )

    # -- what the scheduler and the backends ask of it

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @property
    def slots(self) -> int:
        """Sequences one instance serves at once: Direct's batch slots (``max_batch_size``,
        at least 1), or Oldest's candidate sequences (``max_candidate_sequences`` if set)."""
        if self.strategy == "oldest" and self.max_candidate_sequences > 0:
            return self.max_candidate_sequences
        return max(1, self.max_batch_size)

    def control(self, kind: str) -> ControlSpec | None:
        return next((c for c in self.controls if c.kind == kind), None)

    def input_types(self) -> dict[str, str]:
        """The inputs the server feeds besides the config's: controls and state inputs,
        by name, with their wire datatypes."""
        types = {c.name: c.datatype for c in self.controls}
        types.update({s.input_name: s.datatype for s in self.states})
        return types

    def output_types(self) -> dict[str, str]:
        """The state outputs the model produces besides the config's, with datatypes."""
        return {s.output_name: s.datatype for s in self.states}

    def initial_state(self, model_dir: Path) -> dict[str, np.ndarray]:
        """Each state input's value on a sequence's first step, with its batch dimension
        when the model batches: ``initial_state`` zeros or its ``data_file`` read from
        ``<model_dir>/initial_state/``, and zeros where the config gives no initial state
        (Triton hands the model uninitialized memory there; zeros are one such value).
        ``ModelLoadError`` for a missing or short file."""
        out: dict[str, np.ndarray] = {}
        lead = (1,) if self.batched else ()
        for s in self.states:
            shape = (*lead, *s.first_shape())
            if not s.initial_file:
                out[s.input_name] = _zeros(s.datatype, shape)
                continue
            path = model_dir / INITIAL_STATE_DIR / s.initial_file
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise ModelLoadError(
                    f"state '{s.input_name}': cannot read initial_state data_file {path}: {exc}"
                ) from None
            out[s.input_name] = _from_file(s, shape, data)
        return out


def _zeros(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    if datatype == "BYTES":
        arr = np.empty(shape, dtype=object)
        arr.fill(b"")
        return arr
    return np.zeros(shape, dtype=WIRE_TO_NUMPY[datatype])


def _from_file(s: StateSpec, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    """The file's bytes as the state, row-major; extra bytes are ignored, as in Triton."""
    if s.datatype == "BYTES":
        try:
            return to_numpy("BYTES", shape, data, s.input_name)
        except ConchError as exc:
            raise ModelLoadError(
                f"state '{s.input_name}': initial_state data_file {s.initial_file} does not "
                f"hold {int(np.prod(shape))} length-prefixed strings: {exc.message}"
            ) from None
    need = int(np.prod(shape)) * ITEMSIZE[s.datatype]
    if len(data) < need:
        raise ModelLoadError(
            f"initial_state setting expects {need} bytes, but the data provided from "
            f"{s.initial_file} only has {len(data)} bytes."
        )
    return to_numpy(s.datatype, shape, data[:need], s.input_name).copy()


def _kind(value: int) -> str:
    return _KIND_NAMES[model_config_pb2().ModelSequenceBatching.Control.Kind.Name(value)]


def _kind_label(kind: str) -> str:
    return next(k for k, v in _KIND_NAMES.items() if v == kind)


def _controls(sb: Any, model: str) -> tuple[ControlSpec, ...]:
    """The control inputs, with the checks Triton makes when it loads the model."""
    seen_names: set[str] = set()
    seen_kinds: set[str] = set()
    found: list[ControlSpec] = []
    for ci in sb.control_input:
        if not ci.name:
            raise ModelLoadError(f"sequence batching control tensor must have a name for {model}")
        if ci.name in seen_names:
            raise ModelLoadError(
                f"sequence batching control tensor '{ci.name}' is specified for multiple "
                f"control kinds for {model}"
            )
        seen_names.add(ci.name)
        for c in ci.control:
            kind = _kind(c.kind)
            label = _kind_label(kind)
            if kind in seen_kinds:
                raise ModelLoadError(
                    f"sequence batching specifies multiple {label} tensors for {model}"
                )
            seen_kinds.add(kind)
            forms = [
                (n, list(v))
                for n, v in (
                    ("int32_false_true", c.int32_false_true),
                    ("fp32_false_true", c.fp32_false_true),
                    ("bool_false_true", c.bool_false_true),
                )
                if len(v)
            ]
            if kind == CORRID:
                if forms:
                    raise ModelLoadError(
                        "sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {label} for {model}"
                    )
                datatype = wire_type(c.data_type) if c.data_type else ""
                if datatype not in CORRID_TYPES:
                    raise ModelLoadError(
                        f"unexpected data type for control {label} for {model}. Allowed data "
                        "types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and "
                        "TYPE_STRING"
                    )
                found.append(ControlSpec(ci.name, kind, datatype))
                continue
            if not forms:
                raise ModelLoadError(
                    "sequence batching must specify either 'int32_false_true', "
                    f"'fp32_false_true' or 'bool_false_true' for {label} for {model}"
                )
            if len(forms) > 1:
                raise ModelLoadError(
                    "sequence batching specifies more than one from 'int32_false_true', "
                    f"'fp32_false_true' and 'bool_false_true' for {label} for {model}"
                )
            form, values = forms[0]
            if len(values) != 2:
                raise ModelLoadError(
                    f"sequence batching control '{form}' must have exactly 2 entries for "
                    f"{label} for {model}"
                )
            datatype = {"int32_false_true": "INT32", "fp32_false_true": "FP32"}.get(form, "BOOL")
            found.append(ControlSpec(ci.name, kind, datatype, values[0], values[1]))
    return tuple(found)


def _states(sb: Any, model: str, max_batch: int) -> tuple[StateSpec, ...]:
    """The implicit states, with the checks Triton makes when it loads the model."""
    found: list[StateSpec] = []
    inputs: set[str] = set()
    outputs: set[str] = set()
    for st in sb.state:
        where = f"model '{model}': sequence_batching state '{st.input_name}'"
        if not st.input_name or not st.output_name:
            raise ModelLoadError(f"{where}: fields input_name and output_name must be set")
        if st.input_name in inputs:
            raise ModelLoadError(f"State input name '{st.input_name}' specified more than once.")
        if st.output_name in outputs:
            raise ModelLoadError(f"{where}: output_name '{st.output_name}' is used twice")
        inputs.add(st.input_name)
        outputs.add(st.output_name)
        if not st.data_type:
            raise ModelLoadError(f"{where}: field data_type is not set")
        datatype = wire_type(st.data_type)
        dims = tuple(int(d) for d in st.dims)
        if not dims or any(d < -1 or d == 0 for d in dims):
            raise ModelLoadError(
                f"{where}: field dims {list(dims)} must be a non-empty list of positive sizes or -1"
            )
        if st.use_growable_memory and not st.use_same_buffer_for_input_output:
            raise ModelLoadError(
                "In order to 'use_growable_memory', you must also enable 'use_single_buffer' "
                f"for state input name '{st.input_name}'."
            )
        if len(st.initial_state) > 1:
            raise ModelLoadError(
                f"initial_state field for state input '{st.input_name}' must contain exactly "
                f"one or zero element. Found '{len(st.initial_state)}' elements."
            )
        spec = StateSpec(
            st.input_name,
            st.output_name,
            datatype,
            dims,
            same_buffer=st.use_same_buffer_for_input_output,
            growable=st.use_growable_memory,
        )
        if st.initial_state:
            spec = _with_initial(spec, st.initial_state[0])
        found.append(spec)
    return tuple(found)


def _with_initial(spec: StateSpec, init: Any) -> StateSpec:
    name = spec.input_name
    if not init.data_type or wire_type(init.data_type) != spec.datatype:
        raise ModelLoadError(
            f"The data type used for 'initial_state' field of state '{name}' does not match "
            "the state data type."
        )
    if not init.name:
        raise ModelLoadError(
            f"Field 'name' must be set when using initial_state for state input '{name}'."
        )
    dims = tuple(int(d) for d in init.dims)
    if len(dims) != len(spec.dims):
        raise ModelLoadError(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(dims)} != {len(spec.dims)}"
        )
    for have, want in zip(dims, spec.dims, strict=True):
        if have == -1:
            raise ModelLoadError(
                f"'initial_state' field for state input name '{name}' contains variable dimensions."
            )
        if have <= 0:
            raise ModelLoadError(
                f"'initial_state' field for state input name '{name}' has dims {list(dims)}; "
                "each must be positive"
            )
        if want != -1 and have != want:
            raise ModelLoadError(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {have} != {want}"
            )
    which = init.WhichOneof("state_data")
    if which is None:
        raise ModelLoadError(f"initial_state setting expects state'{name}' to have state_data set")
    return StateSpec(
        spec.input_name,
        spec.output_name,
        spec.datatype,
        spec.dims,
        initial_dims=dims,
        initial_zero=which == "zero_data",
        initial_file=init.data_file if which == "data_file" else "",
        same_buffer=spec.same_buffer,
        growable=spec.growable,
    )


# Backends that take control inputs from conch's sequence batcher, and those among them
# that take implicit state (Triton's python backend has no implicit state: a Python model
# keeps its own, by ``request.correlation_id()``). The identity backend copies only its
# INPUT<k>s, so controls pass it by; Triton's qa holds sequences with it (L0_metrics).
CONTROL_BACKENDS = frozenset({"onnxruntime", "pytorch", "python", "identity"})
STATE_BACKENDS = frozenset({"onnxruntime", "pytorch"})


def check(config: ModelConfig, backend: str) -> SequenceSpec | None:
    """Check a model's ``sequence_batching`` when its repository is read (Triton's load
    errors, and what conch's ``backend`` cannot serve); its spec, or None."""
    spec = SequenceSpec.from_config(config)
    if spec is None:
        return None
    model = config.name
    if backend not in CONTROL_BACKENDS:
        raise ModelLoadError(
            f"model '{model}': field sequence_batching is not supported with backend "
            f"'{backend}': conch feeds sequence controls and state to "
            f"{', '.join(sorted(CONTROL_BACKENDS))} models only"
        )
    if spec.states and backend not in STATE_BACKENDS:
        raise ModelLoadError(
            f"model '{model}': sequence_batching.state (implicit state) is not supported by "
            f"the {backend} backend, as in Triton; keep the state in the model, keyed by "
            "request.correlation_id()"
        )
    config_inputs = {i.name for i in config.input}
    clash = sorted(set(spec.input_types()) & config_inputs)
    if clash:
        raise ModelLoadError(
            f"model '{model}': {clash} are sequence control or state inputs, which the server "
            "makes; they may not also be listed as config inputs a client sends"
        )
    return spec


# A model parameter (conch's own): "false" keeps a sequence's implicit state out of Redis,
# for state too large to copy at every step; such a sequence cannot move to another worker.
STATE_IN_REDIS = "sequence_state_in_redis"


def state_in_redis(config: ModelConfig) -> bool:
    """Whether a sequence's implicit state is saved after each step, so the sequence can
    move to another worker (``STATE_IN_REDIS``, default true)."""
    if STATE_IN_REDIS not in config.parameters:
        return True
    raw = config.parameters[STATE_IN_REDIS].string_value.strip().lower()
    if raw not in ("true", "false"):
        raise ModelLoadError(
            f"model '{config.name}': parameter '{STATE_IN_REDIS}' is 'true' or 'false', not '{raw}'"
        )
    return raw == "true"


# --------------------------------------------------------------------------- a request


@dataclass(frozen=True)
class SequenceKey:
    """A request's sequence id: an unsigned 64-bit integer or a string (Triton keeps the
    two apart: 5 and "5" are different sequences)."""

    value: int | str

    @property
    def text(self) -> str:
        """The id as Triton's messages print it."""
        return str(self.value)

    @property
    def key(self) -> str:
        """A string naming the sequence uniquely (for keys and maps): ``i:5`` or ``s:5``."""
        return f"i:{self.value}" if isinstance(self.value, int) else f"s:{self.value}"


def sequence_params(parameters: Mapping[str, Any]) -> tuple[SequenceKey | None, bool, bool]:
    """The sequence a request's parameters name: ``(id, start, end)``, with id None when
    absent, 0 or "" (Triton's "no correlation ID"); ``InvalidArgument`` for a wrong type."""
    raw = parameters.get(SEQUENCE_ID)
    key: SequenceKey | None = None
    if raw is not None:
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise InvalidArgument(
                f"parameter '{SEQUENCE_ID}' must be an unsigned integer or a string"
            )
        if isinstance(raw, int) and not 0 <= raw <= _UINT64_MAX:
            raise InvalidArgument(
                f"parameter '{SEQUENCE_ID}' must be an unsigned 64-bit integer, got {raw}"
            )
        if raw not in (0, ""):
            key = SequenceKey(raw)
    flags = []
    for name in (SEQUENCE_START, SEQUENCE_END):
        value = parameters.get(name, False)
        if not isinstance(value, bool):
            raise InvalidArgument(f"parameter '{name}' must be a boolean")
        flags.append(value)
    return key, flags[0], flags[1]


def check_request(
    spec: SequenceSpec | None,
    model: str,
    parameters: Mapping[str, Any],
    *,
    batch_size: int = 1,
    request_id: str = "",
) -> SequenceKey | None:
    """Triton's checks of a request to a sequence model, with its messages; the sequence
    it names. A model without ``sequence_batching`` ignores the sequence parameters, as
    Triton's other schedulers do (None). Whether a continuing request's sequence is live
    is the scheduler's to say (``not_started_error``)."""
    key, _start, _end = sequence_params(parameters)
    if spec is None:
        return None
    corrid = spec.control(CORRID)
    if corrid is not None:
        given = "BYTES" if key is not None and isinstance(key.value, str) else "UINT64"
        if (given == "BYTES") != (corrid.datatype == "BYTES"):
            prefix = f"[request id: {request_id}] " if request_id else ""
            raise InvalidArgument(
                f"{prefix}sequence batching control '{corrid.name}' data-type is '{given}', "
                f"but model '{model}' expects '{corrid.datatype}'"
            )
    if batch_size > 1:
        raise InvalidArgument(
            f"inference request to model '{model}' must specify batch-size 1 due to "
            "requirements of sequence batcher"
        )
    if key is None:
        raise InvalidArgument(
            f"inference request to model '{model}' must specify a non-zero or non-empty "
            "correlation ID"
        )
    return key


def not_started_error(model: str, sequence: SequenceKey) -> ConchError:
    """Triton's error for a continuing request whose sequence never started, has ended, or
    idled out."""
    return InvalidArgument(
        f"inference request for sequence {sequence.text} to model '{model}' must specify "
        "the START flag on the first request of the sequence"
    )


# --------------------------------------------------------------------------- controls


@dataclass(frozen=True)
class RowControl:
    """One batch row's control values: a request of a sequence, or an empty slot
    (``ready=False``: START, END and READY all false)."""

    start: bool = False
    end: bool = False
    ready: bool = True
    corrid: int | str = 0


def _corrid_values(control: ControlSpec, rows: Sequence[RowControl]) -> np.ndarray:
    if control.datatype == "BYTES":
        out = np.empty(len(rows), dtype=object)
        for i, r in enumerate(rows):
            value = r.corrid if isinstance(r.corrid, str) else ""
            out[i] = value.encode("utf-8")
        return out
    ids = np.array([r.corrid if isinstance(r.corrid, int) else 0 for r in rows], dtype="<u8")
    # Triton copies the id's low bytes into the tensor: a 32-bit CORRID holds the id
    # modulo 2**32, and INT64 the same 64 bits read as signed.
    return ids.astype(WIRE_TO_NUMPY[control.datatype], casting="unsafe")


def _on(control: ControlSpec, row: RowControl) -> bool:
    """Whether a START, END or READY control is true for ``row`` (an empty slot: none)."""
    if control.kind == READY:
        return row.ready
    return row.ready and (row.start if control.kind == START else row.end)


def control_tensors(spec: SequenceSpec, rows: Sequence[RowControl]) -> dict[str, np.ndarray]:
    """The control inputs for a batch of ``rows``, each shaped ``[len(rows), 1]`` (``[1]``
    for a model that does not batch) in its configured datatype and false/true values."""
    if not spec.batched and len(rows) != 1:
        raise ValueError(f"a model that does not batch takes 1 row of controls, not {len(rows)}")
    out: dict[str, np.ndarray] = {}
    for control in spec.controls:
        if control.kind == CORRID:
            flat = _corrid_values(control, rows)
        else:
            values = [control.true_value if _on(control, r) else control.false_value for r in rows]
            flat = np.array(values, dtype=WIRE_TO_NUMPY[control.datatype])
        out[control.name] = flat.reshape((len(rows), 1) if spec.batched else (1,))
    return out


__all__ = [
    "CONTROL_BACKENDS",
    "CORRID",
    "CORRID_TYPES",
    "DEFAULT_IDLE_US",
    "END",
    "INITIAL_STATE_DIR",
    "READY",
    "SEQUENCE_END",
    "SEQUENCE_ID",
    "SEQUENCE_PARAMETERS",
    "SEQUENCE_START",
    "START",
    "STATE_BACKENDS",
    "STATE_IN_REDIS",
    "ControlSpec",
    "RowControl",
    "SequenceKey",
    "SequenceSpec",
    "StateSpec",
    "check",
    "check_request",
    "control_tensors",
    "not_started_error",
    "sequence_params",
    "state_in_redis",
]
