"""A client for conch's job routes, built on the stock tritonclient.

tritonclient has no job API. This sends the very body ``InferenceServerClient.infer``
would send and reads results into tritonclient's own ``InferResult``, so code written
for infer moves to async jobs by changing one call::

    jobs = JobClient("127.0.0.1:8000")
    job = jobs.submit("mlp", [x])
    result = jobs.result(job, wait=30)   # an InferResult: result.as_numpy("OUTPUT0")
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

__all__ = ["JobClient", "JobPending"]


class JobPending(InferenceServerException):
    """The job has not finished yet (``result`` with no or too short a ``wait``)."""


class JobClient:
    def __init__(
        self,
        url: str = "127.0.0.1:8000",
        *,
        network_timeout: float = 120.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        """``headers`` go with every call: e.g. the header a gateway started with
        ``--http-restricted-api jobs,batch:<header>=<value>`` needs."""
        self.base = url if "://" in url else f"http://{url}"
        self.network_timeout = network_timeout
        self.headers = dict(headers or {})

    def submit(
        self,
        model: str,
        inputs: list[httpclient.InferInput],
        outputs: list[httpclient.InferRequestedOutput] | None = None,
        *,
        model_version: str = "",
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        timeout: int | None = None,
    ) -> str:
        """Queue an infer request as an async job; its id. ``timeout`` is in µs, as infer's."""
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            inputs, outputs=outputs, request_id=request_id, parameters=parameters, timeout=timeout
        )
        headers = {} if json_size is None else {"Inference-Header-Content-Length": str(json_size)}
        _, doc = self._call("POST", f"{self._model(model, model_version)}/jobs", body, headers)
        return json.loads(doc)["id"]

    def submit_batch(
        self, model: str, input_uri: str, output_uri: str, *, model_version: str = ""
    ) -> str:
        """Start an offline batch job (JSONL of infer requests in S3); its id."""
        body = json.dumps({"input": input_uri, "output": output_uri}).encode()
        headers = {"Content-Type": "application/json"}
        _, doc = self._call("POST", f"{self._model(model, model_version)}/batch", body, headers)
        return json.loads(doc)["id"]

    def status(self, job_id: str) -> dict[str, Any]:
        return json.loads(self._call("GET", f"/v2/jobs/{job_id}")[1])

    def cancel(self, job_id: str) -> dict[str, Any]:
        return json.loads(self._call("DELETE", f"/v2/jobs/{job_id}")[1])

    def result(self, job_id: str, *, wait: float = 0.0) -> httpclient.InferResult:
        """The job's infer result, waiting up to ``wait`` seconds (at most 60) for it.

        Raises ``JobPending`` when it has not finished, and tritonclient's
        ``InferenceServerException`` (with the HTTP status) when it failed.
        """
        path = f"/v2/jobs/{job_id}/result" + (f"?wait={wait:g}" if wait else "")
        response, body = self._call("GET", path)
        if response.status == 202:
            raise JobPending(f"job {job_id} has not finished", status="202")
        length = response.headers.get("Inference-Header-Content-Length")
        return httpclient.InferenceServerClient.parse_response_body(
            body,
            header_length=None if length is None else int(length),
            content_encoding=response.headers.get("Content-Encoding"),
        )

    # -- plumbing ------------------------------------------------------------------------
    @staticmethod
    def _model(model: str, version: str) -> str:
        return f"/v2/models/{model}" + (f"/versions/{version}" if version else "")

    def _call(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None
    ) -> tuple[Any, bytes]:
        req = urllib.request.Request(
            self.base + path, data=body, headers={**self.headers, **(headers or {})}, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=self.network_timeout) as response:
                return response, response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw)["error"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode(errors="replace") or exc.reason
            raise InferenceServerException(message, status=str(exc.code)) from None
