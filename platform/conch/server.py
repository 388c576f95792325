"""``conch.Server``: conch inside an application, shaped like Triton's ``tritonserver`` package.

Triton links into an application through its C API, whose Python form is the
``tritonserver`` package (``tritonserver.Server(...).start()``,
``server.model(name).infer(...)``). ``conch.Server`` takes the same calls, so that code
moves across with its imports changed, in one of two modes behind one API:

- **embedded** (no ``redis_url``): no Redis and no other process. The models run in this
  process (``conch.embedded``) with their dynamic batching, ensembles and BLS. This is the
  edge case: one process, one host, nothing to run beside it.
- **connected** (``redis_url=...``): the server is a gateway inside the application. Its
  requests go onto the fleet's queues through that Redis and are answered by whatever
  workers serve them (``conch worker``, ``conch serve``), as any gateway's are
  (``conch.frontend.dataplane``).

Either way a request is checked, versioned and answered as over HTTP: the same errors
(``conch.ConchError``, with Triton's status), the same output datatypes, the same
statistics. Inputs are numpy arrays, or anything ``numpy.asarray`` or ``numpy.from_dlpack``
takes (a CPU torch tensor, lists, strings for BYTES); outputs are numpy arrays (BYTES as
object arrays of ``bytes``), which ``numpy.from_dlpack`` and torch take without a copy.
``docs/in-process.md`` is the guide.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from conch.api import API
from conch.core import tensors
from conch.core.errors import ConchError, InvalidArgument, StartFailed, Unavailable
from conch.core.inference import InferRequest, InputTensor, OutputTensor, RequestedOutput
from conch.settings import ModelControlMode, Settings
from conch.version import __version__

__all__ = list(API)  # what ``import conch`` offers, imported on first use


@dataclass
class InferenceResponse:
    """One response of a request: ``outputs`` by name as numpy arrays, ``final`` on the
    last one (a decoupled model may send many, or only a final one with no outputs)."""

    model: str
    model_version: int
    request_id: str
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    final: bool = True


class _Answers(Protocol):
    """What either mode answers a request with: each response's raw outputs, version and
    finality, as they come; ``close`` cancels what is not read yet."""

    def __iter__(self) -> Iterator[tuple[list[OutputTensor], int, bool]]: ...

    def close(self) -> None: ...


class ResponseIterator:
    """A request's responses as they come (``Model.infer``); iterate to the end or
    ``cancel``. Iterating raises the ``ConchError`` that ended the request."""

    def __init__(self, model: str, request_id: str, answers: _Answers) -> None:
        self._model = model
        self._request_id = request_id
        self._answers = answers
        self._iter = iter(answers)

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        outputs, version, final = next(self._iter)
        return InferenceResponse(
            self._model,
            version,
            self._request_id,
            {t.name: tensors.to_numpy(t.datatype, t.shape, t.raw, t.name) for t in outputs},
            final,
        )

    def cancel(self) -> None:
        """Read no more: the request is withdrawn if it has not run, else the model sees
        ``is_cancelled()``."""
        self._answers.close()


class AsyncResponseIterator:
    """``ResponseIterator`` for asyncio (``Model.async_infer``): each response is awaited
    on a worker thread, so the event loop never blocks on the model."""

    def __init__(self, responses: ResponseIterator) -> None:
        self._responses = responses

    def __aiter__(self) -> AsyncIterator[InferenceResponse]:
        return self

    async def __anext__(self) -> InferenceResponse:
        try:
            return await asyncio.to_thread(self._next)
        except _Exhausted:
            raise StopAsyncIteration from None

    def _next(self) -> InferenceResponse:
        try:
            return next(self._responses)
        except StopIteration:
            raise _Exhausted from None

    def cancel(self) -> None:
        self._responses.cancel()


class _Exhausted(Exception):
    """StopIteration cannot cross ``asyncio.to_thread``'s future."""


class Model:
    """One model of a started server (``Server.model``): ``version`` -1 is the latest.
    ``state`` and ``reason`` are the repository index's, on a model ``Server.models``
    listed (None on one ``Server.model`` made), as ``tritonserver``'s are."""

    def __init__(
        self,
        server: Server,
        name: str,
        version: int = -1,
        state: str | None = None,
        reason: str | None = None,
    ) -> None:
        self._server = server
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    def __repr__(self) -> str:
        return repr({"name": self.name, "version": self.version, "state": self.state})

    @property
    def _version_text(self) -> str:
        return "" if self.version in (-1, None) else str(self.version)

    def infer(
        self,
        inputs: Mapping[str, Any],
        *,
        requested_output_names: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
    ) -> ResponseIterator:
        """Run the model on ``inputs`` (by name); its responses to iterate, one for a
        model that answers once, any number for a decoupled one. ``parameters`` are the
        request's custom parameters, as over HTTP; ``timeout_us`` bounds it as Triton's
        ``timeout`` parameter does. A bad request raises here (``InvalidArgument``, 400),
        before anything runs."""
        request = _request(inputs, requested_output_names, parameters, request_id, timeout_us)
        answers = self._server._plane().infer(self.name, self._version_text, request)
        return ResponseIterator(self.name, request_id, answers)

    def async_infer(self, inputs: Mapping[str, Any], **options: Any) -> AsyncResponseIterator:
        """``infer`` (the same options) for asyncio: the request is checked and sent now,
        and its responses are awaited with ``async for``."""
        return AsyncResponseIterator(self.infer(inputs, **options))

    def ready(self) -> bool:
        return self._server._plane().model_ready(self.name, self._version_text)

    def metadata(self) -> dict[str, Any]:
        """Triton's model metadata (the v2 protocol's JSON)."""
        return self._server._plane().model_metadata(self.name, self._version_text)

    def config(self) -> dict[str, Any]:
        """The completed model configuration, as Triton's JSON."""
        return self._server._plane().model_config(self.name, self._version_text)

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics extension for this model (``{"model_stats": [...]}``)."""
        return {"model_stats": self._server._plane().statistics(self.name, self._version_text)}


class ModelIndex(dict[tuple[str, int], Model]):
    """What ``Server.models`` answers, in ``tritonserver``'s form (its ``ModelDictionary``):
    each model version of the repository index by ``(name, version)``, its ``Model``
    carrying the state and reason. A model with no version loaded is listed once, under
    version -1. Looked up by name alone, it gives the model's latest version."""

    def __init__(self, server: Server, rows: Sequence[Mapping[str, Any]]) -> None:
        super().__init__()
        self._server = server
        for row in rows:
            version = int(row.get("version") or -1)
            reason = row.get("reason") or None
            self[(row["name"], version)] = Model(
                server, row["name"], version, row.get("state"), reason
            )

    def __getitem__(self, key: str | tuple[str, int]) -> Model:
        if isinstance(key, tuple):
            if key in self.keys():
                return dict.__getitem__(self, key)
        elif any(name == key for name, _ in self.keys()):
            return Model(self._server, key)
        raise KeyError(f"Unknown Model: {key}")


class Server:
    """conch in this process (see the module docstring). ``model_repository``: one folder
    or several; ``model_control_mode``: ``none`` (every model at start) or ``explicit``
    (``startup_models``, then ``load``); ``redis_url``: connect to a fleet instead of
    running the models here. ``settings`` gives any other conch setting (connected mode
    takes them all, as a gateway would)."""

    def __init__(
        self,
        model_repository: str | Path | Sequence[str | Path] = (),
        *,
        model_control_mode: ModelControlMode | str = ModelControlMode.NONE,
        startup_models: Sequence[str] = (),
        strict_model_config: bool = False,
        redis_url: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        base = settings if settings is not None else Settings.from_env()
        changes: dict[str, Any] = {
            "model_control_mode": ModelControlMode(str(model_control_mode).lower()),
            "load_models": list(startup_models) or base.load_models,
        }
        if model_repository:
            given = (
                [model_repository]
                if isinstance(model_repository, str | Path)
                else list(model_repository)
            )
            changes["model_repository"] = tuple(_folder(r) for r in given)
        if strict_model_config:
            changes["auto_complete"] = False
        if redis_url is not None:
            changes["redis_url"] = redis_url
        self.settings = dataclasses.replace(base, **changes)
        self.connected = redis_url is not None
        if not self.connected and self.settings.model_control_mode is ModelControlMode.POLL:
            raise InvalidArgument(
                "an embedded conch.Server does not poll its repository: use "
                "model_control_mode='explicit' and call load(name) to pick up a change"
            )
        self._backplane: _Backplane | None = None
        self._lock = threading.Lock()

    @property
    def mode(self) -> str:
        """``embedded`` or ``connected``."""
        return "connected" if self.connected else "embedded"

    def start(self, wait_until_ready: bool = False, timeout: float = 60.0) -> Server:
        """Read the repository and load its models (embedded), or join the fleet
        (connected). With ``wait_until_ready``, wait until ``ready()``, at most
        ``timeout`` seconds, and raise ``Unavailable`` if it is not."""
        with self._lock:
            if self._backplane is None:
                self._backplane = (
                    _Connected(self.settings) if self.connected else _Embedded(self.settings)
                )
        if wait_until_ready and not _wait(self.ready, timeout):
            raise Unavailable(f"conch.Server not ready after {timeout:g} s: {self.models()}")
        return self

    def stop(self) -> None:
        """Finish what is running and let go of the models (embedded) or of Redis."""
        with self._lock:
            backplane, self._backplane = self._backplane, None
        if backplane is not None:
            backplane.stop()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _plane(self) -> _Backplane:
        backplane = self._backplane
        if backplane is None:
            raise Unavailable("conch.Server is not started: call start() first")
        return backplane

    # -- the server ----------------------------------------------------------------------
    def live(self) -> bool:
        return self._backplane is not None

    def ready(self) -> bool:
        """Every model that should be served is ready (Triton's strict readiness)."""
        return self._backplane is not None and self._backplane.ready()

    def metadata(self) -> dict[str, Any]:
        return {"name": "conch", "version": __version__, "mode": self.mode}

    def models(self, exclude_not_ready: bool = False) -> ModelIndex:
        """The repository index (``ModelIndex``): every model version, its state and why;
        with ``exclude_not_ready``, only the versions that are ready."""
        rows = self._plane().index()
        if exclude_not_ready:
            rows = [row for row in rows if row.get("state") == "READY"]
        return ModelIndex(self, rows)

    def model(self, name: str, version: int = -1) -> Model:
        return Model(self, name, version)

    def load(self, name: str) -> Model:
        """Load (or reload) ``name``; raises why it could not be loaded."""
        self._plane().load(name)
        return Model(self, name)

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        self._plane().unload(name, unload_dependents)

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics extension for every loaded model."""
        return {"model_stats": self._plane().statistics(None, "")}


# -- the two modes ------------------------------------------------------------------------


class _Backplane(Protocol):
    def ready(self) -> bool: ...
    def index(self) -> list[dict[str, Any]]: ...
    def model_ready(self, name: str, version: str) -> bool: ...
    def model_metadata(self, name: str, version: str) -> dict[str, Any]: ...
    def model_config(self, name: str, version: str) -> dict[str, Any]: ...
    def statistics(self, name: str | None, version: str) -> list[dict[str, Any]]: ...
    def load(self, name: str) -> None: ...
    def unload(self, name: str, unload_dependents: bool) -> None: ...
    def infer(self, name: str, version: str, request: InferRequest) -> _Answers: ...
    def stop(self) -> None: ...


class _Embedded:
    """The models in this process (``conch.embedded.Engine``)."""

    def __init__(self, settings: Settings) -> None:
        from conch.backends import completion
        from conch.core.repository import ModelRepository
        from conch.embedded.engine import Engine

        repository = ModelRepository(
            settings.repository_folders,
            complete=completion.complete,
            auto_complete=settings.auto_complete,
            default_max_batch_size=settings.backend_config.max_batch_sizes,
        )
        self.engine = Engine(
            repository,
            explicit=settings.model_control_mode.explicit,
            startup_models=settings.load_models,
        )
        self.engine.start()
        failed = self.engine.failures()
        if failed and settings.exit_on_error:  # as tritonserver's start raises
            self.engine.stop()
            raise StartFailed(failed)

    def ready(self) -> bool:
        wanted = [m["name"] for m in self.engine.index() if m.get("reason") != "unloaded"]
        return all(self.engine.ready(name) for name in wanted)

    def index(self) -> list[dict[str, Any]]:
        return self.engine.index()

    def model_ready(self, name: str, version: str) -> bool:
        return self.engine.ready(name, version)

    def model_metadata(self, name: str, version: str) -> dict[str, Any]:
        entry = self.engine.serving(name).entry
        return entry.metadata(entry.resolve_version(version) if version else None)

    def model_config(self, name: str, version: str) -> dict[str, Any]:
        entry = self.engine.serving(name).entry
        entry.resolve_version(version)
        return entry.to_json()

    def statistics(self, name: str | None, version: str) -> list[dict[str, Any]]:
        return self.engine.statistics(name, version)

    def load(self, name: str) -> None:
        self.engine.load(name)

    def unload(self, name: str, unload_dependents: bool) -> None:
        self.engine.unload(name, unload_dependents)

    def infer(self, name: str, version: str, request: InferRequest) -> _Answers:
        return _Each(self.engine.infer(name, version, request))

    def stop(self) -> None:
        self.engine.stop()


class _Each:
    """Answers that come as objects with ``outputs``, ``version`` and ``final`` (an
    embedded ``Answer``, a data plane's ``InferOutcome``), with ``close`` to stop."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[tuple[list[OutputTensor], int, bool]]:
        for each in self._stream:
            yield each.outputs, each.version, each.final

    def close(self) -> None:
        self._stream.close()


class _Connected:
    """A gateway's data plane inside this process (``frontend.composition``)."""

    def __init__(self, settings: Settings) -> None:
        from conch.frontend.composition import build_dataplane

        self.plane = build_dataplane(settings)

    def ready(self) -> bool:
        return self.plane.ready()

    def index(self) -> list[dict[str, Any]]:
        return self.plane.index()

    def model_ready(self, name: str, version: str) -> bool:
        return self.plane.model_ready(name, version)

    def model_metadata(self, name: str, version: str) -> dict[str, Any]:
        return self.plane.model_metadata(name, version)

    def model_config(self, name: str, version: str) -> dict[str, Any]:
        return self.plane.model_config(name, version)

    def statistics(self, name: str | None, version: str) -> list[dict[str, Any]]:
        return self.plane.statistics(name, version)

    def load(self, name: str) -> None:
        self.plane.load(name, files={})

    def unload(self, name: str, unload_dependents: bool) -> None:
        self.plane.unload(name, unload_dependents=unload_dependents)

    def infer(self, name: str, version: str, request: InferRequest) -> _Answers:
        to = self.plane.target(name, version)
        if to.decoupled:
            return _Each(self.plane.infer_stream(to, request))
        outcome = self.plane.infer(to, request)
        return _OneAnswer(outcome.outputs, outcome.version)

    def stop(self) -> None:
        self.plane.close()


class _OneAnswer:
    def __init__(self, outputs: list[OutputTensor], version: int) -> None:
        self._outputs = outputs
        self._version = version

    def __iter__(self) -> Iterator[tuple[list[OutputTensor], int, bool]]:
        yield self._outputs, self._version, True

    def close(self) -> None:
        pass


# -- requests -----------------------------------------------------------------------------


def _request(
    inputs: Mapping[str, Any],
    requested: Sequence[str] | None,
    parameters: Mapping[str, Any] | None,
    request_id: str,
    timeout_us: int,
) -> InferRequest:
    """The neutral request every frontend decodes into, from Python values."""
    if not isinstance(inputs, Mapping):
        raise InvalidArgument("inputs must be a mapping of input name to tensor")
    given: list[InputTensor] = []
    for name, value in inputs.items():
        arr = _array(value, name)
        try:
            datatype, raw = tensors.from_numpy(arr)
        except ConchError as exc:
            raise InvalidArgument(f"input '{name}': {exc.message}") from None
        given.append(InputTensor(str(name), datatype, tuple(int(d) for d in arr.shape), raw))
    params: dict[str, Any] = dict(parameters or {})
    if timeout_us:
        params["timeout"] = int(timeout_us)
    return InferRequest(
        id=str(request_id),
        inputs=given,
        outputs=[RequestedOutput(str(n), True) for n in requested] if requested else None,
        binary_data_output=True,
        parameters=params,
    )


def _array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        if hasattr(value, "__dlpack__") and not isinstance(value, list | tuple | str | bytes):
            return np.from_dlpack(value)
        return np.asarray(value)
    except Exception as exc:
        raise InvalidArgument(f"input '{name}' is not a tensor numpy can read: {exc}") from None


def _folder(repository: str | Path) -> Path:
    """A repository folder; object storage is mirrored by ``conch sync`` first."""
    if isinstance(repository, str) and "://" in repository:
        raise InvalidArgument(
            f"model_repository {repository}: conch.Server reads folders; mirror the bucket "
            "into one with `conch sync` and give that folder"
        )
    return Path(repository)


def _wait(ready: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready():
            return True
        time.sleep(0.05)
    return ready()
