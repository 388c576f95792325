"""TorchScript models on torch (Triton's ``pytorch`` backend, platforms ``pytorch_libtorch``/``libtorch``).

A TorchScript file carries no tensor names, shapes or types for its inputs and outputs,
so the config must list them all (as Triton's pytorch backend requires). Config tensors
reach the model by Triton's naming rules:

* inputs: names equal to the ``forward()`` argument names go by name; otherwise names of
  the form ``<anything>__<index>`` (``INPUT__0``) go to argument ``index``; otherwise the
  config order is the argument order (Triton's fallback, logged). A ``forward`` that takes
  a single ``Dict[str, Tensor]`` gets the inputs as a dict keyed by config name.
* outputs: ``<anything>__<index>`` (``OUTPUT__1``) is element ``index`` of the tuple or
  list ``forward()`` returns (index 0 for a single tensor); otherwise the config order.

CPU instances run on the CPU; KIND_GPU instances need a CUDA build of torch and a visible
NVIDIA GPU (``cuda:<device_id>``); KIND_MODEL instances leave the tensors where the model
put them.

``TYPE_STRING`` (BYTES) tensors go as Triton's backend passes them (its
``src/pt/model_instance_state.cc``): an input is one ``List[str]`` argument holding every
element of the batch, row after row (each element's bytes as they came); a ``List[str]``
output (the whole result, or an element of a returned tuple) comes back as a 1-D BYTES
tensor, one string per element of the list, which for a model that batches is one string
per batch row. So, as Triton requires at load, a string tensor has one dimension in all:
``dims: [ N ]`` (or ``[ -1 ]``) without batching, and ``dims: [ 1 ]`` with
``reshape: { shape: [ ] }`` with batching. Strings stay on the host on every device.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.backends.autocomplete import int_parameter, type_name
from conch.backends.base import InstanceSpec, ModelSpec, TensorBackend
from conch.core.datatypes import wire_to_config
from conch.core.errors import Internal, InvalidArgument, ModelLoadError
from conch.core.sequence import SequenceSpec

if TYPE_CHECKING:
    from pathlib import Path

    from conch.core.model_config import ModelConfig, ModelInput, ModelOutput

log = logging.getLogger(__name__)

# Config data types -> torch dtype attribute names (resolved when torch is imported).
CONFIG_TO_TORCH: dict[str, str] = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_UINT16": "uint16",
    "TYPE_UINT32": "uint32",
    "TYPE_UINT64": "uint64",
    "TYPE_INT8": "int8",
    "TYPE_INT16": "int16",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_FP16": "float16",
    "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
    "TYPE_BF16": "bfloat16",
}

STRING = "TYPE_STRING"  # a List[str] in TorchScript, not a tensor

# Triton's pytorch backend parameter names.
INTRA_OP_THREADS = "INTRA_OP_THREAD_COUNT"
INTER_OP_THREADS = "INTER_OP_THREAD_COUNT"
INFERENCE_MODE = "INFERENCE_MODE"
DISABLE_OPTIMIZED_EXECUTION = "DISABLE_OPTIMIZED_EXECUTION"
ENABLE_CACHE_CLEANING = "ENABLE_CACHE_CLEANING"

# torch's defaults are one intra-op and one inter-op thread per core, which
# oversubscribes a worker that runs several instances (or shares its machine with other
# workers). One thread each unless the config says otherwise; scale with instances.
DEFAULT_INTRA_OP_THREADS = 1
DEFAULT_INTER_OP_THREADS = 1

# Single-request inputs are read-only views of the request body. torch has no read-only
# tensors and warns once; the body is private to the request, so hand it over uncopied.
warnings.filterwarnings(
    "ignore", message="The given NumPy array is not writable", category=UserWarning
)

_interop_lock = threading.Lock()
_interop_threads: int | None = None  # what this process set, once


def _torch() -> Any:
    import torch

    return torch


def gpu_available() -> tuple[bool, str]:
    """Whether a KIND_GPU instance can load here, and if not, why."""
    torch = _torch()
    if torch.version.cuda is None:
        return False, (
            f"torch {torch.__version__} here is a CPU-only build "
            "(install a CUDA build of torch on a machine with an NVIDIA GPU)"
        )
    if not torch.cuda.is_available():
        return False, "no NVIDIA GPU is visible to torch here (driver, CUDA_VISIBLE_DEVICES)"
    return True, ""


def named_index(name: str) -> int | None:
    """The index of a ``<name>__<index>`` tensor name, else None (split at the first ``__``)."""
    _, sep, tail = name.partition("__")
    if not sep or not tail or not (tail.isascii() and tail.isdigit()):
        return None
    return int(tail)


# --------------------------------------------------------------------------- config


def _string_dims_error(
    model: str, what: str, entry: ModelInput | ModelOutput, batched: bool
) -> str | None:
    """Triton's load error for a ``TYPE_STRING`` tensor of more than one dimension in all
    (the model's shape: ``reshape.shape`` where given, else ``dims``; plus the batch)."""
    dims = list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)
    if len(dims) + (1 if batched else 0) <= 1:
        return None
    hint = (
        "a model that batches takes one string per row: dims: [ 1 ] with reshape: { shape: [ ] }"
        if batched
        else "use dims: [ N ] or [ -1 ]"
    )
    return (
        f"Triton only supports 1 dimensional List of String as {what} for '{entry.name}' "
        f"for model '{model}' (TorchScript takes strings as List[str]; {hint})"
    )


def check_config(config: ModelConfig) -> None:
    """What the pytorch backend needs from a config, without the model: listed I/O, types."""
    model = config.name
    batched = config.max_batch_size > 0
    for what, entries in (("input", config.input), ("output", config.output)):
        if not entries:
            raise ModelLoadError(
                f"model '{model}': the pytorch backend needs a complete config: a TorchScript "
                f"model carries no tensor names, types or shapes, so list every {what} "
                "(name, data_type, dims) in config.pbtxt"
            )
        for entry in entries:
            if entry.data_type == 0:
                continue  # the repository's own check names it
            dtype = type_name(entry.data_type)
            if dtype == STRING:
                error = _string_dims_error(model, what, entry, batched)
                if error is not None:
                    raise ModelLoadError(error)
            elif dtype not in CONFIG_TO_TORCH:
                raise ModelLoadError(
                    f"model '{model}': {what} '{entry.name}' has data_type {dtype}, which the "
                    "pytorch backend does not support"
                )
            if entry.HasField("reshape") and list(entry.reshape.shape).count(-1) > 1:
                raise ModelLoadError(
                    f"model '{model}': {what} '{entry.name}' field reshape.shape "
                    f"{list(entry.reshape.shape)} has more than one -1; conch can infer one"
                )
    spec = SequenceSpec.from_config(config)
    if spec is not None:
        for name, datatype in {**spec.input_types(), **spec.output_types()}.items():
            if wire_to_config(datatype) not in CONFIG_TO_TORCH:
                # Triton's backend takes string states, but conch does not feed them yet.
                raise ModelLoadError(
                    f"model '{model}': sequence input or state '{name}' type "
                    f"'{wire_to_config(datatype)}' is not supported by PyTorch."
                )


@dataclass(frozen=True)
class Argument:
    """One ``forward()`` argument: its name and its TorchScript type kind and text."""

    name: str
    kind: str  # "TensorType", "DictType", "ListType", ...
    type: str


@dataclass(frozen=True)
class IOPlan:
    """How config tensors reach ``forward()`` and come back from it."""

    input_mode: str  # "name" | "index" | "order" | "dict"
    inputs: dict[str, int]  # config input -> argument position (dict mode: key order)
    output_mode: str  # "index" | "order"
    outputs: dict[str, int]  # config output -> element of the result
    arguments: tuple[str, ...] = ()


def plan_io(
    model: str,
    config_inputs: list[str],
    config_outputs: list[str],
    arguments: list[Argument],
    returns: int | None,
    *,
    sequence_inputs: Sequence[str] = (),
    state_outputs: Sequence[str] = (),
) -> IOPlan:
    """Apply Triton's TorchScript naming rules; raise ``ModelLoadError`` naming the tensor.

    ``arguments`` are ``forward()``'s, without ``self``; ``returns`` is how many tensors
    it returns when the schema says (1 for a tensor, n for an n-tuple), else None. A
    sequence model's control and state inputs (``sequence_inputs``) are arguments too,
    named like the config's inputs (by argument name or ``<name>__<index>``, never by
    config order, which they have none of); its state outputs (``state_outputs``) are
    elements of the result by ``<name>__<index>``, with every output, as Triton requires.
    """
    config_inputs = [*config_inputs, *sequence_inputs]
    config_outputs = [*config_outputs, *(o for o in state_outputs if o not in config_outputs)]
    arg_names = [a.name for a in arguments]
    signature = f"forward({', '.join(f'{a.type} {a.name}' for a in arguments)})"
    if len(arguments) == 1 and arguments[0].kind == "DictType":
        mode = "dict"
        inputs = {name: i for i, name in enumerate(config_inputs)}
    else:
        for a in arguments:
            # Triton's rule: each argument a Tensor or a list (List[str] for TYPE_STRING).
            if a.kind not in ("TensorType", "ListType"):
                raise ModelLoadError(
                    f"model '{model}': {signature} takes '{a.name}' as {a.type}; the pytorch "
                    "backend passes tensors and List[str] only (or a single Dict[str, Tensor])"
                )
        if len(config_inputs) != len(arguments):
            raise ModelLoadError(
                f"model '{model}': the config lists {len(config_inputs)} input(s) "
                f"{config_inputs} but the model's {signature} takes {len(arguments)}"
            )
        if all(name in arg_names for name in config_inputs):
            mode = "name"
            inputs = {name: arg_names.index(name) for name in config_inputs}
        elif all(named_index(name) is not None for name in config_inputs):
            mode = "index"
            inputs = {}
            taken: dict[int, str] = {}
            for name in config_inputs:
                index = named_index(name)
                assert index is not None
                if index >= len(arguments):
                    raise ModelLoadError(
                        f"model '{model}': input '{name}' names argument {index} but the "
                        f"model's {signature} takes {len(arguments)} (indices from 0)"
                    )
                if index in taken:
                    raise ModelLoadError(
                        f"model '{model}': inputs '{taken[index]}' and '{name}' both name "
                        f"argument {index} of {signature}"
                    )
                taken[index] = name
                inputs[name] = index
        else:
            mode = "order"
            inputs = {name: i for i, name in enumerate(config_inputs)}
            log.warning(
                "model '%s': inputs %s are neither all argument names of %s nor all "
                "<name>__<index>; passing them in config order",
                model,
                config_inputs,
                signature,
            )

    if sequence_inputs and mode == "order":
        raise ModelLoadError(
            f"model '{model}': the sequence control and state inputs {list(sequence_inputs)} "
            f"and the config's inputs must all be argument names of {signature} or all follow "
            "<name>__<index>"
        )
    if all(named_index(name) is not None for name in config_outputs):
        output_mode = "index"
        outputs = {name: named_index(name) for name in config_outputs}
    elif state_outputs:
        raise ModelLoadError(
            f"PyTorch model '{model}' is using sequence batching with state but not all "
            f"outputs {config_outputs} follow the <name>__<index> naming convention."
        )
    else:
        output_mode = "order"
        outputs = {name: i for i, name in enumerate(config_outputs)}
        log.warning(
            "model '%s': outputs %s do not all follow <name>__<index>; taking them in config order",
            model,
            config_outputs,
        )
    if returns is not None:
        for name, index in outputs.items():
            assert index is not None
            if index >= returns:
                what = "a single tensor" if returns == 1 else f"{returns} tensors"
                raise ModelLoadError(
                    f"model '{model}': output '{name}' is element {index} of forward()'s "
                    f"result, but the model returns {what}"
                )
    return IOPlan(
        mode,
        inputs,
        output_mode,
        {k: int(v) for k, v in outputs.items() if v is not None},
        tuple(arg_names),
    )


def describe_forward(module: Any, model: str) -> tuple[list[Argument], int | None]:
    """``forward()``'s arguments (without ``self``) and its tensor count, from the schema."""
    try:
        schema = module.forward.schema
    except Exception as exc:
        raise ModelLoadError(
            f"model '{model}': the TorchScript module has no forward() schema: {exc}"
        ) from None
    args = []
    for i, arg in enumerate(schema.arguments):
        kind = arg.type.kind()
        if i == 0 and kind == "ClassType":
            continue  # self
        args.append(Argument(arg.name, kind, str(arg.type)))
    returns: int | None = None
    if len(schema.returns) == 1:
        ret = schema.returns[0].type
        kind = ret.kind()
        if kind == "TensorType" or _is_string_list(ret):
            returns = 1
        elif kind == "TupleType":
            elements = ret.elements()
            bad = [str(e) for e in elements if e.kind() != "TensorType" and not _is_string_list(e)]
            if bad:
                raise ModelLoadError(
                    f"model '{model}': forward() returns {ret}; the pytorch backend takes "
                    "a tensor, a List[str], or a tuple of those, or a list of tensors"
                )
            returns = len(elements)
        elif kind != "ListType":
            raise ModelLoadError(
                f"model '{model}': forward() returns {ret}; the pytorch backend takes a "
                "tensor, a List[str], or a tuple of those, or a list of tensors"
            )
    return args, returns


def _is_string_list(torch_type: Any) -> bool:
    """Whether a TorchScript type is ``List[str]``."""
    return torch_type.kind() == "ListType" and torch_type.getElementType().kind() == "StringType"


def returns_string_list(module: Any) -> bool:
    """Whether ``forward()`` returns a bare ``List[str]``: one string output, not a list of
    outputs (what a returned list of tensors is)."""
    returns = module.forward.schema.returns
    return len(returns) == 1 and _is_string_list(returns[0].type)


def _bool_parameter(config: ModelConfig, key: str, default: bool) -> bool:
    if key not in config.parameters:
        return default
    raw = config.parameters[key].string_value.strip().lower()
    if raw in ("true", "1", "yes", "on"):
        return True
    if raw in ("false", "0", "no", "off"):
        return False
    raise ModelLoadError(
        f"model '{config.name}': parameters '{key}' must be true or false, got "
        f"'{config.parameters[key].string_value}'"
    )


def set_interop_threads_once(count: int) -> None:
    """torch takes the inter-op pool size once per process, before any parallel work."""
    global _interop_threads
    if count <= 0:
        return
    with _interop_lock:
        if _interop_threads is not None:
            if _interop_threads != count:
                log.warning(
                    "torch inter-op threads are per process and already %d; %s %d ignored",
                    _interop_threads,
                    INTER_OP_THREADS,
                    count,
                )
            return
        try:
            _torch().set_num_interop_threads(count)
        except RuntimeError as exc:  # parallel work already started in this process
            log.info(
                "torch inter-op threads left at %s: %s", _torch().get_num_interop_threads(), exc
            )
            _interop_threads = _torch().get_num_interop_threads()
            return
        _interop_threads = count


# --------------------------------------------------------------------------- tensors


def numpy_to_torch(arr: np.ndarray, dtype_name: str) -> Any:
    """A tensor sharing ``arr``'s memory (BF16 arrives as uint16 bit patterns)."""
    torch = _torch()
    tensor = torch.from_numpy(arr)
    if dtype_name == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor


def torch_to_numpy(tensor: Any) -> np.ndarray:
    """A host array for ``tensor``, without a copy when it already is a CPU tensor."""
    torch = _torch()
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def strings_to_numpy(items: list[Any]) -> np.ndarray:
    """A ``List[str]`` result as a 1-D BYTES array (object array of UTF-8 ``bytes``)."""
    out = np.empty(len(items), dtype=object)
    out[:] = [s.encode("utf-8") if isinstance(s, str) else s for s in items]
    return out


def _result_type(value: Any) -> str:
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value})
        return f"a list of {'/'.join(kinds)}" if kinds else "an empty list"
    return type(value).__name__


def _warn_string_mismatches(
    model: str, plan: IOPlan, arguments: list[Argument], input_types: dict[str, str]
) -> None:
    """Log the inputs whose config type cannot fit their ``forward()`` argument: Triton
    loads such a model too, and every request then fails in torch."""
    if plan.input_mode == "dict":
        bad = [n for n, t in input_types.items() if t == STRING]
        if bad:
            log.warning(
                "model '%s': TYPE_STRING input(s) %s cannot go into forward()'s single "
                "Dict[str, Tensor]; every request will fail",
                model,
                bad,
            )
        return
    for name, position in plan.inputs.items():
        if position >= len(arguments) or name not in input_types:
            continue
        arg = arguments[position]
        is_string = input_types[name] == STRING
        if is_string != (arg.type == "List[str]"):
            log.warning(
                "model '%s': input '%s' is %s but goes to forward() argument '%s' of type %s "
                "(TYPE_STRING goes as List[str], other types as Tensor); every request "
                "will fail",
                model,
                name,
                input_types[name],
                arg.name,
                arg.type,
            )


# --------------------------------------------------------------------------- backend


class PyTorchBackend(TensorBackend):
    gpu_available = staticmethod(gpu_available)

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        self.module: Any = None
        self.plan: IOPlan | None = None
        self.device: Any = None
        self._stream: Any = None
        self._threads = DEFAULT_INTRA_OP_THREADS
        self._inference_mode = True
        self._optimized = True
        self._clean_cache = False
        self._input_types: dict[str, str] = {}
        self._output_types: dict[str, str] = {}
        # Each input's torch dtype name, None for TYPE_STRING (a List[str] argument).
        self._input_torch: dict[str, str | None] = {}
        # Each output's torch dtype, None for TYPE_STRING (a List[str] result).
        self._output_torch: dict[str, Any] = {}
        self._string_result = False  # forward() returns a bare List[str]
        self._outputs: list[str] = []

    @classmethod
    def auto_complete(
        cls, config: ModelConfig, model_file: Path | None, *, default_max_batch_size: int
    ) -> None:
        # Triton's pytorch backend completes nothing from a TorchScript file: the config
        # must list the model's tensors. Check what can be checked without torch, so the
        # gateway reports a broken config at once without loading the model.
        check_config(config)

    def _device(self) -> Any:
        torch = _torch()
        if self.instance.kind == "GPU":
            ok, reason = gpu_available()
            if not ok:
                raise ModelLoadError(f"model '{self.spec.name}' asks for KIND_GPU but {reason}")
            count = torch.cuda.device_count()
            if self.instance.device_id >= count:
                raise ModelLoadError(
                    f"model '{self.spec.name}' instance '{self.instance.name}' asks for GPU "
                    f"{self.instance.device_id} but {count} GPU(s) are visible"
                )
            return torch.device("cuda", self.instance.device_id)
        if self.instance.kind == "MODEL":
            return None  # the model places its own tensors
        return torch.device("cpu")

    def load(self) -> None:
        config = self.spec.config
        name = self.spec.name
        check_config(config)
        model_file = self.spec.model_file
        if not model_file.exists():
            raise ModelLoadError(f"model '{name}': model file {model_file} not found")
        self._threads = int_parameter(config, INTRA_OP_THREADS, DEFAULT_INTRA_OP_THREADS)
        inter = int_parameter(config, INTER_OP_THREADS, DEFAULT_INTER_OP_THREADS)
        self._inference_mode = _bool_parameter(config, INFERENCE_MODE, True)
        self._optimized = not _bool_parameter(config, DISABLE_OPTIMIZED_EXECUTION, False)
        self._clean_cache = _bool_parameter(config, ENABLE_CACHE_CLEANING, False)
        device = self._device()
        torch = _torch()
        set_interop_threads_once(inter)
        if self._threads > 0:
            torch.set_num_threads(self._threads)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=DeprecationWarning)
                module = torch.jit.load(str(model_file), map_location=device)
        except Exception as exc:
            raise ModelLoadError(
                f"model '{name}' version {self.spec.version}: torch cannot load {model_file} "
                f"as TorchScript (a file written by torch.jit.save; torch.save pickles and "
                f"torch.export archives are not): {exc}"
            ) from None
        module.eval()
        arguments, returns = describe_forward(module, name)
        sequence = SequenceSpec.from_config(config)
        extra_inputs = sequence.input_types() if sequence else {}
        extra_outputs = sequence.output_types() if sequence else {}
        self.plan = plan_io(
            name,
            [e.name for e in config.input],
            [e.name for e in config.output],
            arguments,
            returns,
            sequence_inputs=list(extra_inputs),
            state_outputs=list(extra_outputs),
        )
        self._outputs = [e.name for e in config.output]
        # Every tensor forward() takes or gives, by name, as its config data type name.
        self._input_types = {e.name: type_name(e.data_type) for e in config.input}
        self._input_types.update({n: wire_to_config(t) for n, t in extra_inputs.items()})
        self._output_types = {e.name: type_name(e.data_type) for e in config.output}
        self._output_types.update({n: wire_to_config(t) for n, t in extra_outputs.items()})
        self._input_torch = {n: CONFIG_TO_TORCH.get(t) for n, t in self._input_types.items()}
        self._output_torch = {
            n: None if t == STRING else getattr(torch, CONFIG_TO_TORCH[t])
            for n, t in self._output_types.items()
        }
        self._string_result = returns_string_list(module)
        _warn_string_mismatches(name, self.plan, arguments, self._input_types)
        if device is not None and device.type == "cuda":
            self._stream = torch.cuda.Stream(device=device)
        self.device = device
        self.module = module
        log.info(
            "model '%s' instance '%s': TorchScript on %s, inputs by %s, outputs by %s, "
            "%d intra-op thread(s)",
            name,
            self.instance.name,
            device or "the model's own devices",
            self.plan.input_mode,
            self.plan.output_mode,
            self._threads,
        )

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        torch = _torch()
        assert self.plan is not None and self.module is not None, "run() before load()"
        batched = self.spec.config.max_batch_size > 0
        if self._threads > 0 and torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)  # per thread under OpenMP: set it here
        batch = next(iter(inputs.values())).shape[0] if batched and inputs else None
        grad = torch.inference_mode() if self._inference_mode else torch.no_grad()
        with contextlib.ExitStack() as scope:
            if self._stream is not None:
                # Copies in, the model and copies out all on this instance's stream.
                scope.enter_context(torch.cuda.device(self.device))
                scope.enter_context(torch.cuda.stream(self._stream))
            scope.enter_context(grad)
            scope.enter_context(torch.jit.optimized_execution(self._optimized))
            call_args = self._arguments(inputs)
            try:
                result = self.module(*call_args)
            except UnicodeDecodeError as exc:
                # torch hands a List[str] result to Python as str, which must be UTF-8.
                raise Internal(
                    f"model '{self.spec.name}': forward() returned a string that is not UTF-8 "
                    f"text ({exc}); conch takes TorchScript strings back through Python, "
                    "which holds UTF-8 text only"
                ) from None
            host = self._collect(result, outputs, batch)
        if self._stream is not None and self._clean_cache:
            torch.cuda.empty_cache()
        return host

    def _arguments(self, inputs: dict[str, np.ndarray]) -> list[Any]:
        """``forward()``'s arguments: the inputs as tensors, on the instance's device."""
        plan = self.plan
        assert plan is not None
        tensors: dict[str, Any] = {}
        strings = False
        for name, arr in inputs.items():
            if name not in self._input_torch:
                raise InvalidArgument(f"unexpected input '{name}' for model '{self.spec.name}'")
            dtype_name = self._input_torch[name]
            if dtype_name is None:
                # TYPE_STRING: one List[str] for the whole batch, every element in row order,
                # each element's bytes as they came (torch takes bytes for str, as Triton
                # hands its std::string the request's bytes).
                tensors[name] = arr.ravel().tolist()
                strings = True
                continue
            tensor = numpy_to_torch(arr, dtype_name)
            if self.device is not None and self.device.type != "cpu":
                tensor = tensor.to(self.device)
            tensors[name] = tensor
        if plan.input_mode == "dict":
            if strings:
                named = sorted(n for n in inputs if self._input_torch.get(n, "") is None)
                raise Internal(
                    f"model '{self.spec.name}': input(s) {named} are TYPE_STRING, but "
                    "forward() takes a single Dict[str, Tensor], which holds tensors only "
                    "(strings reach a TorchScript model as List[str] arguments)"
                )
            return [tensors]
        call_args: list[Any] = [None] * len(plan.arguments)
        for name, tensor in tensors.items():
            call_args[plan.inputs[name]] = tensor
        missing = [plan.arguments[i] for i, value in enumerate(call_args) if value is None]
        if missing:
            raise InvalidArgument(
                f"model '{self.spec.name}': no input for forward() argument(s) {missing}"
            )
        return call_args

    def _collect(self, result: Any, outputs: list[str], batch: int | None) -> dict[str, np.ndarray]:
        torch = _torch()
        plan = self.plan
        assert plan is not None
        model = self.spec.name
        if isinstance(result, torch.Tensor) or self._string_result:
            produced: list[Any] = [result]
        elif isinstance(result, tuple | list):
            produced = list(result)
        else:
            raise Internal(
                f"model '{model}': forward() returned {type(result).__name__}; expected a "
                "tensor, or a tuple or list of tensors"
            )
        out: dict[str, np.ndarray] = {}
        for name in outputs or self._outputs:
            if name not in plan.outputs:
                raise InvalidArgument(f"model '{model}' has no output '{name}'")
            index = plan.outputs[name]
            if index >= len(produced):
                raise Internal(
                    f"model '{model}': output '{name}' is element {index} of forward()'s "
                    f"result, which has {len(produced)} element(s)"
                )
            tensor = produced[index]
            expected = self._output_torch[name]
            if not isinstance(tensor, torch.Tensor):
                if isinstance(tensor, list) and expected is None:
                    arr = strings_to_numpy(tensor)
                else:
                    raise Internal(
                        f"model '{model}': output '{name}' (element {index} of forward()'s "
                        f"result) is {_result_type(tensor)}, but the config declares it "
                        f"{self._output_types[name]}"
                        + (", which the model gives as List[str]" if expected is None else "")
                    )
            elif tensor.dtype != expected:
                raise Internal(
                    f"model '{model}': output '{name}' is {self._output_types[name]} in the "
                    f"config but the model produced {tensor.dtype}"
                    + (" (a tensor; strings come back as List[str])" if expected is None else "")
                )
            else:
                arr = torch_to_numpy(tensor)
            if batch is not None and (arr.ndim == 0 or arr.shape[0] != batch):
                raise Internal(
                    f"model '{model}': output '{name}' has shape {list(arr.shape)}, but the "
                    f"batch has {batch} row(s) (max_batch_size > 0: the first dimension is "
                    "the batch)"
                )
            out[name] = arr
        return out

    def unload(self) -> None:
        self.module = None
        self._stream = None
        if self.device is not None and self.device.type == "cuda":
            _torch().cuda.empty_cache()
        self.device = None


__all__ = [
    "CONFIG_TO_TORCH",
    "Argument",
    "IOPlan",
    "PyTorchBackend",
    "check_config",
    "describe_forward",
    "gpu_available",
    "named_index",
    "plan_io",
    "returns_string_list",
    "strings_to_numpy",
]
