"""TensorFlow models (Triton's ``tensorflow`` backend: platforms ``tensorflow_savedmodel``
and ``tensorflow_graphdef``).

Triton's naming rules, from triton-inference-server/tensorflow_backend:

- A SavedModel is loaded with the tag ``serve`` (or the ``TF_GRAPH_TAG`` parameter) and
  run through the signature ``serving_default`` (or ``TF_SIGNATURE_DEF``). With neither
  that parameter nor a ``serving_default``, the first other signature is used. Config
  inputs and outputs are the signature's keys, not the graph's tensor names.
- A GraphDef names its tensors by node: a config input is a ``Placeholder`` node, an
  output any node, and ``name`` means the node's first output (``name:0``). A GraphDef
  carries no signature, so its config is never auto-completed: it must list them all.
  ``TF_INIT_OPS_FILE`` names a JSON file of ops to run once after loading it.

``TF_NUM_INTRA_THREADS`` and ``TF_NUM_INTER_THREADS`` size TensorFlow's thread pools.
Those pools belong to the process, not to a model, and are fixed once TensorFlow runs
its first op: the first model a worker loads sets them, and a later model that asks for
other sizes is told in a warning. Absent, TensorFlow picks, as in Triton.

tensorflow is imported only when a worker loads a TensorFlow model: auto-complete reads
a SavedModel's signature from ``saved_model.pb`` with a small protobuf reader, so the
gateway never imports it.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.backends.autocomplete import (
    check_and_fill,
    cuda_device_count,
    gpu_device,
    int_parameter,
    type_name,
)
from conch.backends.base import InstanceSpec, ModelSpec, TensorBackend
from conch.core.errors import ModelLoadError
from conch.core.extras import needs_extra

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)

SAVEDMODEL = "tensorflow_savedmodel"
GRAPHDEF = "tensorflow_graphdef"
DEFAULT_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
# Signatures a SavedModel keeps for itself, never served (Triton skips them too).
_INTERNAL_SIGNATURES = frozenset({"__saved_model_init_op", "__saved_model_train_op"})

# Triton's model parameters for this backend (tensorflow_backend README, "Parameters").
INTRA_THREADS = "TF_NUM_INTRA_THREADS"
INTER_THREADS = "TF_NUM_INTER_THREADS"
GRAPH_TAG = "TF_GRAPH_TAG"
SIGNATURE_DEF = "TF_SIGNATURE_DEF"
INIT_OPS_FILE = "TF_INIT_OPS_FILE"
# Parameters that only change how Triton shares sessions and thread pools between
# instances; results are the same, so they are accepted and have no effect here.
_NO_EFFECT = ("TF_USE_PER_SESSION_THREADS", "MAX_SESSION_SHARE_COUNT")

# TensorFlow's DataType enum numbers (tensorflow/core/framework/types.proto) -> config
# types: the ones Triton's TensorFlow backend maps; tf.string is Triton's BYTES.
TF_TO_CONFIG: dict[int, str] = {
    1: "TYPE_FP32",
    2: "TYPE_FP64",
    3: "TYPE_INT32",
    4: "TYPE_UINT8",
    5: "TYPE_INT16",
    6: "TYPE_INT8",
    7: "TYPE_STRING",
    9: "TYPE_INT64",
    10: "TYPE_BOOL",
    17: "TYPE_UINT16",
    19: "TYPE_FP16",
    22: "TYPE_UINT32",
    23: "TYPE_UINT64",
}

# Config types -> numpy types fed to TensorFlow (strings go as object arrays of bytes).
_CONFIG_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": object,
}


def _tf() -> Any:
    try:
        import tensorflow
    except ImportError:
        raise ModelLoadError(
            needs_extra("the tensorflow backend", "TensorFlow", "tensorflow")
            + " (tensorflow-cpu; for GPUs install tensorflow itself)"
        ) from None
    return tensorflow


def gpu_available() -> tuple[bool, str]:
    """Whether a KIND_GPU instance can load here, and if not, why. The cheap answers come
    first, so a frontend on a machine without a GPU never imports tensorflow to ask."""
    if cuda_device_count() == 0:
        return False, "no NVIDIA GPU is visible to this process (driver, CUDA_VISIBLE_DEVICES)"
    if not _installed("tensorflow"):
        return False, "only tensorflow-cpu is installed here, which has no GPU support"
    if not _tf().config.list_physical_devices("GPU"):
        return False, "tensorflow sees no GPU here (a build without CUDA, or CUDA missing)"
    return True, ""


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# -- names and parameters -----------------------------------------------------------------


def parameter(config: ModelConfig, key: str, default: str = "") -> str:
    """A string ``parameters`` entry, ``default`` when absent or empty (as Triton reads it)."""
    if key not in config.parameters:
        return default
    return config.parameters[key].string_value or default


def thread_counts(config: ModelConfig) -> tuple[int, int]:
    """(intra-op, inter-op) threads the config asks for; 0 lets TensorFlow choose."""
    intra = int_parameter(config, INTRA_THREADS, 0)
    if intra < 0:
        raise ModelLoadError(
            f"model '{config.name}': parameter '{INTRA_THREADS}' must be a non-negative number"
        )
    return intra, int_parameter(config, INTER_THREADS, 0)


def pick_signature(model: str, available: list[str], wanted: str) -> str:
    """The signature to serve: ``wanted`` (the parameter) if given, else
    ``serving_default``, else (no parameter) the first signature that is not internal."""
    key = wanted or DEFAULT_SIGNATURE
    if key in available:
        return key
    if not wanted:
        others = [s for s in available if s not in _INTERNAL_SIGNATURES]
        if others:
            log.warning(
                "model '%s': no signature '%s'; serving signature '%s'",
                model,
                DEFAULT_SIGNATURE,
                others[0],
            )
            return others[0]
    raise ModelLoadError(
        f"model '{model}': the SavedModel has no signature '{key}' (it has "
        f'{sorted(available)}); name one in parameters {{ key: "{SIGNATURE_DEF}" }}'
    )


def graph_tensor(name: str) -> str:
    """A GraphDef config name as a tensor name: a node's name is its first output."""
    return name if ":" in name else f"{name}:0"


# -- a SavedModel's signatures, read without tensorflow -------------------------------------


@dataclass(frozen=True)
class SignatureTensor:
    """One input or output of a signature, as ``autocomplete.check_and_fill`` reads it."""

    name: str  # the signature key, which Triton names the config's tensor by
    dtype: str  # config data type name ("" for a type Triton has none for)
    shape: tuple[int, ...]  # -1 where the signature leaves a dimension open
    tf_dtype: int  # TensorFlow's DataType number, for the message about a type left out


@dataclass(frozen=True)
class Signature:
    inputs: tuple[SignatureTensor, ...]
    outputs: tuple[SignatureTensor, ...]


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """A protobuf message's (field number, value) pairs, in order: varints as ints,
    length-delimited fields as bytes; fixed-width fields are skipped."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((number, value))
        elif wire == 2:
            size, i = _varint(buf, i)
            out.append((number, buf[i : i + size]))
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not supported")
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _tensor_info(name: str, buf: bytes) -> SignatureTensor:
    # TensorInfo: 2 dtype, 3 tensor_shape (TensorShapeProto: 2 dim {1 size}, 3 unknown_rank).
    dtype, shape = 0, ()
    for number, value in _fields(buf):
        if number == 2 and isinstance(value, int):
            dtype = value
        elif number == 3 and isinstance(value, bytes):
            dims = []
            for n, dim in _fields(value):
                if n == 2 and isinstance(dim, bytes):
                    size = next((_signed(v) for k, v in _fields(dim) if k == 1), 0)
                    dims.append(-1 if size < 0 else int(size))
            shape = tuple(dims)
    return SignatureTensor(name, TF_TO_CONFIG.get(dtype, ""), shape, dtype)


def _map_entries(buf: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for number, item in _fields(buf):
        if number == 1 and isinstance(item, bytes):
            key = item.decode("utf-8")
        elif number == 2 and isinstance(item, bytes):
            value = item
    return key, value


def read_signatures(saved_model_pb: bytes, tag: str) -> dict[str, Signature]:
    """Every signature of the MetaGraph tagged ``tag`` in a ``saved_model.pb``.

    Fields by number, from tensorflow's saved_model.proto and meta_graph.proto:
    SavedModel 2 meta_graphs; MetaGraphDef 1 meta_info_def (4 tags), 5 signature_def
    (a map); SignatureDef 1 inputs, 2 outputs (maps of TensorInfo). Raises KeyError when
    no MetaGraph has the tag.
    """
    tags_seen: list[list[str]] = []
    for number, meta in _fields(saved_model_pb):
        if number != 2 or not isinstance(meta, bytes):
            continue
        fields = _fields(meta)
        tags = [
            t.decode("utf-8")
            for n, info in fields
            if n == 1 and isinstance(info, bytes)
            for k, t in _fields(info)
            if k == 4 and isinstance(t, bytes)
        ]
        tags_seen.append(tags)
        if tag not in tags:
            continue
        signatures: dict[str, Signature] = {}
        for n, entry in fields:
            if n != 5 or not isinstance(entry, bytes):
                continue
            key, sig = _map_entries(entry)
            io: dict[int, list[SignatureTensor]] = {1: [], 2: []}
            for k, item in _fields(sig):
                if k in io and isinstance(item, bytes):
                    io[k].append(_tensor_info(*_map_entries(item)))
            signatures[key] = Signature(tuple(io[1]), tuple(io[2]))
        return signatures
    raise KeyError(f"no MetaGraph tagged '{tag}' (tags: {tags_seen})")


# Repositories are read again on every poll; signatures are kept per file identity.
_SIGNATURES: dict[tuple[str, int, int, int, str], dict[str, Signature]] = {}


def saved_model_signature(config: ModelConfig, model_dir: Path) -> Signature:
    """The signature the config selects (tag and signature parameters) of the SavedModel
    in ``model_dir``, checked to have only types Triton has. Raises ``ModelLoadError``."""
    model = config.name
    pb = model_dir / "saved_model.pb"
    tag = parameter(config, GRAPH_TAG, DEFAULT_TAG)
    try:
        st = pb.stat()
    except OSError as exc:
        raise ModelLoadError(
            f"model '{model}': {model_dir} is not a SavedModel folder (no saved_model.pb: {exc})"
        ) from None
    key = (str(pb), st.st_ino, st.st_mtime_ns, st.st_size, tag)
    signatures = _SIGNATURES.get(key)
    if signatures is None:
        try:
            signatures = read_signatures(pb.read_bytes(), tag)
        except KeyError as exc:
            raise ModelLoadError(f"model '{model}': the SavedModel has {exc.args[0]}") from None
        except (OSError, ValueError, IndexError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"model '{model}': cannot read {pb}: {exc}") from None
        if len(_SIGNATURES) > 1024:
            _SIGNATURES.clear()
        _SIGNATURES[key] = signatures
    chosen = pick_signature(model, list(signatures), parameter(config, SIGNATURE_DEF))
    signature = signatures[chosen]
    for what, tensors in (("input", signature.inputs), ("output", signature.outputs)):
        for t in tensors:
            if not t.dtype:
                raise ModelLoadError(
                    f"model '{model}': signature '{chosen}' {what} '{t.name}' has TensorFlow "
                    f"type {t.tf_dtype}, which has no Triton data type"
                )
    return signature


def _check_and_fill(
    config: ModelConfig, signature: Signature, *, fill: bool, default_max_batch_size: int
) -> None:
    """Triton's auto-complete for a SavedModel: a config that lists some outputs keeps
    just those (the others are not added); one that lists none gets them all."""
    listed = {o.name for o in config.output}
    outputs = [t for t in signature.outputs if not listed or t.name in listed]
    check_and_fill(
        config,
        signature.inputs,
        outputs,
        fill=fill,
        default_max_batch_size=default_max_batch_size,
        source="the SavedModel's signature",
    )


# -- the backend ---------------------------------------------------------------------------

# The thread pool sizes this process's TensorFlow runs with, once set.
_THREADS: tuple[int, int] | None = None


def _set_threads(tf: Any, model: str, wanted: tuple[int, int]) -> None:
    global _THREADS
    if _THREADS is None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(wanted[0])
            tf.config.threading.set_inter_op_parallelism_threads(wanted[1])
        except RuntimeError as exc:  # TensorFlow already ran in this process
            log.warning("model '%s': cannot size TensorFlow's thread pools: %s", model, exc)
        _THREADS = wanted
    elif wanted != (0, 0) and wanted != _THREADS:
        log.warning(
            "model '%s' asks for %s=%d and %s=%d, but TensorFlow's thread pools are the "
            "process's and were sized %s by the first TensorFlow model this worker loaded",
            model,
            INTRA_THREADS,
            wanted[0],
            INTER_THREADS,
            wanted[1],
            _THREADS,
        )


class TensorFlowBackend(TensorBackend):
    gpu_available = staticmethod(gpu_available)

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        self._fn: Any = None  # a concrete function taking the config's inputs
        self._tf: Any = None
        self._loaded: Any = None
        self._device = "/CPU:0"
        self._input_types: dict[str, Any] = {}
        self._output_names: list[str] = []
        self._graph_inputs: list[str] = []  # a GraphDef's feed order

    @classmethod
    def auto_complete(
        cls, config: ModelConfig, model_file: Path | None, *, default_max_batch_size: int
    ) -> None:
        if model_file is None or not model_file.exists():
            raise ModelLoadError(f"model '{config.name}': model file {model_file} not found")
        if config.platform != SAVEDMODEL:
            return  # a GraphDef has no signature to complete from (Triton's rule too)
        signature = saved_model_signature(config, model_file)
        _check_and_fill(config, signature, fill=True, default_max_batch_size=default_max_batch_size)

    def _device_name(self) -> str:
        if self.instance.kind != "GPU":
            return "/CPU:0"
        device = gpu_device(
            self.spec.name, self.instance.name, self.instance.device_id, gpu_available()
        )
        return f"/GPU:{device}"

    def load(self) -> None:
        config = self.spec.config
        model_file = self.spec.model_file
        if not model_file.exists():
            raise ModelLoadError(f"model '{self.spec.name}': model file {model_file} not found")
        if parameter(config, INIT_OPS_FILE) and config.platform != GRAPHDEF:
            raise ModelLoadError(
                f"model '{self.spec.name}': parameter '{INIT_OPS_FILE}' is supported for "
                "tensorflow_graphdef only (a SavedModel runs its own initializers)"
            )
        for key in _NO_EFFECT:
            if key in config.parameters:
                log.info("model '%s': parameter '%s' has no effect in conch", self.spec.name, key)
        for acc in config.optimization.execution_accelerators.gpu_execution_accelerator:
            log.warning(
                "model '%s': gpu_execution_accelerator '%s' (TF-TRT, mixed precision) is not "
                "supported by conch's tensorflow backend, ignored",
                self.spec.name,
                acc.name,
            )
        threads = thread_counts(config)
        self._device = self._device_name()
        tf = _tf()
        _set_threads(tf, self.spec.name, threads)
        for library in config.model_operations.op_library_filename:
            try:  # custom ops the model's graph uses (Triton loads them the same way)
                tf.load_op_library(library)
            except Exception as exc:
                raise ModelLoadError(
                    f"model '{self.spec.name}': cannot load op library {library}: {exc}"
                ) from None
        self._tf = tf
        self._input_types = {
            e.name: _CONFIG_TO_NUMPY.get(type_name(e.data_type)) for e in config.input
        }
        self._output_names = [o.name for o in config.output]
        where = f"model '{self.spec.name}' version {self.spec.version}"
        try:
            with tf.device(self._device):
                if config.platform == GRAPHDEF:
                    self._fn = self._load_graphdef(tf, model_file)
                else:
                    self._fn = self._load_saved_model(tf, model_file)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"{where}: tensorflow cannot load {model_file}: {type(exc).__name__}: {exc}"
            ) from None

    def _load_saved_model(self, tf: Any, model_dir: Path) -> Any:
        config = self.spec.config
        signature = saved_model_signature(config, model_dir)
        _check_and_fill(config, signature, fill=False, default_max_batch_size=0)
        tag = parameter(config, GRAPH_TAG, DEFAULT_TAG)
        loaded = tf.saved_model.load(str(model_dir), tags=[tag])
        key = pick_signature(
            self.spec.name, list(loaded.signatures), parameter(config, SIGNATURE_DEF)
        )
        self._loaded = loaded  # the signature's variables live as long as their module
        return loaded.signatures[key]

    def _load_graphdef(self, tf: Any, model_file: Path) -> Any:
        config = self.spec.config
        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(model_file.read_bytes())
        placeholders = {n.name for n in graph_def.node if n.op == "Placeholder"}
        nodes = {n.name for n in graph_def.node}
        for entry in config.input:
            if entry.name.split(":")[0] not in placeholders:
                raise ModelLoadError(
                    f"model '{self.spec.name}': config input '{entry.name}' is not a "
                    f"Placeholder of the GraphDef (it has {sorted(placeholders)})"
                )
        for entry in config.output:
            if entry.name.split(":")[0] not in nodes:
                raise ModelLoadError(
                    f"model '{self.spec.name}': config output '{entry.name}' is not a node "
                    "of the GraphDef"
                )
        self._graph_inputs = [e.name for e in config.input]

        def imported() -> None:
            tf.compat.v1.import_graph_def(graph_def, name="")

        wrapped = tf.compat.v1.wrap_function(imported, [])
        init_ops = self._init_ops()
        if init_ops:
            try:
                ops = [wrapped.graph.get_operation_by_name(n) for n in init_ops]
            except KeyError as exc:
                raise ModelLoadError(
                    f"model '{self.spec.name}': init op {exc} is not in the GraphDef"
                ) from None
            wrapped.prune(feeds=[], fetches=ops)()
        return wrapped.prune(
            feeds=[graph_tensor(n) for n in self._graph_inputs],
            fetches=[graph_tensor(n) for n in self._output_names],
        )

    def _init_ops(self) -> list[str]:
        """The ops ``TF_INIT_OPS_FILE`` names, run once after the graph is imported. The
        file is looked for in the version folder first, then the model's, as Triton does."""
        name = parameter(self.spec.config, INIT_OPS_FILE)
        if not name:
            return []
        path = self.spec.version_dir / name
        if not path.is_file():
            path = self.spec.path / name
        try:
            ops = json.loads(path.read_text(encoding="utf-8"))["init_ops"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(
                f"model '{self.spec.name}': parameter '{INIT_OPS_FILE}': cannot read the "
                f"list 'init_ops' from {path}: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(ops, list) or not all(isinstance(op, str) for op in ops):
            raise ModelLoadError(
                f"model '{self.spec.name}': {path}: 'init_ops' must be a list of op names"
            )
        return ops

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        tf = self._tf
        feed = {name: self._tensor(name, arr) for name, arr in inputs.items()}
        with tf.device(self._device):
            if self._graph_inputs:
                values = self._fn(*(feed[n] for n in self._graph_inputs))
                produced = dict(zip(self._output_names, values, strict=True))
            else:
                produced = self._fn(**feed)
        names = list(outputs) or self._output_names
        return {name: np.asarray(produced[name].numpy()) for name in names}

    def _tensor(self, name: str, arr: np.ndarray) -> Any:
        dtype = self._input_types.get(name)
        if dtype is object:
            return self._tf.constant(arr, dtype=self._tf.string)
        return self._tf.constant(arr if dtype is None else arr.astype(dtype, copy=False))

    def unload(self) -> None:
        self._fn = self._loaded = None


__all__ = [
    "GRAPHDEF",
    "SAVEDMODEL",
    "TF_TO_CONFIG",
    "Signature",
    "SignatureTensor",
    "TensorFlowBackend",
    "gpu_available",
    "graph_tensor",
    "pick_signature",
    "read_signatures",
    "saved_model_signature",
    "thread_counts",
]
