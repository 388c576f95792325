"""Python models, Triton style: ``backend: "python"`` and ``<model>/<version>/model.py``.

The file defines ``class TritonPythonModel`` exactly as for Triton's python backend and
imports ``triton_python_backend_utils`` (conch's ``pb_utils``, registered under that
name before the file is imported). The model runs inside the worker process that owns it:
``initialize(args)`` at load, ``execute(requests)`` once per dynamic batch with one
``pb_utils.InferenceRequest`` per client request (sync or ``async def``), ``finalize()``
at unload, and the static ``auto_complete_config`` while the repository completes the
config. Completing a config imports the file only when its ``TritonPythonModel`` may
define ``auto_complete_config`` (read from the source first), so the gateway, which
completes configs too, does not run model code it does not need.

The model's BLS calls (``pb_utils.InferenceRequest(...).exec()``, ``load_model``, ...) go
through the port the worker put on the spec (``ModelSpec.bls``): it is made current
(``pb_utils.BLS_PORT``) while ``initialize``, ``execute`` and ``finalize`` run, beside the
call context those calls inherit (``conch.core.call_context``).

Each load imports the file afresh as its own module (``conch_python_model_<model>_v<version>_<n>``),
so two models, two versions or two instances never share module state. The version
folder is on ``sys.path`` while the model is loaded, so sibling files import; sibling
modules it imports at load are dropped from ``sys.modules`` afterwards, so another
model's ``helper.py`` is imported as its own.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.util
import inspect
import itertools
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.backends.autocomplete import type_name
from conch.backends.base import Backend, BackendRequest, BackendResult, InstanceSpec, ModelSpec
from conch.backends.python import pb_utils as pb
from conch.core import call_context
from conch.core.errors import ConchError, Internal, ModelLoadError, Unavailable, from_code
from conch.core.model_config import config_to_json, json_to_config
from conch.core.sequence import SEQUENCE_PARAMETERS, sequence_params

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)

UTILS_MODULE = "triton_python_backend_utils"
MODEL_CLASS = "TritonPythonModel"


def error_from_triton(error: Any) -> ConchError:
    """A response's ``TritonError`` as the conch error with Triton's HTTP status
    (by its code name: ``conch.core.errors.TRITON_CODES``)."""
    if isinstance(error, pb.TritonError):
        return from_code(error.code_name(), error.message())
    return Internal(str(error))


# -- importing model.py -------------------------------------------------------------------

_import_lock = threading.RLock()
_counter = itertools.count(1)
_path_users: dict[str, int] = {}  # version folder -> loaded modules that keep it on sys.path
_path_added: set[str] = set()  # the folders conch put on sys.path (and so takes off again)


def install_utils() -> None:
    """Make ``import triton_python_backend_utils`` give conch's module."""
    sys.modules[UTILS_MODULE] = pb


def _add_path(folder: str) -> None:
    if _path_users.get(folder, 0) == 0 and folder not in sys.path:
        sys.path.insert(0, folder)
        _path_added.add(folder)
    _path_users[folder] = _path_users.get(folder, 0) + 1


def _drop_path(folder: str) -> None:
    left = _path_users.get(folder, 0) - 1
    if left > 0:
        _path_users[folder] = left
        return
    _path_users.pop(folder, None)
    if folder in _path_added:
        _path_added.discard(folder)
        if folder in sys.path:
            sys.path.remove(folder)


def _under(module: ModuleType, folder: str) -> bool:
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and file.startswith(folder + os.sep)


def import_model_file(model_file: Path, model: str, version: str) -> ModuleType:
    """Import ``model.py`` as a new, uniquely named module; ``release_model_file`` undoes it."""
    install_utils()
    folder = model_file.parent.resolve()
    safe = re.sub(r"\W", "_", f"{model}_v{version}")
    name = f"conch_python_model_{safe}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"model '{model}' version {version}: cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    with _import_lock:
        _add_path(str(folder))
        before = set(sys.modules)
        sys.modules[name] = module  # classes look their module up while being defined
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            sys.modules.pop(name, None)
            _drop_path(str(folder))
            raise ModelLoadError(
                f"model '{model}' version {version}: importing {model_file} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        finally:
            for key in set(sys.modules) - before - {name}:
                mod = sys.modules.get(key)
                if mod is not None and _under(mod, str(folder)):
                    del sys.modules[key]
    return module


def release_model_file(module: ModuleType | None, model_file: Path) -> None:
    if module is None:
        return
    with _import_lock:
        sys.modules.pop(module.__name__, None)
        _drop_path(str(model_file.parent.resolve()))


def _model_class(module: ModuleType, model: str, model_file: Path) -> type:
    cls = getattr(module, MODEL_CLASS, None)
    if not isinstance(cls, type):
        raise ModelLoadError(
            f"model '{model}': {model_file} does not define class {MODEL_CLASS}, which a "
            "python backend model must have"
        )
    if not callable(getattr(cls, "execute", None)):
        raise ModelLoadError(
            f"model '{model}': {MODEL_CLASS} in {model_file} has no execute(self, requests) method"
        )
    return cls


def _may_define_auto_complete(model_file: Path, model: str) -> bool:
    """False only when the source plainly shows a ``TritonPythonModel`` without
    ``auto_complete_config``: a class with no bases that does not define it."""
    try:
        tree = ast.parse(model_file.read_bytes(), filename=str(model_file))
    except SyntaxError as exc:
        raise ModelLoadError(
            f"model '{model}': {model_file} line {exc.lineno}: syntax error: {exc.msg}"
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model '{model}': cannot read {model_file}: {exc}") from None
    found: ast.ClassDef | None = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == MODEL_CLASS:
            found = node  # the last definition is the one that counts
        elif _binds(node, MODEL_CLASS):
            found = None  # assigned or imported: only importing tells
    if found is None or found.bases or found.keywords or found.decorator_list:
        return True
    return any(_binds(node, "auto_complete_config") for node in found.body)


def _binds(node: ast.stmt, name: str) -> bool:
    """Whether a statement binds ``name`` (def, class, assignment or import)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))
    if isinstance(node, ast.Import | ast.ImportFrom):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    if isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
        children = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
        for handler in getattr(node, "handlers", []):
            children.extend(handler.body)
        return any(_binds(child, name) for child in children)
    return False


def _check_not_decoupled(config: ModelConfig, model: str) -> None:
    if config.HasField("model_transaction_policy") and config.model_transaction_policy.decoupled:
        raise ModelLoadError(
            f"model '{model}' is decoupled (model_transaction_policy {{ decoupled: true }}): "
            "decoupled models are not supported over HTTP yet"
        )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, pb.TritonModelException | pb.TritonError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class PythonBackend(Backend):
    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        self.model: Any = None
        self._module: ModuleType | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._offered = False  # this instance offered its BLS port to the model's threads
        # The inputs the model gets as BF16 tensors (their uint16 bits, as Triton's BF16).
        self._bf16_inputs = frozenset(
            i.name for i in spec.config.input if type_name(i.data_type) == "TYPE_BF16"
        )

    # -- auto-complete --------------------------------------------------------------------

    @classmethod
    def auto_complete(
        cls, config: ModelConfig, model_file: Path | None, *, default_max_batch_size: int
    ) -> None:
        model = config.name
        if model_file is None or not model_file.is_file():
            raise ModelLoadError(f"model '{model}': model file {model_file} not found")
        if not _may_define_auto_complete(model_file, model):
            # Nothing to call: the model's code is not run here (the gateway completes
            # configs too, and has no business importing the model's libraries).
            _check_not_decoupled(config, model)
            return
        module = import_model_file(model_file, model, model_file.parent.name)
        try:
            hook = getattr(_model_class(module, model, model_file), "auto_complete_config", None)
            if hook is not None:
                given = pb.ModelConfig(config_to_json(config))
                try:
                    result = hook(given)
                except Exception as exc:
                    raise ModelLoadError(
                        f"model '{model}': auto_complete_config failed: {_describe(exc)}"
                    ) from None
                if not isinstance(result, pb.ModelConfig):
                    raise ModelLoadError(
                        f"model '{model}': auto_complete_config must return the "
                        f"pb_utils.ModelConfig it was given, not {type(result).__name__}"
                    )
                completed = json_to_config(result.as_dict(), model=model)
                completed.name = model
                config.CopyFrom(completed)
            _check_not_decoupled(config, model)
        finally:
            release_model_file(module, model_file)

    # -- load and unload ------------------------------------------------------------------

    def _where(self) -> str:
        return (
            f"model '{self.spec.name}' version {self.spec.version} instance '{self.instance.name}'"
        )

    def initialize_args(self) -> dict[str, str]:
        """Triton's ``initialize`` args: every value a string."""
        return {
            "model_config": json.dumps(config_to_json(self.spec.config)),
            "model_instance_kind": self.instance.kind,
            "model_instance_name": self.instance.name,
            "model_instance_device_id": str(self.instance.device_id),
            "model_repository": os.path.abspath(self.spec.path),
            "model_version": str(self.spec.version),
            "model_name": self.spec.name,
        }

    def load(self) -> None:
        config = self.spec.config
        model_file = self.spec.model_file
        _check_not_decoupled(config, self.spec.name)
        if not model_file.is_file():
            raise ModelLoadError(f"model '{self.spec.name}': model file {model_file} not found")
        pb.offer_port_to_threads(self.spec.bls)  # for threads the model starts itself
        self._offered = True
        self._module = import_model_file(model_file, self.spec.name, str(self.spec.version))
        try:
            cls = _model_class(self._module, self.spec.name, model_file)
            try:
                self.model = cls()
            except Exception as exc:
                raise ModelLoadError(
                    f"{self._where()}: creating {MODEL_CLASS} failed: {_describe(exc)}"
                ) from None
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                # BLS calls from initialize: no deadline but the default, and no self-call.
                try:
                    with self._calls(call_context.CallContext(self.spec.name)):
                        self._await(initialize(self.initialize_args()))
                except Exception as exc:
                    raise ModelLoadError(
                        f"{self._where()}: initialize failed: {_describe(exc)}"
                    ) from None
        except BaseException:
            self._release()
            raise

    def unload(self) -> None:
        model, self.model = self.model, None
        if model is not None:
            finalize = getattr(model, "finalize", None)
            if finalize is not None:
                try:
                    # BLS calls from finalize: as from initialize.
                    with self._calls(call_context.CallContext(self.spec.name)):
                        self._await(finalize())
                except Exception:
                    log.exception("%s: finalize failed", self._where())
        self._release()

    def _release(self) -> None:
        self.model = None
        if self._offered:
            self._offered = False
            pb.withdraw_port_from_threads(self.spec.bls)
        if self._loop is not None:
            loop, self._loop = self._loop, None
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            except Exception:
                log.debug("%s: closing the event loop", self._where(), exc_info=True)
            loop.close()
        module, self._module = self._module, None
        release_model_file(module, self.spec.model_file)

    @contextlib.contextmanager
    def _calls(self, context: call_context.CallContext) -> Iterator[None]:
        """What the model's BLS calls see while it runs: the call context they inherit and
        the BLS port this instance was handed (``spec.bls``; None outside a worker)."""
        context_token = call_context.CURRENT.set(context)
        port_token = pb.BLS_PORT.set(self.spec.bls)
        try:
            yield
        finally:
            pb.BLS_PORT.reset(port_token)
            call_context.CURRENT.reset(context_token)

    def _await(self, value: Any) -> Any:
        """Run a coroutine on this instance's own event loop; pass anything else through."""
        if not inspect.isawaitable(value):
            return value
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(_as_coroutine(value))

    # -- execute --------------------------------------------------------------------------

    def execute(self, requests: list[BackendRequest]) -> list[BackendResult]:
        if self.model is None:
            return [Unavailable(f"{self._where()} is not loaded")] * len(requests)
        batch = [self._request(r) for r in requests]
        # BLS calls made by this execute inherit the batch's deadline and call chain.
        try:
            with self._calls(call_context.batch_context(self.spec.name, requests)):
                responses = self._await(self.model.execute(batch))
        except (Exception, SystemExit) as exc:
            log.warning("%s: execute raised", self._where(), exc_info=True)
            # Triton's python backend's words, which clients and Triton's tests match.
            return [
                Internal(
                    "Failed to process the request(s) for model instance "
                    f"'{self.instance.name}', message: {_describe(exc)}"
                )
            ] * len(requests)
        problem = self._check(responses, len(requests))
        if problem is not None:
            return [Internal(f"model '{self.spec.name}': {problem}")] * len(requests)
        return [self._result(req, resp) for req, resp in zip(requests, responses, strict=True)]

    def _request(self, req: BackendRequest) -> pb.InferenceRequest:
        """The request a Python model sees. The sequence parameters become its
        ``correlation_id()`` and ``flags()``, as in Triton, and leave ``parameters()``."""
        params = req.parameters or {}
        sequence, start, end = sequence_params(params)
        flags = (pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if start else 0) | (
            pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if end else 0
        )
        if not SEQUENCE_PARAMETERS.isdisjoint(params):
            params = {k: v for k, v in params.items() if k not in SEQUENCE_PARAMETERS}
        return pb.InferenceRequest(
            model_name=self.spec.name,
            requested_output_names=list(req.outputs),
            inputs=[
                pb.Tensor._bfloat16(name, arr)
                if name in self._bf16_inputs
                else pb.Tensor(name, arr)
                for name, arr in req.inputs.items()
            ],
            request_id=req.request_id,
            correlation_id=sequence.value if sequence is not None else 0,
            model_version=self.spec.version,
            flags=flags,
            timeout=req.timeout_us,
            parameters=_json_parameters(params),
        )

    @staticmethod
    def _check(responses: Any, count: int) -> str | None:
        """Why the list ``execute`` returned is not one response per request, or None."""
        if responses is None:
            return (
                "execute returned None; it must return a list with one pb_utils.InferenceResponse "
                "per request (decoupled models are not supported over HTTP yet)"
            )
        if not isinstance(responses, list | tuple):
            return (
                "execute must return a list of pb_utils.InferenceResponse, not "
                f"{type(responses).__name__}"
            )
        if len(responses) != count:
            return (
                f"execute returned {len(responses)} response(s) for {count} request(s); "
                "it must return exactly one per request"
            )
        for i, resp in enumerate(responses):
            if resp is None:
                return f"execute returned None for request {i}; every request needs a response"
            if not isinstance(resp, pb.InferenceResponse):
                return (
                    f"execute returned a {type(resp).__name__} for request {i}, not a "
                    "pb_utils.InferenceResponse"
                )
        return None

    def _result(self, req: BackendRequest, resp: pb.InferenceResponse) -> BackendResult:
        if resp.has_error():
            return error_from_triton(resp.error())
        returned: dict[str, np.ndarray] = {}
        for tensor in resp.output_tensors():
            if not isinstance(tensor, pb.Tensor):
                return Internal(
                    f"model '{self.spec.name}' returned a {type(tensor).__name__} among its "
                    "output tensors, not a pb_utils.Tensor"
                )
            returned[tensor.name()] = tensor._array
        missing = [name for name in req.outputs if name not in returned]
        if missing:
            return Internal(
                f"model '{self.spec.name}' did not return output(s) {missing} that the request "
                f"asked for (it returned {sorted(returned)})"
            )
        return {name: returned[name] for name in req.outputs}


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable


def _json_parameters(params: dict[str, Any]) -> str:
    if not params:
        return "{}"
    try:
        return json.dumps(params)
    except (TypeError, ValueError):
        return json.dumps(
            {k: v if isinstance(v, str | int | float | bool) else str(v) for k, v in params.items()}
        )


__all__ = ["PythonBackend", "error_from_triton", "import_model_file", "install_utils"]
