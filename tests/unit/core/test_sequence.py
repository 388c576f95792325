"""Sequence batching's core (issue 17): the config, a request's sequence, controls, state.

The backends' side is proved in process with the test models of ``tests/models.py``: a
sequence is fed step by step with the control tensors and state a sequence batcher makes
(``conch.core.sequence``), and the running sums are checked, several sequences per batch.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import msgpack
import numpy as np
import pytest

from conch.backends import BackendRequest, backend_class
from conch.backends.completion import complete
from conch.core.errors import InvalidArgument, ModelLoadError
from conch.core.model_config import parse_config
from conch.core.repository import ModelRepository
from conch.core.sequence import (
    CORRID,
    READY,
    START,
    RowControl,
    SequenceKey,
    SequenceSpec,
    check_request,
    control_tensors,
    not_started_error,
    sequence_params,
)
from conch.wire.messages import BadMessage
from conch.wire.sequence_state import pack_state, unpack_state

from models import seq_onnx_accumulator, seq_python_accumulator, seq_torch_accumulator

BASE = """
name: "s"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def spec_of(sequence: str, base: str = BASE) -> SequenceSpec:
    spec = SequenceSpec.from_config(parse_config(base + sequence, model="s", source="t"))
    assert spec is not None
    return spec


# -- the config -------------------------------------------------------------------------


def test_a_model_without_sequence_batching_has_no_spec() -> None:
    assert SequenceSpec.from_config(parse_config(BASE, model="s", source="t")) is None


def test_direct_with_defaults() -> None:
    spec = spec_of("sequence_batching { }")
    assert spec.strategy == "direct"
    assert spec.idle_s == 1.0  # Triton's default, 1 s
    assert spec.slots == 8 and spec.controls == () and spec.states == ()


def test_oldest_reads_its_fields_and_prefers_full_batches() -> None:
    spec = spec_of(
        "sequence_batching { max_sequence_idle_microseconds: 2500000 oldest { "
        "max_candidate_sequences: 5 max_queue_delay_microseconds: 300 preserve_ordering: true } }"
    )
    assert (spec.strategy, spec.idle_s, spec.slots) == ("oldest", 2.5, 5)
    assert spec.preferred_batch_size == (8,)
    assert spec.max_queue_delay_s == pytest.approx(0.0003) and spec.preserve_ordering


def test_controls_and_states_are_read_with_their_types() -> None:
    spec = spec_of(
        """sequence_batching {
          control_input [
            { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 5, 7 ] } ] },
            { name: "E" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
            { name: "R" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
            { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
          ]
          state [ { input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]
        }"""
    )
    assert [(c.name, c.kind, c.datatype) for c in spec.controls] == [
        ("S", START, "INT32"),
        ("E", "end", "BOOL"),
        ("R", READY, "FP32"),
        ("C", CORRID, "BYTES"),
    ]
    assert (spec.controls[0].false_value, spec.controls[0].true_value) == (5, 7)
    assert spec.input_types() == {
        "S": "INT32",
        "E": "BOOL",
        "R": "FP32",
        "C": "BYTES",
        "SI": "FP32",
    }
    assert spec.output_types() == {"SO": "FP32"}
    assert spec.states[0].first_shape() == (1, 2)  # -1 becomes 1 on the first step


@pytest.mark.parametrize(
    ("sequence", "message"),
    [
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]',
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            "'bool_false_true' for CONTROL_SEQUENCE_START for s",
        ),
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ]",
            "specifies more than one from",
        ),
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 1 ] } ] } ]",
            "sequence batching control 'int32_false_true' must have exactly 2 entries for "
            "CONTROL_SEQUENCE_START for s",
        ),
        (
            'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_END '
            'fp32_false_true: [ 0, 1 ] } ] }, { name: "A" control [ { kind: '
            "CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] } ]",
            "sequence batching control tensor 'A' is specified for multiple control kinds for s",
        ),
        (
            'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_END '
            'fp32_false_true: [ 0, 1 ] } ] }, { name: "B" control [ { kind: '
            "CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] } ]",
            "sequence batching specifies multiple CONTROL_SEQUENCE_END tensors for s",
        ),
        (
            'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
            "data_type: TYPE_FP32 } ] } ]",
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for s",
        ),
        (
            'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
            "data_type: TYPE_UINT64 int32_false_true: [ 0, 1 ] } ] } ]",
            "sequence batching must not specify either",
        ),
        ("oldest { preferred_batch_size: [ 9 ] }", "preferred batch size must be <= max batch"),
        ("oldest { preferred_batch_size: [ 0 ] }", "preferred batch size must be positive"),
        (
            'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ] '
            'initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" } } ]',
            "The data type used for 'initial_state' field of state 'I' does not match",
        ),
        (
            'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ -1 ] '
            'initial_state { data_type: TYPE_FP32 dims: [ -1 ] zero_data: true name: "z" } } ]',
            "'initial_state' field for state input name 'I' contains variable dimensions.",
        ),
        (
            'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 2 ] '
            'initial_state { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true name: "z" } } ]',
            "'initial_state' dim for input name 'I' doesn't match 'state' dim description. 3 != 2",
        ),
        (
            'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 2 ] '
            "initial_state { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } ]",
            "Field 'name' must be set when using initial_state for state input 'I'.",
        ),
        (
            'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ] }, '
            '{ input_name: "I" output_name: "P" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "State input name 'I' specified more than once.",
        ),
        (
            'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ] '
            "use_growable_memory: true } ]",
            "In order to 'use_growable_memory', you must also enable",
        ),
        ("iterative_sequence: true", "iterative_sequence is not supported"),
    ],
)
def test_configs_triton_refuses_to_load_are_refused_with_its_words(
    sequence: str, message: str
) -> None:
    with pytest.raises(ModelLoadError) as err:
        spec_of(f"sequence_batching {{ {sequence} }}")
    assert message in err.value.message, err.value.message


def test_initial_state_zero_from_file_and_default(tmp_path: Path) -> None:
    spec = spec_of(
        """sequence_batching { state [
          { input_name: "Z" output_name: "Z_OUT" data_type: TYPE_INT32 dims: [ -1 ]
            initial_state { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true name: "z" } },
          { input_name: "F" output_name: "F_OUT" data_type: TYPE_FP32 dims: [ 2 ]
            initial_state { data_type: TYPE_FP32 dims: [ 2 ] data_file: "f.bin" name: "f" } },
          { input_name: "D" output_name: "D_OUT" data_type: TYPE_FP32 dims: [ -1, 4 ] }
        ] }"""
    )
    (tmp_path / "initial_state").mkdir()
    # Triton reads <model dir>/initial_state/<data_file>, row-major; extra bytes are ignored.
    (tmp_path / "initial_state" / "f.bin").write_bytes(np.array([1.5, -2.0, 9.0], "<f4").tobytes())
    state = spec.initial_state(tmp_path)
    assert state["Z"].dtype == np.int32 and state["Z"].tolist() == [[0, 0, 0]]
    assert state["F"].dtype == np.float32 and state["F"].tolist() == [[1.5, -2.0]]
    assert state["D"].shape == (1, 1, 4) and not state["D"].any()


def test_a_short_or_missing_initial_state_file_is_a_load_error(tmp_path: Path) -> None:
    spec = spec_of(
        'sequence_batching { state [ { input_name: "F" output_name: "O" data_type: TYPE_FP32 '
        'dims: [ 4 ] initial_state { data_type: TYPE_FP32 dims: [ 4 ] data_file: "f.bin" '
        'name: "f" } } ] }'
    )
    with pytest.raises(ModelLoadError, match="cannot read initial_state data_file"):
        spec.initial_state(tmp_path)
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "f.bin").write_bytes(b"\0" * 15)
    with pytest.raises(
        ModelLoadError, match=r"expects 16 bytes, but the data provided from f\.bin"
    ):
        spec.initial_state(tmp_path)


# -- a request --------------------------------------------------------------------------


def test_sequence_params_read_triton_ids() -> None:
    assert sequence_params({}) == (None, False, False)
    assert sequence_params({"sequence_id": 0}) == (None, False, False)  # 0: no sequence
    assert sequence_params({"sequence_id": ""})[0] is None
    key, start, end = sequence_params(
        {"sequence_id": 2**64 - 1, "sequence_start": True, "sequence_end": False}
    )
    assert (key, start, end) == (SequenceKey(2**64 - 1), True, False)
    assert SequenceKey(5).key != SequenceKey("5").key  # an int and a string never meet
    for bad in ({"sequence_id": True}, {"sequence_id": 1.5}, {"sequence_id": -1}):
        with pytest.raises(InvalidArgument, match="sequence_id"):
            sequence_params(bad)
    with pytest.raises(InvalidArgument, match="'sequence_start' must be a boolean"):
        sequence_params({"sequence_id": 1, "sequence_start": 1})


def test_check_request_with_tritons_errors() -> None:
    spec = spec_of(
        'sequence_batching { control_input [ { name: "C" control [ { kind: '
        "CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ] }"
    )
    assert check_request(None, "plain", {"sequence_id": "x"}) is None  # ignored, as in Triton
    assert check_request(spec, "s", {"sequence_id": 3}) == SequenceKey(3)
    with pytest.raises(InvalidArgument) as err:
        check_request(spec, "s", {"sequence_start": True})
    assert err.value.message == (
        "inference request to model 's' must specify a non-zero or non-empty correlation ID"
    )
    with pytest.raises(InvalidArgument) as err:
        check_request(spec, "s", {"sequence_id": "abc"}, request_id="r1")
    assert err.value.message == (
        "[request id: r1] sequence batching control 'C' data-type is 'BYTES', but model 's' "
        "expects 'UINT64'"
    )
    with pytest.raises(InvalidArgument, match="must specify batch-size 1 due to requirements"):
        check_request(spec, "s", {"sequence_id": 3}, batch_size=2)
    assert not_started_error("s", SequenceKey(42)).message == (
        "inference request for sequence 42 to model 's' must specify the START flag on the "
        "first request of the sequence"
    )
    assert not_started_error("s", SequenceKey("ab")).status == 400


# -- control tensors --------------------------------------------------------------------

CONTROLS = """sequence_batching { control_input [
  { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
  { name: "E" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 10, 20 ] } ] },
  { name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
  { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] } ] }"""


def test_control_tensors_are_what_triton_feeds() -> None:
    spec = spec_of(CONTROLS % "TYPE_UINT64")
    rows = [
        RowControl(start=True, corrid=7),
        RowControl(end=True, corrid=2**64 - 1),
        RowControl(ready=False, start=True, end=True, corrid=0),  # an empty slot: all false
    ]
    t = control_tensors(spec, rows)
    assert t["S"].dtype == np.float32 and t["S"].tolist() == [[1.0], [0.0], [0.0]]
    assert t["E"].dtype == np.int32 and t["E"].tolist() == [[10], [20], [10]]
    assert t["R"].dtype == np.bool_ and t["R"].tolist() == [[True], [True], [False]]
    assert t["C"].dtype == np.uint64 and t["C"].tolist() == [[7], [2**64 - 1], [0]]


@pytest.mark.parametrize(
    ("datatype", "dtype", "value"),
    [
        ("TYPE_UINT32", np.uint32, (2**32 + 5) % 2**32),  # the id's low 4 bytes, as Triton
        ("TYPE_INT32", np.int32, -1),
        ("TYPE_INT64", np.int64, -1),
    ],
)
def test_corrid_in_narrower_or_signed_types(datatype: str, dtype: type, value: int) -> None:
    spec = spec_of(CONTROLS % datatype)
    ident = 2**32 + 5 if datatype == "TYPE_UINT32" else 2**64 - 1
    t = control_tensors(spec, [RowControl(corrid=ident)])
    assert t["C"].dtype == dtype and t["C"].tolist() == [[value]]


def test_string_corrid_and_a_model_that_does_not_batch() -> None:
    base = BASE.replace("max_batch_size: 8", "max_batch_size: 0")
    spec = spec_of(CONTROLS % "TYPE_STRING", base)
    t = control_tensors(spec, [RowControl(start=True, corrid="caf\u00e9")])
    assert t["C"].shape == (1,) and t["C"][0] == "caf\u00e9".encode()
    assert t["S"].shape == (1,)
    with pytest.raises(ValueError, match="does not batch"):
        control_tensors(spec, [RowControl(), RowControl()])


# -- state in Redis's form --------------------------------------------------------------

STATE = """sequence_batching { state [
  { input_name: "A" output_name: "A_OUT" data_type: TYPE_FP32 dims: [ -1 ] },
  { input_name: "B" output_name: "B_OUT" data_type: TYPE_STRING dims: [ 1 ] } ] }"""


def test_state_round_trips_and_is_checked_when_read_back() -> None:
    spec = spec_of(STATE)
    arrays = {
        "A": np.array([[1.5, 2.5, -3.0]], np.float32),
        "B": np.array([[b"hello"]], dtype=object),
    }
    data = pack_state(arrays, spec.states)
    back = unpack_state(data, spec.states)
    assert back["A"].dtype == np.float32 and back["A"].tolist() == [[1.5, 2.5, -3.0]]
    assert back["B"].tolist() == [[b"hello"]]
    # What is not the model's state is refused, never trusted.
    with pytest.raises(BadMessage, match="lacks"):
        unpack_state(pack_state({"A": arrays["A"]}), spec.states)
    with pytest.raises(BadMessage, match="is FP64, the model's state is FP32"):
        unpack_state(pack_state({**arrays, "A": arrays["A"].astype(np.float64)}), spec.states)
    with pytest.raises(BadMessage, match="not one of the model's states"):
        unpack_state(pack_state({**arrays, "X": arrays["A"]}), spec.states)
    short = msgpack.packb([["A", "FP32", [1, 3], b"\0" * 11]], use_bin_type=True)
    with pytest.raises(BadMessage, match="expected 12 bytes"):
        unpack_state(short)
    with pytest.raises(BadMessage):
        unpack_state(pickle.dumps(arrays))


# -- the repository ---------------------------------------------------------------------


def _scan(root: Path) -> dict:
    return ModelRepository(root, complete=complete, gpu_count=0).scan()


def test_sequence_models_load_and_read_as_tritons_config(tmp_path: Path) -> None:
    seq_onnx_accumulator(tmp_path / "onnx_seq")
    seq_onnx_accumulator(tmp_path / "onnx_old", "oldest")
    seq_python_accumulator(tmp_path / "py_seq")
    entries = _scan(tmp_path)
    for name in ("onnx_seq", "onnx_old", "py_seq"):
        assert entries[name].error is None, entries[name].error
    cfg = entries["onnx_seq"].config
    assert cfg.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    # control and state tensors stay out of the inputs a client sends
    assert [i.name for i in cfg.input] == ["INPUT"]
    assert [o.name for o in cfg.output] == ["OUTPUT", "CORRID_OUT"]
    assert list(entries["onnx_old"].config.sequence_batching.oldest.preferred_batch_size) == [8]


def test_what_conch_cannot_serve_is_refused_with_the_reason(tmp_path: Path) -> None:
    seq_python_accumulator(tmp_path / "py_state")
    text = (tmp_path / "py_state" / "config.pbtxt").read_text()
    (tmp_path / "py_state" / "config.pbtxt").write_text(
        text.replace(
            "sequence_batching {",
            'sequence_batching {\n  state [ { input_name: "I" output_name: "O" '
            "data_type: TYPE_INT32 dims: [ 1 ] } ]",
        )
    )
    seq_python_accumulator(tmp_path / "cached")
    with (tmp_path / "cached" / "config.pbtxt").open("a") as f:
        f.write("response_cache { enable: true }\n")
    trt = tmp_path / "trt"
    (trt / "1").mkdir(parents=True)
    (trt / "1" / "model.plan").write_bytes(b"not an engine")
    (trt / "config.pbtxt").write_text(
        'platform: "tensorrt_plan"\nmax_batch_size: 8\n'
        'input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]\nsequence_batching { }\n'
    )
    entries = ModelRepository(tmp_path, complete=complete, gpu_count=0, auto_complete=False).scan()
    assert "implicit state) is not supported by the python backend" in entries["py_state"].error
    assert (
        "Response Cache does not currently support model cached with sequence batching "
        "scheduler. Please disable the response cache." in entries["cached"].error
    )
    assert "sequence_batching is not supported with backend 'tensorrt'" in entries["trt"].error


# -- the backends, fed as a sequence batcher feeds them ---------------------------------


def _load(root: Path, name: str):
    entry = ModelRepository(root, complete=complete, gpu_count=0).read_model(name)
    assert entry.error is None, entry.error
    spec = entry.spec(entry.latest())
    backend = backend_class(entry.backend)(spec, entry.instances()[0])
    backend.load()
    return backend, SequenceSpec.from_config(spec.config), entry.path


class Batcher:
    """What the lead's sequence batcher does around a backend, in its simplest form: one
    row per sequence, controls from ``control_tensors``, each state kept between steps
    (here in the ``pack_state`` form it takes in Redis)."""

    def __init__(self, backend, spec: SequenceSpec, model_dir: Path, names: dict[str, str]):
        self.backend, self.spec, self.names = backend, spec, names
        self.initial = spec.initial_state(model_dir)
        self.states: dict[int, bytes] = {}

    def step(self, batch: list[tuple[int, int, bool, bool]]) -> list[tuple[int, int]]:
        """Run one batch of (sequence, value, start, end); (sum, CORRID seen) per row."""
        requests = []
        for seq, value, start, end in batch:
            inputs = {self.names["INPUT"]: np.array([[value]], np.int32)}
            inputs.update(control_tensors(self.spec, [RowControl(start, end, True, seq)]))
            if start:
                inputs.update(self.initial)
            else:
                inputs.update(unpack_state(self.states[seq], self.spec.states))
            outputs = [self.names["OUTPUT"], self.names["CORRID_OUT"], *self.spec.output_types()]
            requests.append(BackendRequest(inputs, outputs))
        results = self.backend.execute(requests)
        out = []
        for (seq, _value, _start, end), result in zip(batch, results, strict=True):
            assert isinstance(result, dict), result
            state = {s.input_name: result[s.output_name] for s in self.spec.states}
            if end:
                self.states.pop(seq, None)
            else:
                self.states[seq] = pack_state(state, self.spec.states)
            out.append((int(result[self.names["OUTPUT"]][0, 0]), result[self.names["CORRID_OUT"]]))
        return out


SEQUENCES = {11: [3, 4, 5, 6], 2**63 + 9: [10, -20, 30], 7: [1, 1]}


def _interleaved() -> list[list[tuple[int, int, bool, bool]]]:
    """Batches of one step of each live sequence, sequences starting and ending at
    different times (7 starts late), as Direct's slots run them."""
    batches: list[list[tuple[int, int, bool, bool]]] = []
    starts = {11: 0, 2**63 + 9: 0, 7: 1}
    for t in range(5):
        batch = []
        for seq, values in SEQUENCES.items():
            i = t - starts[seq]
            if 0 <= i < len(values):
                batch.append((seq, values[i], i == 0, i == len(values) - 1))
        batches.append(batch)
    return batches


def _expected(batch: list[tuple[int, int, bool, bool]], seen: dict[int, int]) -> list[int]:
    sums = []
    for seq, value, start, _end in batch:
        seen[seq] = (0 if start else seen[seq]) + value
        sums.append(seen[seq])
    return sums


def _runs_interleaved(loaded: tuple, names: dict[str, str]) -> None:
    """Run ``_interleaved`` through a loaded accumulator: each row's sum and CORRID."""
    batcher, seen = Batcher(*loaded, names), {}
    for batch in _interleaved():
        got = batcher.step(batch)
        assert [s for s, _ in got] == _expected(batch, seen)
        assert [int(c[0, 0]) for _, c in got] == [seq for seq, *_ in batch]
    assert batcher.states == {}  # every sequence ended


@pytest.mark.parametrize("control", ["fp32", "int32"])
def test_onnx_accumulator_keeps_each_sequence_in_implicit_state(tmp_path, control) -> None:
    seq_onnx_accumulator(tmp_path / "acc", control=control)
    names = {"INPUT": "INPUT", "OUTPUT": "OUTPUT", "CORRID_OUT": "CORRID_OUT"}
    _runs_interleaved(_load(tmp_path, "acc"), names)


def test_onnx_accumulator_holds_its_state_when_a_row_is_not_ready(tmp_path) -> None:
    seq_onnx_accumulator(tmp_path / "acc")
    backend, spec, _path = _load(tmp_path, "acc")
    state = {"STATE_IN": np.array([[5], [9]], np.int32)}
    inputs = {"INPUT": np.array([[1], [100]], np.int32), **state}
    inputs.update(control_tensors(spec, [RowControl(corrid=1), RowControl(ready=False)]))
    (result,) = backend.execute([BackendRequest(inputs, ["OUTPUT", "STATE_OUT"])])
    assert result["OUTPUT"].tolist() == [[6], [9]]  # the empty slot keeps its state
    assert result["STATE_OUT"].tolist() == [[6], [9]]


def test_torch_accumulator_keeps_each_sequence_in_implicit_state(tmp_path) -> None:
    pytest.importorskip("torch")
    seq_torch_accumulator(tmp_path / "acc", "oldest")
    names = {"INPUT": "INPUT__0", "OUTPUT": "OUTPUT__0", "CORRID_OUT": "CORRID_OUT__2"}
    _runs_interleaved(_load(tmp_path, "acc"), names)


def _load_error(model_dir: Path, old: str, new: str) -> str:
    """The error an instance's load gives once ``old`` reads ``new`` in the config (the
    repository reads the config without complaint: the backend checks the model file)."""
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text().replace(old, new))
    entry = ModelRepository(model_dir.parent, complete=complete, gpu_count=0).read_model(
        model_dir.name
    )
    assert entry.error is None, entry.error
    backend = backend_class(entry.backend)(entry.spec(1), entry.instances()[0])
    with pytest.raises(ModelLoadError) as err:
        backend.load()
    return err.value.message


def test_torch_state_needs_tritons_index_names(tmp_path) -> None:
    pytest.importorskip("torch")
    seq_torch_accumulator(tmp_path / "acc")
    message = _load_error(tmp_path / "acc", "STATE_OUT__1", "STATE_OUT")
    assert re.search(r"not all outputs .* follow the <name>__<index>", message), message


def test_python_accumulator_sees_correlation_id_and_flags(tmp_path) -> None:
    seq_python_accumulator(tmp_path / "acc")
    backend, _spec, _path = _load(tmp_path, "acc")

    def request(seq: int | str, value: int, start: bool = False, end: bool = False):
        params = {"sequence_id": seq, "sequence_start": start, "sequence_end": end, "k": "v"}
        return BackendRequest(
            {"INPUT": np.array([[value]], np.int32)}, ["OUTPUT", "CORRID_OUT"], parameters=params
        )

    try:
        first = backend.execute([request(5, 2, start=True), request("abc", 10, start=True)])
        second = backend.execute([request(5, 3), request("abc", 1, end=True)])
        again = backend.execute([request("abc", 4, start=True, end=True)])
    finally:
        backend.unload()
    sums = [[int(r["OUTPUT"][0, 0]) for r in batch] for batch in (first, second, again)]
    assert sums == [[2, 10], [5, 11], [4]]
    assert [r["CORRID_OUT"][0, 0] for r in first] == [b"5", b"abc"]


def test_python_request_hides_the_sequence_parameters(tmp_path) -> None:
    from conch.backends.python import pb_utils as pb

    seq_python_accumulator(tmp_path / "acc")
    backend, _spec, _path = _load(tmp_path, "acc")
    try:
        req = backend._request(
            BackendRequest(
                {"INPUT": np.array([[1]], np.int32)},
                ["OUTPUT"],
                parameters={"sequence_id": 9, "sequence_start": True, "sequence_end": True, "k": 1},
            )
        )
    finally:
        backend.unload()
    assert req.correlation_id() == 9
    assert req.flags() == (
        pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    )
    assert req.parameters() == '{"k": 1}'


def test_onnx_model_without_a_configured_control_does_not_load(tmp_path) -> None:
    seq_onnx_accumulator(tmp_path / "acc")
    assert _load_error(tmp_path / "acc", 'name: "READY"', 'name: "NOPE"') == (
        "model 'acc': configuration specified sequence control 'NOPE', but model does not "
        "provide that input"
    )
