"""Traffic splits across a model's versions (canary, A/B) in the frontends: set, route, shadow.

A model's split (``conch.wire.traffic_split``: weights by version, and a shadow) is set
through the model-repository API and kept in Redis, so every gateway and gRPC server
applies it. Here, on the data plane (``DataPlane.target`` and ``DataPlane.infer``):

- **Setting it** (``Traffic.set``): the split is checked (``traffic_split.parse``: a
  weight that is negative or not a number, a share outside [0, 1] are 400s), then
  against the model as served now: every version it names, with a weight above 0 or as
  the shadow, must be one the model serves and ready (a 400 naming the first that is
  not). A sequence model takes no split (a sequence must stay on one version), and an
  ensemble or a decoupled model no shadow (its copy would be a graph's or a stream's).
- **Routing** (``Traffic.route``): a client's request that names no version, to a model
  with weights, is sent to a version drawn by weight among the split's versions ready
  now (none ready: the latest, as without a split). Its message names that version, not
  "latest", so the response's ``model_version`` and the statistics of that version
  show the split. A request that names a version is never touched; nor are BLS calls,
  ensemble steps and batch-job lines, which do not come through here.
- **Shadowing** (``Traffic.shadow``, from ``DataPlane.infer``: calls answered once, not
  streams nor async jobs): with the shadow's share, a request (to a model that is
  neither an ensemble nor decoupled) also sends a copy, with the same inputs and
  parameters, to the shadow's version, at the async jobs' priority step (below every
  online request) and with the request's deadline. A thread waits for its answer and
  records it on the model's shadow stream (``conch.shadow.<model>``, about the newest
  1,000 kept); the client's answer never waits for it. At most ``MAX_SHADOWS`` copies
  are in flight per process; past that a copy is not sent. Each record's fields (all
  strings): ``id`` (the client's request id), ``message`` (the request's message id),
  ``shadow_message``, ``version`` (the shadow's), ``primary_version`` (the version the
  request itself was sent to), ``at`` (epoch seconds sent), ``took_ms``, ``status``
  (``ok`` or ``error``), ``error`` (its message, or ""), and ``outputs``: JSON, a list
  of ``{"name", "datatype", "shape", "bytes"}``, each with ``"data"`` (as a JSON
  response's) when the answer's tensors hold at most ``RECORDED_BYTES`` in all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import replace
from typing import Any

from conch.core import ensemble_graph
from conch.core.errors import ConchError, InvalidArgument
from conch.core.inference import InferRequest
from conch.core.repository import ModelEntry
from conch.core.tensors import raw_to_json
from conch.frontend import calls
from conch.frontend.model_view import ModelView
from conch.frontend.producer import Dispatcher, Pending
from conch.settings import Settings
from conch.wire import traffic_split
from conch.wire.messages import InferMessage, Reply, WireTensor

log = logging.getLogger(__name__)

MAX_SHADOWS = 64  # shadow copies in flight per process; past that a copy is not sent
RECORDED_BYTES = 64 * 1024  # an answer up to this size is recorded with its data


class Traffic:
    """One frontend process's traffic splits: set, read, and applied to its requests."""

    def __init__(self, settings: Settings, view: ModelView, dispatcher: Dispatcher) -> None:
        self.settings = settings
        self.view = view
        self.dispatcher = dispatcher
        self.client = dispatcher.client
        self.splits = traffic_split.Splits(self.client)
        self._slots = threading.BoundedSemaphore(MAX_SHADOWS)

    # -- the API ------------------------------------------------------------------------

    def read(self, entry: ModelEntry) -> dict[str, Any]:
        """The model's split as stored now (``{"weights": {}}``: none)."""
        return traffic_split.read(self.client, entry.name).to_json()

    def set(self, entry: ModelEntry, doc: Any) -> dict[str, Any]:
        """Check ``doc`` against the model as served now and keep it for every process;
        an empty one clears the model's. The split that follows."""
        split = traffic_split.parse(entry.name, doc)
        if not split.empty:
            self._check(entry, split)
        traffic_split.store(self.client, entry.name, split)
        self.splits.invalidate()
        return split.to_json()

    def clear(self, entry: ModelEntry) -> dict[str, Any]:
        traffic_split.clear(self.client, entry.name)
        self.splits.invalidate()
        return traffic_split.NO_SPLIT.to_json()

    def _check(self, entry: ModelEntry, split: traffic_split.Split) -> None:
        name, config = entry.name, entry.config
        if config.HasField("sequence_batching"):
            raise InvalidArgument(
                f"invalid traffic split for model '{name}': it is a sequence model, whose "
                "sequences must each stay on one version"
            )
        if split.shadow is not None and (
            entry.backend == ensemble_graph.ENSEMBLE or config.model_transaction_policy.decoupled
        ):
            kind = "an ensemble" if entry.backend == ensemble_graph.ENSEMBLE else "decoupled"
            raise InvalidArgument(
                f"invalid traffic split for model '{name}': it is {kind}, and conch does "
                "not shadow such a model's requests"
            )
        named = [v for v, w in sorted(split.weights.items()) if w > 0]
        if split.shadow is not None:
            named.append(split.shadow.version)
        for version in named:
            if version not in entry.versions:
                raise InvalidArgument(
                    f"invalid traffic split for model '{name}': version {version} is not "
                    f"one it serves (its versions: {sorted(entry.versions)})"
                )
            if not self.view.version_ready(name, version):
                raise InvalidArgument(
                    f"invalid traffic split for model '{name}': version {version} is not ready"
                )

    # -- requests -----------------------------------------------------------------------

    def route(self, to: calls.Target) -> calls.Target:
        """``to`` with its model's split applied (see the module docstring)."""
        if not to.latest:
            return to
        entry = to.entry
        split = self.splits.get(entry.name)
        if split.empty or entry.config is None or entry.config.HasField("sequence_batching"):
            return to

        def ready(version: int) -> bool:
            return version in entry.versions and self.view.version_ready(entry.name, version)

        version = split.draw(ready)
        shadow = split.shadows()
        if shadow is not None and (
            entry.backend == ensemble_graph.ENSEMBLE or to.decoupled or not ready(shadow)
        ):
            shadow = None
        if version is None and shadow is None:
            return to
        if version is None:
            return replace(to, shadow=shadow)
        return replace(to, version=version, latest=False, shadow=shadow or 0)

    def shadow(self, to: calls.Target, request: InferRequest, primary: calls.Call) -> None:
        """Send ``request``'s copy to ``to.shadow`` (none: nothing) and record its answer
        from a thread of its own; never raises, never waits for it."""
        if not to.shadow or not self._slots.acquire(blocking=False):
            if to.shadow:
                log.debug("shadow copy not sent: %d already in flight", MAX_SHADOWS)
            return
        try:
            call = calls.build(
                calls.Target(to.entry, to.shadow, False),
                request,
                lane=calls.Lane.ASYNC,  # below every online request
                default_timeout_s=self.settings.request_timeout_s,
            )
            msg = call.msg
            msg.deadline = primary.msg.deadline
            # The request's buffers may be reused once it is answered: the copy owns its bytes.
            msg.inputs = [WireTensor(n, dt, shape, bytes(raw)) for n, dt, shape, raw in msg.inputs]
            worker = threading.Thread(
                target=self._run_shadow,
                args=(to, request.id, primary, msg),
                name="conch-shadow",
                daemon=True,
            )
            worker.start()
        except Exception:
            self._slots.release()
            log.exception("shadow copy not sent")

    def _run_shadow(
        self, to: calls.Target, request_id: str, primary: calls.Call, msg: InferMessage
    ) -> None:
        sent = time.time()
        reply: Reply | None = None
        error = ""
        try:
            pending: Pending = self.dispatcher.submit(msg, version=to.shadow)
            reply = pending.wait()
            if reply.error is not None:
                error = reply.error.message
        except ConchError as exc:
            error = exc.message
        except Exception as exc:  # never let a shadow's failure go unrecorded or loud
            error = f"internal error: {exc}"
        finally:
            self._slots.release()
        fields = {
            "id": request_id,
            "message": primary.msg.id,
            "shadow_message": msg.id,
            "version": str(to.shadow),
            "primary_version": str(to.version),
            "at": f"{sent:.6f}",
            "took_ms": f"{(time.time() - sent) * 1000:.3f}",
            "status": "error" if error else "ok",
            "error": error,
            "outputs": json.dumps(
                [] if reply is None or error else self._outputs(to.entry, reply),
                separators=(",", ":"),
            ),
        }
        try:
            traffic_split.record_shadow(self.client, to.entry.name, fields)
        except Exception as exc:
            log.warning("shadow answer of model '%s' not recorded: %s", to.entry.name, exc)

    def _outputs(self, entry: ModelEntry, reply: Reply) -> list[dict[str, Any]]:
        types = self.view.output_types(entry)
        outputs = list(reply.outputs or ())
        with_data = sum(len(raw) for *_, raw in outputs) <= RECORDED_BYTES
        out = []
        for name, datatype, shape, raw in outputs:
            datatype = types.get(name, datatype)
            row: dict[str, Any] = {
                "name": name,
                "datatype": datatype,
                "shape": list(shape),
                "bytes": len(raw),
            }
            if with_data:
                with contextlib.suppress(ConchError):  # unreadable: recorded without it
                    row["data"] = raw_to_json(datatype, shape, raw, name)
            out.append(row)
        return out


__all__ = ["MAX_SHADOWS", "RECORDED_BYTES", "Traffic"]
