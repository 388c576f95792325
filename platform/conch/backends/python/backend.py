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

A decoupled model (``model_transaction_policy { decoupled: true }``) answers through each
request's response sender (``pb_utils.InferenceResponseSender``), whose responses go at
once to the request's ``BackendRequest.responder`` (the worker's), from ``execute`` or
from the threads the model starts; its ``execute`` returns None, and an ``async def``
execute runs in the background on the instance's event loop thread, as in Triton, while
the instance takes its next batch. Any other model may use the sender too: it must send
its one response and the final flag before ``execute`` returns.

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
import functools
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
from conch.core.errors import (
    ConchError,
    Internal,
    ModelLoadError,
    Unavailable,
    Unsupported,
    from_code,
)
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
        self._loop_thread: threading.Thread | None = None  # a decoupled model's loop runs here
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
        model_file = self.spec.model_file
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
            thread, self._loop_thread = self._loop_thread, None
            if thread is not None:  # a decoupled model's loop, running on its own thread
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=10)
            try:
                if not loop.is_running():
                    loop.run_until_complete(loop.shutdown_asyncgens())
            except Exception:
                log.debug("%s: closing the event loop", self._where(), exc_info=True)
            if not loop.is_running():
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
        if self.decoupled:
            return asyncio.run_coroutine_threadsafe(
                _as_coroutine(value), self._running_loop()
            ).result()
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(_as_coroutine(value))

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """A decoupled model's event loop, running on a thread of its own (as Triton's stub
        runs it), so an ``async def`` execute goes on after ``execute`` returned."""
        if self._loop is None or self._loop_thread is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, name=f"python-loop-{self.instance.name}", daemon=True
            )
            self._loop_thread.start()
        return self._loop

    # -- execute --------------------------------------------------------------------------

    def execute(self, requests: list[BackendRequest]) -> list[BackendResult | None]:
        if self.model is None:
            return [Unavailable(f"{self._where()} is not loaded")] * len(requests)
        if self.decoupled and any(r.responder is None for r in requests):
            # Only the drain loop's runner streams: not warmup, nor the sequence batcher.
            return [
                Unsupported(
                    f"{self._where()} is decoupled, and this request has no responder to send "
                    "its responses through (warmup and sequence batching of decoupled models "
                    "are not supported)"
                )
            ] * len(requests)
        batch = [self._request(r) for r in requests]
        decoupled = self.decoupled
        # A decoupled model's requests stream through their senders, made at once; any
        # other's sender is made only if the model asks for it (most return responses).
        kept: dict[int, list[pb.InferenceResponse]] = {}
        for i, (req, request) in enumerate(zip(requests, batch, strict=True)):
            if decoupled:
                request._sender = self._streaming_sender(req)
            else:
                request._sender_factory = functools.partial(self._keeping_sender, req, kept, i)
        # BLS calls made by this execute inherit the batch's deadline and call chain.
        try:
            with self._calls(call_context.batch_context(self.spec.name, requests)):
                returned = self.model.execute(batch)
                if decoupled and inspect.isawaitable(returned):
                    self._in_background(returned, requests, batch)
                    returned = None
                else:
                    returned = self._await(returned)
        except (Exception, SystemExit) as exc:
            log.warning("%s: execute raised", self._where(), exc_info=True)
            # Triton's python backend's words, which clients and Triton's tests match.
            return self._failed(
                batch,
                "Failed to process the request(s) for model instance "
                f"'{self.instance.name}', message: {_describe(exc)}",
            )
        if decoupled:
            if returned is not None:
                return self._failed(
                    batch,
                    f"Python model '{self.spec.name}' is using the decoupled mode and the "
                    "execute function must return None.",
                )
            return [None] * len(requests)
        return self._results(requests, returned, batch, kept)

    def _about(self, req: BackendRequest) -> str:
        return f"{self._where()} request '{req.request_id}'"

    def _keeping_sender(
        self, req: BackendRequest, kept: dict[int, list[pb.InferenceResponse]], i: int
    ) -> pb.InferenceResponseSender:
        """The sender of request ``i`` of a model that is not decoupled: it keeps the one
        response in ``kept[i]``, for ``execute``'s results (``_results``)."""
        box = kept[i] = []

        def keep(response: pb.InferenceResponse | None, final: bool) -> bool:
            if response is not None:
                box.append(response)
            return final

        return pb.InferenceResponseSender(
            keep, decoupled=False, about=self._about(req), cancelled=req.cancelled
        )

    def _streaming_sender(self, req: BackendRequest) -> pb.InferenceResponseSender:
        """A decoupled model's sender: each response goes to ``req.responder`` at once."""
        about = self._about(req)
        responder = req.responder

        def deliver(response: pb.InferenceResponse | None, final: bool) -> bool:
            if responder is None:
                raise pb.TritonModelException(
                    f"{about}: this request has no responder (a decoupled model's "
                    "requests get one from a conch worker's batcher)"
                )
            result = None if response is None else self._streamed(req, response)
            ends = final or isinstance(result, ConchError)
            responder.send(result, ends)
            return ends

        return pb.InferenceResponseSender(
            deliver,
            decoupled=True,
            about=about,
            cancelled=None if responder is None else responder.is_cancelled,
        )

    def _in_background(
        self,
        coroutine: Any,
        requests: list[BackendRequest],
        batch: list[pb.InferenceRequest],
    ) -> None:
        """A decoupled model's ``async def`` execute, left running on its loop's thread; if
        it raises, the requests it left open end with the error (Triton only logs it)."""
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(coroutine), self._running_loop())

        def done(f: Any) -> None:
            exc = None if f.cancelled() else f.exception()
            if f.cancelled() or exc is not None:
                log.error("%s: async execute failed: %s", self._where(), exc or "cancelled")
                message = (
                    "Failed to process the request(s) for model instance "
                    f"'{self.instance.name}', message: {_describe(exc) if exc else 'cancelled'}"
                )
                for req, request in zip(requests, batch, strict=True):
                    sender = request._sender
                    if sender is not None and sender._close() and req.responder is not None:
                        req.responder.send(Internal(message), True)
                return
            if f.result() is not None:
                log.error(
                    "%s: async execute returned %s; a decoupled model's execute must return None",
                    self._where(),
                    type(f.result()).__name__,
                )

        future.add_done_callback(done)

    def _failed(self, batch: list[pb.InferenceRequest], message: str) -> list[BackendResult | None]:
        """``execute`` failed: every sender closes, and each request it left open gets the
        error (a decoupled model's finished ones get None: they are answered)."""
        error = Internal(message)
        out: list[BackendResult | None] = []
        for request in batch:
            sender = request._retire(answered=False)
            was_open = sender._close() if sender is not None else True
            out.append(error if was_open or not self.decoupled else None)
        return out

    def _results(
        self,
        requests: list[BackendRequest],
        returned: Any,
        batch: list[pb.InferenceRequest],
        kept: dict[int, list[pb.InferenceResponse]],
    ) -> list[BackendResult | None]:
        """A model that is not decoupled: each request's response, returned by ``execute``
        or sent with its sender (Triton's: None in the list, or None for the list)."""
        problem = self._check(returned, len(requests))
        if problem is not None:
            return self._failed(batch, f"model '{self.spec.name}': {problem}")
        responses = [None] * len(requests) if returned is None else list(returned)
        out: list[BackendResult | None] = []
        for i, (req, resp, request) in enumerate(zip(requests, responses, batch, strict=True)):
            if resp is not None:
                sender = request._retire(answered=True)
                if sender is not None:
                    try:
                        sender._count(resp, True)  # Triton's check: not sent already
                    except pb.TritonModelException as exc:
                        return self._failed(batch, f"model '{self.spec.name}': {exc}")
                out.append(self._result(req, resp))
                continue
            sender = request._retire(answered=False)
            if sender is None or not sender._done or not kept.get(i):
                out.append(
                    Internal(
                        f"model '{self.spec.name}': no response for request {i}: execute must "
                        "return one pb_utils.InferenceResponse per request, or send it with "
                        "the request's response sender and TRITONSERVER_RESPONSE_COMPLETE_FINAL "
                        "before it returns (a model that answers later must be decoupled)"
                    )
                )
                if sender is not None:
                    sender._close()
                continue
            out.append(self._result(req, kept[i][0]))
        return out

    def _request(self, req: BackendRequest) -> pb.InferenceRequest:
        """The request a Python model sees. The sequence parameters become its
        ``correlation_id()`` and ``flags()``, as in Triton, and leave ``parameters()``; an
        input whose config declares a ``reshape`` comes in that shape (``_result`` turns
        such outputs back into their ``dims``)."""
        params = req.parameters
        correlation_id: int | str = 0
        flags = 0
        if params:
            sequence, start, end = sequence_params(params)
            flags = (pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if start else 0) | (
                pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if end else 0
            )
            if sequence is not None:
                correlation_id = sequence.value
            if not SEQUENCE_PARAMETERS.isdisjoint(params):
                params = {k: v for k, v in params.items() if k not in SEQUENCE_PARAMETERS}
        received = pb.Tensor._received
        bf16 = self._bf16_inputs
        inputs = self.reshaped(req.inputs, inputs=True)
        return pb.InferenceRequest._received(
            self.spec.name,
            self.spec.version,
            list(req.outputs),
            [received(name, arr, name in bf16) for name, arr in inputs.items()]
            if bf16
            else [received(name, arr) for name, arr in inputs.items()],
            req.request_id,
            correlation_id,
            flags,
            req.timeout_us,
            _json_parameters(params) if params else "{}",
        )

    @staticmethod
    def _check(responses: Any, count: int) -> str | None:
        """Why what ``execute`` returned is not None or a list of one response (or None,
        for one sent with its sender) per request; None when it is."""
        if responses is None:
            return None
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
            if resp is not None and not isinstance(resp, pb.InferenceResponse):
                return (
                    f"execute returned a {type(resp).__name__} for request {i}, not a "
                    "pb_utils.InferenceResponse"
                )
        return None

    def _streamed(self, req: BackendRequest, resp: pb.InferenceResponse) -> BackendResult:
        """One of a decoupled model's responses: as ``_result``, except that a response
        with no outputs (and no error) goes as one (an empty response, as Triton sends)."""
        if not resp.has_error() and not resp.output_tensors():
            return {}
        return self._result(req, resp)

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
        try:
            asked = {name: returned[name] for name in req.outputs}
        except KeyError:
            missing = [name for name in req.outputs if name not in returned]
            return Internal(
                f"model '{self.spec.name}' did not return output(s) {missing} that the request "
                f"asked for (it returned {sorted(returned)})"
            )
        try:
            return self.reshaped(asked, inputs=False)
        except ConchError as exc:
            return exc


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
