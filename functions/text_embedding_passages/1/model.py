"""A long document's passages, each streamed with its embedding as soon as it is computed.

A decoupled model written for Triton's Python backend (no conch imports). Each request
holds one document, ``TEXT`` (UTF-8). ``passages.py`` splits it into passages of at most
``PASSAGE_TOKENS`` tokens (default ``DEFAULT_SIZE``) on word boundaries, consecutive ones
sharing up to ``OVERLAP_TOKENS`` tokens (default a quarter of the passage); its docstring
says exactly how. Each passage's embedding is ``text_embedding``'s for the passage's text,
asked for with a BLS call, so it is the very vector the ensemble gives that text.

The request gets one response per passage, in the document's order, sent as soon as that
passage's embedding is back: ``PASSAGE`` (its text), ``INDEX`` (from 0), ``COUNT`` (the
document's number of passages), ``START`` and ``END`` (character offsets into the document,
end excluded) and ``EMBEDDING``. The last passage's response carries the final flag, so a
client knows the stream ended without asking for Triton's empty final response. A document
with no text (empty, or whitespace only) has no passages: its request gets the final flag
alone, Triton's empty final response.

Errors end the request with one error response: ``INVALID_ARG`` for text that is not UTF-8
or a passage size or overlap out of bounds, sent before any passage; the embedding call's
own error, should it fail midway; ``CANCELLED`` when the client went away, checked before
each passage so that an abandoned document stops costing the encoder.

``execute`` is ``async``: the instance takes its next requests while earlier documents
stream, and their passages' calls take turns at the encoder. Each document keeps
``LOOKAHEAD`` calls in flight, so the next passage is already queued while the current one
is computed and sent.
"""

import asyncio
import os

import numpy as np
import passages
import triton_python_backend_utils as pb_utils

EMBEDDING_MODEL = "text_embedding"
TOKENIZER_MODEL = "text_embedding_tokenizer"
DEFAULT_SIZE = 128  # tokens: all-MiniLM-L6-v2 was trained on texts cut at 128
LOOKAHEAD = 2  # one passage computing, the next waiting at the encoder
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def tokenizer_folder(model_folder):
    """The newest version folder of ``text_embedding_tokenizer`` beside this model, whose
    ``tokenizer.json`` is the one ``text_embedding`` tokenizes with."""
    root = os.path.join(os.path.dirname(model_folder), TOKENIZER_MODEL)
    versions = sorted(
        (int(v) for v in os.listdir(root) if v.isdigit()) if os.path.isdir(root) else ()
    )
    if not versions:
        raise pb_utils.TritonModelException(
            f"{root} has no version folder: {TOKENIZER_MODEL} must be in this repository"
        )
    return os.path.join(root, str(versions[-1]))


def invalid(message):
    return pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)


class TritonPythonModel:
    def initialize(self, args):
        self.splitter = passages.load(tokenizer_folder(args["model_repository"]))

    async def execute(self, requests):
        await asyncio.gather(*(self._answer(request) for request in requests))
        return None

    async def _answer(self, request):
        """Stream ``request``'s passages; whatever goes wrong ends it with an error."""
        sender = request.get_response_sender()
        try:
            await self._stream(request, sender)
        except Exception as exc:  # nothing raises once the final flag went
            error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)

    async def _stream(self, request, sender):
        """Send the passages' responses in order, the last with the final flag."""
        try:
            document, size, overlap = self._read(request)
        except pb_utils.TritonError as error:
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        # Off the event loop: a long document's tokenization would hold up other streams.
        loop = asyncio.get_running_loop()
        parts = await loop.run_in_executor(None, self.splitter.split, document, size, overlap)
        if not parts:
            sender.send(flags=FINAL)
            return
        calls = [asyncio.ensure_future(self._embed(p.text)) for p in parts[:LOOKAHEAD]]
        try:
            for part in parts:
                if request.is_cancelled():
                    error = pb_utils.TritonError(
                        "the request was cancelled", pb_utils.TritonError.CANCELLED
                    )
                    sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                    return
                answer = await calls[part.index]
                if part.index + LOOKAHEAD < len(parts):
                    calls.append(asyncio.ensure_future(self._embed(parts[len(calls)].text)))
                if answer.has_error():
                    sender.send(pb_utils.InferenceResponse(error=answer.error()), flags=FINAL)
                    return
                embedding = pb_utils.get_output_tensor_by_name(answer, "EMBEDDING").as_numpy()
                last = part.index == len(parts) - 1
                sender.send(self._response(part, len(parts), embedding), flags=FINAL if last else 0)
        finally:
            for call in calls:
                call.cancel()  # the ones not awaited: their answers are not wanted

    def _read(self, request):
        """The document, passage size and overlap, or the ``TritonError`` saying why not."""
        # The server checked every input's type and shape ([1]) against the config.
        text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
        try:
            document = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        except UnicodeDecodeError as exc:
            raise invalid(f"TEXT must be UTF-8: {exc}") from None
        size = self._count(request, "PASSAGE_TOKENS", DEFAULT_SIZE)
        overlap = self._count(request, "OVERLAP_TOKENS", size // 4)
        problem = self.splitter.bounds(size, overlap)
        if problem is not None:
            raise invalid(problem)
        return document, size, overlap

    @staticmethod
    def _count(request, name, default):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return default
        return int(tensor.as_numpy().reshape(-1)[0])

    async def _embed(self, text):
        """``text_embedding``'s answer for ``text`` (a response, its error included)."""
        call = pb_utils.InferenceRequest(
            model_name=EMBEDDING_MODEL,
            inputs=[pb_utils.Tensor("TEXT", np.array([[text.encode("utf-8")]], np.object_))],
            requested_output_names=["EMBEDDING"],
        )
        return await call.async_exec()

    @staticmethod
    def _response(part, count, embedding):
        def one(name, value, dtype):
            return pb_utils.Tensor(name, np.array([value], dtype))

        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("PASSAGE", np.array([part.text.encode("utf-8")], np.object_)),
                one("INDEX", part.index, np.int32),
                one("COUNT", count, np.int32),
                one("START", part.start, np.int64),
                one("END", part.end, np.int64),
                pb_utils.Tensor("EMBEDDING", embedding.reshape(-1).astype(np.float32)),
            ]
        )
