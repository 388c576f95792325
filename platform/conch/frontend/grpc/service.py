"""Triton's ``GRPCInferenceService``: each RPC decoded, one ``DataPlane`` call, encoded.

The service is the one in the ``.proto`` Triton publishes, as tritonclient's wheel ships it
compiled (read by ``protos``, with no grpcio), so a stock ``tritonclient.grpc`` client,
perf_analyzer and Triton's C++ client speak to it. Each RPC is a method named as in the
``.proto``, taking the request (or the request iterator) and the call's
``ServicerContext``. Nothing here validates, dispatches, queues or picks an error's kind:
the data plane does, as for HTTP, and raises ``ConchError``s; ``STATUS`` maps their
Triton code to the gRPC status code the way Triton's gRPC frontend does, in this one
place.

``--grpc-restricted-protocol``: an RPC of a restricted group needs the metadata key
``triton-grpc-protocol-<key>`` with the secret, else UNAVAILABLE with Triton's message.
System shared memory (Triton's extension) is served with ``--allow-client-shm``
(``conch.frontend.shared_memory``; UNAVAILABLE saying so without it); CUDA shared memory
is refused (INVALID_ARGUMENT, with the reason). The RPCs of features conch does not have
(trace) answer UNIMPLEMENTED, saying so.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import json_format

from conch.core.errors import ConchError, Internal, InvalidArgument, NotFound, Unsupported
from conch.core.restricted_apis import ApiGroup, RestrictedApis
from conch.frontend import calls
from conch.frontend.composition import build_dataplane
from conch.frontend.dataplane import DataPlane
from conch.frontend.grpc import codec, transport
from conch.frontend.grpc.call_context import ServicerContext
from conch.frontend.grpc.grpc_framing import Status
from conch.frontend.grpc.protos import triton_messages
from conch.frontend.grpc.stream_order import SequenceLanes
from conch.frontend.producer import Abandonment
from conch.settings import Settings

log = logging.getLogger(__name__)

pb = triton_messages()

# grpcio reports a call without a deadline as this far off or more.
_NO_DEADLINE_S = 365 * 86_400.0
# Triton's stream parameters: on each response, whether it is its request's last; on a
# request, whether a decoupled model's "done" with no response is sent (empty) or not.
FINAL_PARAMETER = "triton_final_response"
# conch's own, on the first response of a new run of a decoupled request whose worker
# died mid-stream: the client drops the responses the lost run sent before it.
RESTARTED_PARAMETER = "conch_restarted"
EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
# Triton's stream metadata: "true" ends the stream at the first error, with its gRPC status.
GRPC_ERROR_HEADER = "triton_grpc_error"


@dataclass(frozen=True)
class _Failed:
    """A stream request's error, before the stream decides how it goes: in band, as an
    answer with ``error_message`` (Triton's default), or as the stream's gRPC status
    (``triton_grpc_error``). ``final``: the request was under way, so the in-band answer
    says it is the request's last."""

    request: Any
    error: ConchError
    final: bool = False

    def in_band(self) -> Any:
        answer = _stream_error(self.request, self.error.message)
        return _final(answer, True) if self.final else answer


# Triton's error codes (``ConchError.code``) as gRPC status codes, as Triton maps them.
STATUS: dict[str, Status] = {
    "UNKNOWN": Status.UNKNOWN,
    "INTERNAL": Status.INTERNAL,
    "NOT_FOUND": Status.NOT_FOUND,
    "INVALID_ARG": Status.INVALID_ARGUMENT,
    "UNAVAILABLE": Status.UNAVAILABLE,
    "UNSUPPORTED": Status.UNIMPLEMENTED,
    "ALREADY_EXISTS": Status.ALREADY_EXISTS,
    "CANCELLED": Status.CANCELLED,
}


def status_code(exc: ConchError) -> Status:
    """The gRPC status an error answers with (UNKNOWN for a code Triton does not map)."""
    return STATUS.get(exc.code, Status.UNKNOWN)


F = TypeVar("F", bound=Callable[..., Any])


def rpc(group: ApiGroup) -> Callable[[F], F]:
    """A unary RPC of ``group``: the restriction checked first, and any error answered
    as its gRPC status with its message."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def handler(self: InferenceService, request: Any, context: ServicerContext) -> Any:
            self.check_restriction(group, context)
            try:
                return method(self, request, context)
            except ConchError as exc:
                context.abort(status_code(exc), exc.message)
            except Exception as exc:
                log.exception("%s failed", method.__name__)
                context.abort(Status.INTERNAL, f"internal error: {exc}")

        return handler  # type: ignore[return-value]

    return wrap


def _unsupported(group: ApiGroup, feature: str) -> Callable[..., Any]:
    """An RPC of a feature conch does not have: UNIMPLEMENTED, naming the feature."""

    @rpc(group)
    def handler(self: InferenceService, request: Any, context: ServicerContext) -> Any:
        raise Unsupported(f"conch does not support {feature}")

    return handler


def _message(cls: Any, doc: Any) -> Any:
    """A response message from Triton's JSON form of it (the data plane's answers)."""
    return json_format.ParseDict(doc, cls(), ignore_unknown_fields=True)


def _version(version: str) -> str:
    """A request's model version ("" = the latest); a non-number is refused as Triton does."""
    if version and not version.lstrip("-").isdigit():
        raise InvalidArgument(f"failed to parse model version '{version}'")
    return version


class InferenceService:
    """The service over one data plane (see the module docstring)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> InferenceService:
        """The service either transport serves: over a data plane built as the gateway
        builds its own (``frontend.composition``), with the ``--grpc-*`` flags'."""
        return cls(
            build_dataplane(settings),
            settings.grpc_restricted_protocol,
            settings.grpc_infer_thread_count,
            transport.infer_compression(settings),
        )

    def __init__(
        self,
        plane: DataPlane,
        restricted: RestrictedApis,
        stream_threads: int,
        compression: str | None,
    ) -> None:
        self.plane = plane
        self.restricted = restricted
        # --grpc-infer-response-compression-level: how infer responses go on the wire.
        self.compression = compression
        # Requests of a stream run here, so that one stream's requests run side by side.
        self._stream_threads = stream_threads
        self._stream_pool = ThreadPoolExecutor(stream_threads, thread_name_prefix="grpc-stream")

    def check_restriction(self, group: ApiGroup, context: ServicerContext) -> None:
        rule = self.restricted.get(group)
        if rule is None:
            return
        key = rule.header.lower()  # gRPC metadata keys are lowercase on the wire
        supplied = next((v for k, v in context.invocation_metadata() if k == key), None)
        if not isinstance(supplied, str) or not rule.allows(supplied):
            context.abort(
                Status.UNAVAILABLE,
                f"This protocol is restricted, expecting header '{rule.header}'",
            )

    # -- health and metadata -------------------------------------------------------------

    @rpc(ApiGroup.HEALTH)
    def ServerLive(self, request: Any, context: ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=self.plane.live())

    @rpc(ApiGroup.HEALTH)
    def ServerReady(self, request: Any, context: ServicerContext) -> Any:
        return pb.ServerReadyResponse(ready=self.plane.ready())

    @rpc(ApiGroup.HEALTH)
    def ModelReady(self, request: Any, context: ServicerContext) -> Any:
        """As Triton's: a model or version that is unknown, unloaded or broken is just
        not ready (tritonclient's ``is_model_ready`` says False, it does not raise)."""
        version = _version(request.version)
        try:
            ready = self.plane.model_ready(request.name, version)
        except (InvalidArgument, NotFound):
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    @rpc(ApiGroup.METADATA)
    def ServerMetadata(self, request: Any, context: ServicerContext) -> Any:
        return _message(pb.ServerMetadataResponse, self.plane.server_metadata())

    @rpc(ApiGroup.METADATA)
    def ModelMetadata(self, request: Any, context: ServicerContext) -> Any:
        doc = self.plane.model_metadata(request.name, _version(request.version))
        return _message(pb.ModelMetadataResponse, doc)

    @rpc(ApiGroup.MODEL_CONFIG)
    def ModelConfig(self, request: Any, context: ServicerContext) -> Any:
        doc = self.plane.model_config(request.name, _version(request.version))
        return _message(pb.ModelConfigResponse, {"config": doc})

    @rpc(ApiGroup.STATISTICS)
    def ModelStatistics(self, request: Any, context: ServicerContext) -> Any:
        stats = self.plane.statistics(request.name or None, _version(request.version))
        return _message(pb.ModelStatisticsResponse, {"model_stats": stats})

    # -- the model repository ------------------------------------------------------------

    @rpc(ApiGroup.MODEL_REPOSITORY)
    def RepositoryIndex(self, request: Any, context: ServicerContext) -> Any:
        _one_repository(request.repository_name)
        return _message(pb.RepositoryIndexResponse, {"models": self.plane.index(request.ready)})

    @rpc(ApiGroup.MODEL_REPOSITORY)
    def RepositoryModelLoad(self, request: Any, context: ServicerContext) -> Any:
        _one_repository(request.repository_name)
        name = request.model_name
        config, files = None, {}
        for key, param in request.parameters.items():
            value = codec.parameter_value(param)
            if key == "config":
                if not isinstance(value, str):
                    raise InvalidArgument(
                        f"failed to load '{name}': parameter 'config' must be a string_param"
                    )
                config = value
            elif key.startswith("file:"):
                if not isinstance(value, bytes):
                    raise InvalidArgument(
                        f"failed to load '{name}': parameter '{key}' must be a bytes_param"
                    )
                files[key] = value
        self.plane.load(name, config=config, files=files)
        return pb.RepositoryModelLoadResponse()

    @rpc(ApiGroup.MODEL_REPOSITORY)
    def RepositoryModelUnload(self, request: Any, context: ServicerContext) -> Any:
        _one_repository(request.repository_name)
        dependents = False
        if "unload_dependents" in request.parameters:
            dependents = codec.parameter_value(request.parameters["unload_dependents"])
            if not isinstance(dependents, bool):
                raise InvalidArgument("'unload_dependents' must be a bool_param")
        self.plane.unload(request.model_name, unload_dependents=dependents)
        return pb.RepositoryModelUnloadResponse()

    # -- inference -----------------------------------------------------------------------

    def _infer(
        self,
        to: calls.Target,
        request: Any,
        context: ServicerContext,
        abandonment: Abandonment | None = None,
    ) -> Any:
        """One infer call to ``to`` (its errors came first), then the body's, as over
        HTTP. The call's gRPC deadline is the request's deadline in the queue too: a
        request still queued when its caller has given up is dropped by the worker,
        never run."""
        outcome = self.plane.infer(
            to,
            codec.decode_request(request, self.plane.shared_memory),
            deadline=_deadline(context),
            abandonment=abandonment,
            traceparent=_traceparent(context),
        )
        return codec.encode_outcome(outcome)

    @rpc(ApiGroup.INFERENCE)
    def ModelInfer(self, request: Any, context: ServicerContext) -> Any:
        """A call its client cancels stops waiting, and its request, if still queued,
        is taken back out and never runs. A decoupled model is refused, as by Triton
        (``ModelStreamInfer`` serves it)."""
        context.set_compression(self.compression)
        abandonment = Abandonment()
        context.add_callback(lambda: abandonment.abandon("the client cancelled the call"))
        to = self.plane.target(
            request.model_name, _version(request.model_version), endpoint="ModelInfer RPC"
        )
        return self._infer(to, request, context, abandonment)

    def _stream_answers(
        self, request: Any, context: ServicerContext, abandonment: Abandonment
    ) -> Iterator[Any]:
        """One stream request's answers, never an exception (an error is a ``_Failed``,
        for the stream to send as it does). A decoupled model's
        responses go as they come, each with ``triton_final_response`` (false but for
        the last), as Triton's stream sends them; any other model's one answer is
        final too. The first response of a run that replaced one lost with its worker
        says so (``conch_restarted``). A request that fails before it is queued gets its error with its id
        (Triton's request error); one that fails later gets it as a final response."""
        try:
            to = self.plane.target(request.model_name, _version(request.model_version))
            if not to.decoupled:
                answer = self._infer(to, request, context, abandonment)
                yield _final(pb.ModelStreamInferResponse(infer_response=answer), True)
                return
            decoded = codec.decode_request(request, self.plane.shared_memory)
            responses = self.plane.infer_stream(
                to,
                decoded,
                deadline=_deadline(context),
                abandonment=abandonment,
                traceparent=_traceparent(context),
            )
        except ConchError as exc:
            yield _Failed(request, exc)
            return
        except Exception as exc:
            log.exception("stream infer failed")
            yield _Failed(request, Internal(f"internal error: {exc}"))
            return
        # Triton's opt-in: a model's "done" with no response is sent as an empty response.
        empty_final = decoded.parameters.get(EMPTY_FINAL_PARAMETER) is True
        try:
            for outcome in responses:
                if not outcome.flag_only:
                    answer = pb.ModelStreamInferResponse(
                        infer_response=codec.encode_outcome(outcome)
                    )
                    if outcome.restarted:
                        answer.infer_response.parameters[RESTARTED_PARAMETER].bool_param = True
                    yield _final(answer, outcome.final)
                elif empty_final:
                    yield _final(_stream_error(request, ""), True)  # no error: empty
        except ConchError as exc:
            yield _Failed(request, exc, final=True)
        except Exception as exc:
            log.exception("stream infer failed")
            yield _Failed(request, Internal(f"internal error: {exc}"), final=True)
        finally:
            responses.close()

    def ModelStreamInfer(
        self, request_iterator: Iterator[Any], context: ServicerContext
    ) -> Iterator[Any]:
        """Each request's response (or its error, with its id) on the stream, as each
        finishes; an error never closes the stream. A decoupled model's request gets its
        responses one by one as they come (``_stream_answers``). Every request takes the
        stream's deadline. A client that half-closes the stream still gets every answer;
        one that cancels it (or goes away, or lets its deadline pass) gets none: its
        requests still queued are withdrawn and never run, those not yet sent are not
        sent.

        A stream holds at most as many requests read and not yet answered on the wire as
        the service has stream threads; past that it reads no more, so a client that
        sends faster than the model runs, or reads its answers slower, is held back by
        the transport's flow control instead of growing the server's queues. A request
        counts until its last answer is on the wire (a decoupled model's final one, or
        its end when no answer is sent for it). A decoupled request's responses are not
        held back: its worker pushes them to Redis whatever the client reads, so they
        wait here, in order, for the writer.

        With Triton's ``triton_grpc_error: true`` in the stream's metadata, the first
        error ends the stream instead, with its gRPC status and message: the stream's
        requests still queued are withdrawn, those running are told they are cancelled,
        and nothing more is sent."""
        self.check_restriction(ApiGroup.INFERENCE, context)
        ends_at_error = dict(context.invocation_metadata()).get(GRPC_ERROR_HEADER) == "true"
        context.set_compression(self.compression)
        answers: queue.Queue[Any] = queue.Queue()
        read_all, ended, finished = object(), object(), object()  # markers on ``answers``
        abandonment = Abandonment()
        room = threading.Semaphore(self._stream_threads)  # requests read, not yet answered

        def end() -> None:  # the RPC is over: answered, cancelled or past its deadline
            abandonment.abandon("the client cancelled the stream")
            answers.put(ended)
            room.release()  # a reader waiting for room wakes, and sees the end

        context.add_callback(end)

        def run(request: Any) -> None:
            if abandonment.gone:
                return  # nobody will read its answers
            for answer in self._stream_answers(request, context, abandonment):
                answers.put(answer)
            answers.put(finished)  # after its answers: the request's room is free

        lanes = SequenceLanes(self._stream_pool, run)  # a sequence's requests in order

        def read() -> None:
            count, requests = 0, iter(request_iterator)
            try:
                while True:
                    room.acquire()
                    if abandonment.gone:
                        room.release()  # for the next waiter, if any
                        break
                    request = next(requests, ended)  # over at a cancel too: end() lets go
                    if request is ended:
                        break
                    count += 1
                    lanes.submit(request)
            finally:
                answers.put((read_all, count))

        threading.Thread(target=read, name="grpc-stream-reader", daemon=True).start()
        done, total = 0, None
        while total is None or done < total:
            answer = answers.get()
            if answer is ended:
                return
            if isinstance(answer, tuple) and answer[0] is read_all:
                total = answer[1]
            elif answer is finished:
                done += 1
                room.release()  # a request answered: the reader may take one more
            elif isinstance(answer, _Failed):
                if ends_at_error:
                    abandonment.abandon("the stream ended at a request's error")
                    context.abort(status_code(answer.error), answer.error.message)
                yield answer.in_band()
            else:
                yield answer

    # -- logging ---------------------------------------------------------------------------

    @rpc(ApiGroup.LOGGING)
    def LogSettings(self, request: Any, context: ServicerContext) -> Any:
        """Triton's logging extension: the settings given (if any) changed in every
        process, then this process's settings answered."""
        changes = {key: _setting_value(key, value) for key, value in request.settings.items()}
        settings = self.plane.update_log_settings(changes) if changes else self.plane.log_settings()
        answer = pb.LogSettingsResponse()
        for key, value in settings.items():
            field = answer.settings[key]
            if isinstance(value, bool):
                field.bool_param = value
            elif isinstance(value, int):
                field.uint32_param = value
            else:
                field.string_param = value
        return answer

    # -- shared memory (--allow-client-shm) ----------------------------------------------

    @rpc(ApiGroup.SHARED_MEMORY)
    def SystemSharedMemoryStatus(self, request: Any, context: ServicerContext) -> Any:
        answer = pb.SystemSharedMemoryStatusResponse()
        for region in self.plane.shared_memory.status(request.name):
            answer.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return answer

    @rpc(ApiGroup.SHARED_MEMORY)
    def SystemSharedMemoryRegister(self, request: Any, context: ServicerContext) -> Any:
        self.plane.shared_memory.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc(ApiGroup.SHARED_MEMORY)
    def SystemSharedMemoryUnregister(self, request: Any, context: ServicerContext) -> Any:
        self.plane.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @rpc(ApiGroup.SHARED_MEMORY)
    def CudaSharedMemoryStatus(self, request: Any, context: ServicerContext) -> Any:
        self.plane.shared_memory.cuda_status(request.name)  # none is ever registered
        return pb.CudaSharedMemoryStatusResponse()

    @rpc(ApiGroup.SHARED_MEMORY)
    def CudaSharedMemoryRegister(self, request: Any, context: ServicerContext) -> Any:
        self.plane.shared_memory.cuda_register()  # refused, with the reason
        return pb.CudaSharedMemoryRegisterResponse()

    @rpc(ApiGroup.SHARED_MEMORY)
    def CudaSharedMemoryUnregister(self, request: Any, context: ServicerContext) -> Any:
        self.plane.shared_memory.cuda_unregister(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- features conch does not have ----------------------------------------------------

    TraceSetting = _unsupported(ApiGroup.TRACE, "trace settings")


def _setting_value(key: str, value: Any) -> Any:
    """One LogSettingsRequest setting as the JSON value the data plane checks (a setting
    sent with no value is refused there, as a JSON null is)."""
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def _stream_error(request: Any, message: str) -> Any:
    """A failed stream request's answer: the error, with the request's id to match it.
    With no message it is a decoupled model's empty final response, named the same way."""
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(
            id=request.id, model_name=request.model_name, model_version=request.model_version
        ),
    )


def _final(answer: Any, final: bool) -> Any:
    """``answer`` with Triton's ``triton_final_response`` parameter: whether it is its
    request's last (Triton's stream sets it on every response of a request it issued)."""
    answer.infer_response.parameters[FINAL_PARAMETER].bool_param = final
    return answer


def _deadline(context: ServicerContext) -> float:
    """The call's gRPC deadline (epoch seconds; 0: none)."""
    remaining = context.time_remaining()  # huge, not None, when the call has none
    if remaining is not None and remaining < _NO_DEADLINE_S:
        return time.time() + remaining
    return 0.0


def _traceparent(context: ServicerContext) -> str:
    traceparent = dict(context.invocation_metadata()).get("traceparent", "")
    return traceparent if isinstance(traceparent, str) else ""


def _one_repository(name: str) -> None:
    if name:
        raise InvalidArgument("'repository_name' specification is not supported")


__all__ = ["STATUS", "InferenceService", "status_code"]
