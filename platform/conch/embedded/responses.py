"""One request's responses inside an embedded server, from the model to its caller.

``Responses`` is both ends of the request: the backends' ``Responder`` (a decoupled model
sends each response through it, from ``execute`` or from any thread it starts; any other
model's one answer is sent through it by the scheduler) and the caller's iterator, which
hands each ``Answer`` on as it comes and raises the error that ended the request. A caller
that stops reading cancels it: a request still queued is never run, and a running
decoupled model sees ``is_cancelled()``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from conch.backends.base import BackendResult
from conch.core import tensors
from conch.core.errors import ConchError, Internal, Unavailable
from conch.core.inference import OutputTensor

log = logging.getLogger(__name__)


@dataclass
class Answer:
    """One response: its outputs as raw tensors in the datatypes the config declares (what
    an HTTP response carries), the version that ran, and whether it is the last."""

    outputs: list[OutputTensor]
    version: int
    final: bool = True


class Responses:
    """A request's answers, sent by whoever runs it and read by its caller (see the
    module docstring). ``deadline`` (epoch seconds, 0: none) bounds the caller's wait."""

    def __init__(
        self,
        model: str,
        version: int,
        wanted: Sequence[str],
        output_types: Mapping[str, str],
        deadline: float = 0.0,
    ) -> None:
        self.model = model
        self.version = version
        self.wanted = list(wanted)
        self.output_types = output_types
        self.deadline = deadline
        self._queue: queue.SimpleQueue[Answer | ConchError] = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._sent_final = False  # the sender's side is over
        self._read_final = False  # the caller's side is over
        self._lock = threading.Lock()

    @classmethod
    def answered(cls, model: str, version: int, outputs: list[OutputTensor]) -> Responses:
        """A request answered before anyone reads it (an ensemble's graph): one response."""
        done = cls(model, version, [], {})
        done._sent_final = True
        done._queue.put(Answer(outputs, version))
        return done

    # -- the Responder, for the model's side ----------------------------------------------
    def send(self, result: BackendResult | None, final: bool) -> None:
        """One response: outputs, or the error that ends the request (``Responder.send``)."""
        with self._lock:
            if self._sent_final:
                log.warning(
                    "model '%s' sent a response after its request's final one; dropped",
                    self.model,
                )
                return
            if isinstance(result, ConchError):
                self._sent_final = True
                self._queue.put(result)
                return
            try:
                outputs = (
                    [
                        OutputTensor(*t)
                        for t in tensors.named_outputs(result, self.wanted, self.output_types)
                    ]
                    if result
                    else []
                )
            except Exception as exc:
                self._sent_final = True
                self._queue.put(Internal(f"model '{self.model}' returned a bad output: {exc}"))
                return
            self._sent_final = final
            self._queue.put(Answer(outputs, self.version, final))

    def fail(self, error: ConchError) -> None:
        """End the request with ``error`` (nothing more is sent after it)."""
        self.send(error, True)

    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def over(self) -> bool:
        """The model's side has sent its final response or an error."""
        return self._sent_final

    # -- the caller's side ----------------------------------------------------------------
    def cancel(self) -> None:
        """The caller reads no more."""
        self._cancelled.set()

    def __iter__(self) -> Iterator[Answer]:
        return self

    def __next__(self) -> Answer:
        if self._read_final:
            raise StopIteration
        timeout = max(0.0, self.deadline - time.time()) if self.deadline else None
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            self._read_final = True
            self.cancel()
            raise Unavailable(
                f"Request timeout expired for model '{self.model}': no response in time"
            ) from None
        if isinstance(item, ConchError):
            self._read_final = True
            raise item
        self._read_final = item.final
        return item

    def one(self) -> Answer:
        """The only response of a request that answers once; raises its error."""
        answer = next(self)
        if not answer.final:
            self.cancel()
            raise Internal(f"model '{self.model}' answered more than once")
        return answer

    def close(self) -> None:
        """Stop reading: cancelled unless the final response was read."""
        if not self._read_final:
            self._read_final = True
            self.cancel()


__all__ = ["Answer", "Responses"]
