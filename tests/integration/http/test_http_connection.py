"""HTTP/1.1 on the wire for infer calls, which the gateway's worker answers without WSGI.

Keep-alive, ``Connection: close``, HTTP/1.0, ``Expect: 100-continue`` and the metrics
port, byte for byte over raw sockets; and the same answers from the plain WSGI path
(gunicorn's gthread worker), which shares the data plane. Requests gunicorn's parser
refuses (too long, too large, malformed) get Triton's JSON error on both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from harness import (
    connect,
    read_response,
    reference_mlp,
    start_gateway,
    start_worker,
    wait_model_ready,
)


@pytest.fixture(scope="module")
def services(model_repo: Path, redis_url: str, log_dir: Path) -> Iterator[dict[str, str]]:
    worker = start_worker(model_repo, redis_url, log_dir, "--models", "mlp")
    gevent_gw, gevent_url = start_gateway(model_repo, redis_url, log_dir)
    wsgi_gw, wsgi_url = start_gateway(
        model_repo, redis_url, log_dir, env={"CONCH_HTTP_WORKER_CLASS": "gthread"}
    )
    try:
        for url in (gevent_url, wsgi_url):
            wait_model_ready(url, "mlp", 90, worker, gevent_gw, wsgi_gw)
        yield {
            "gevent": gevent_url,
            "wsgi": wsgi_url,
            "metrics": gevent_gw.metrics_url,
        }
    finally:
        gevent_gw.stop()
        wsgi_gw.stop()
        worker.stop()


def _body(x: np.ndarray) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}
            ]
        }
    ).encode()


def _request(body: bytes, *, version: str = "1.1", headers: str = "") -> bytes:
    return (
        f"POST /v2/models/mlp/infer HTTP/{version}\r\nHost: test\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
    ).encode() + body


def _outputs(body: bytes) -> np.ndarray:
    out = json.loads(body)["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


@pytest.mark.parametrize("server", ["gevent", "wsgi"])
def test_keep_alive_serves_several_requests_on_one_connection(
    services: dict[str, str], server: str
) -> None:
    xs = [np.random.default_rng(i).standard_normal((1 + i, 64), dtype=np.float32) for i in range(3)]
    with connect(services[server]) as sock:
        buf = bytearray()
        sock.sendall(b"".join(_request(_body(x)) for x in xs))  # pipelined, too
        for x in xs:
            status, headers, body = read_response(sock, buf)
            assert status == "HTTP/1.1 200 OK", body
            assert headers["connection"] == "keep-alive"
            assert headers["content-type"] == "application/json"
            assert "date" in headers
            np.testing.assert_allclose(_outputs(body), reference_mlp(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("version", "headers"), [("1.1", "Connection: close\r\n"), ("1.0", "")], ids=["close", "1.0"]
)
def test_connection_closes_when_the_client_asks(
    services: dict[str, str], version: str, headers: str
) -> None:
    x = np.ones((1, 64), np.float32)
    with connect(services["gevent"]) as sock:
        buf = bytearray()
        sock.sendall(_request(_body(x), version=version, headers=headers))
        status, got, body = read_response(sock, buf)
        assert status == f"HTTP/{version} 200 OK", body
        assert got["connection"] == "close"
        assert sock.recv(1) == b""  # the server closed its end


@pytest.mark.parametrize("server", ["gevent", "wsgi"])
def test_a_chunked_body_is_read_whole(services: dict[str, str], server: str) -> None:
    x = np.random.default_rng(5).standard_normal((3, 64), dtype=np.float32)
    body = _body(x)
    chunks = b"".join(
        f"{len(body[i : i + 500]):x}\r\n".encode() + body[i : i + 500] + b"\r\n"
        for i in range(0, len(body), 500)
    )
    head = (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: test\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    with connect(services[server]) as sock:
        buf = bytearray()
        sock.sendall(head + chunks + b"0\r\n\r\n")
        status, _, got = read_response(sock, buf)
        assert status == "HTTP/1.1 200 OK", got
        np.testing.assert_allclose(_outputs(got), reference_mlp(x), rtol=1e-4, atol=1e-5)


def test_expect_100_continue_gets_the_interim_response(services: dict[str, str]) -> None:
    x = np.ones((2, 64), np.float32)
    body = _body(x)
    with connect(services["gevent"]) as sock:
        buf = bytearray()
        head = _request(b"", headers="Expect: 100-continue\r\n").replace(
            b"Content-Length: 0", f"Content-Length: {len(body)}".encode()
        )
        sock.sendall(head)
        status, _, _ = read_response(sock, buf)
        assert status == "HTTP/1.1 100 Continue"
        sock.sendall(body)
        status, _, got = read_response(sock, buf)
        assert status == "HTTP/1.1 200 OK", got
        np.testing.assert_allclose(_outputs(got), reference_mlp(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("server", ["gevent", "wsgi"])
def test_errors_are_tritons_on_both_paths(services: dict[str, str], server: str) -> None:
    url = f"http://{services[server]}/v2/models"
    r = requests.post(f"{url}/mlp/infer", data=b"{not json", timeout=30)
    assert r.status_code == 400 and "error" in r.json()
    r = requests.post(f"{url}/nope/infer", data=_body(np.ones((1, 64), np.float32)), timeout=30)
    assert r.status_code == 400 and "nope" in r.json()["error"]
    r = requests.post(f"{url}/..%2Fmlp/infer", data=b"{}", timeout=30)  # decoded: has a "/"
    assert r.status_code == 404
    # The stock client over either path.
    client = httpclient.InferenceServerClient(services[server])
    x = np.ones((1, 64), np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("mlp", [inp]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, reference_mlp(x), rtol=1e-4, atol=1e-5)


def test_the_metrics_port_does_not_serve_infer(services: dict[str, str]) -> None:
    r = requests.post(
        f"http://{services['metrics']}/v2/models/mlp/infer",
        data=_body(np.ones((1, 64), np.float32)),
        timeout=30,
    )
    assert r.status_code == 404


def test_other_requests_share_a_connection_with_infer_calls(services: dict[str, str]) -> None:
    """Plain infer calls are read by the gateway's own loop and the rest by gunicorn's
    parser; one keep-alive connection passes between the two, pipelined bytes and all."""
    x = np.random.default_rng(7).standard_normal((2, 64), dtype=np.float32)
    ready = b"GET /v2/models/mlp/ready HTTP/1.1\r\nHost: test\r\n\r\n"
    chunked = (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(_body(x)):x}\r\n".encode()
        + _body(x)
        + b"\r\n0\r\n\r\n"
    )
    stream = _request(_body(x)) + ready + chunked + _request(_body(x)) + ready
    with connect(services["gevent"]) as sock:
        buf = bytearray()
        sock.sendall(stream)  # all five at once
        for kind in ("infer", "ready", "infer", "infer", "ready"):
            status, headers, body = read_response(sock, buf)
            assert status == "HTTP/1.1 200 OK", (kind, body)
            assert headers["connection"] == "keep-alive"
            if kind == "infer":
                np.testing.assert_allclose(_outputs(body), reference_mlp(x), rtol=1e-4, atol=1e-5)
        # A request that arrives a byte at a time is read whole.
        for byte in _request(_body(x)):
            sock.send(bytes([byte]))
        status, _, body = read_response(sock, buf)
        assert status == "HTTP/1.1 200 OK", body
        np.testing.assert_allclose(_outputs(body), reference_mlp(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("server", ["gevent", "wsgi"])
def test_answers_without_a_body_are_sent(services: dict[str, str], server: str) -> None:
    """HEAD, and OPTIONS (which Flask answers itself), give the app no body to write: the
    status line and headers still go out, and the connection serves the next request."""
    with connect(services[server]) as sock:
        buf = bytearray()
        sock.sendall(b"HEAD /v2 HTTP/1.1\r\nHost: test\r\n\r\n")
        status, headers, _ = read_response(sock, buf, to_head=True)
        assert status == "HTTP/1.1 200 OK"
        assert headers["content-type"] == "application/json"
        sock.sendall(b"OPTIONS /v2/models/mlp/infer HTTP/1.1\r\nHost: test\r\n\r\n")
        status, headers, body = read_response(sock, buf)
        assert status == "HTTP/1.1 200 OK" and body == b""
        assert {m.strip() for m in headers["allow"].split(",")} == {"OPTIONS", "POST"}
        sock.sendall(_request(_body(np.ones((1, 64), np.float32))))
        status, headers, body = read_response(sock, buf)
        assert status == "HTTP/1.1 200 OK", body
        assert headers["connection"] == "keep-alive"


@pytest.mark.parametrize("server", ["gevent", "wsgi"])
def test_a_file_body_comes_after_its_headers(services: dict[str, str], server: str) -> None:
    """A file answer (the docs page's style sheet) is sent from its descriptor, not
    written by the app: its status line and headers still come first, and the connection
    then serves the next request."""
    with connect(services[server]) as sock:
        buf = bytearray()
        sock.sendall(b"GET /v2/docs/swagger-ui.css HTTP/1.1\r\nHost: test\r\n\r\n")
        status, headers, body = read_response(sock, buf)
        assert status == "HTTP/1.1 200 OK", body[:200]
        assert headers["content-type"].startswith("text/css")
        assert len(body) == int(headers["content-length"]) > 1000
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: test\r\n\r\n")
        status, _, body = read_response(sock, buf)
        assert status == "HTTP/1.1 200 OK" and json.loads(body)["name"] == "conch"


def test_odd_or_oversized_infer_calls_get_a_clear_400(services: dict[str, str]) -> None:
    body = _body(np.ones((1, 64), np.float32))
    # A malformed header line: gunicorn's strict parser answers it.
    with connect(services["gevent"]) as sock:
        sock.sendall(_request(body, headers="Bad Header: x\r\n"))
        status, _, _ = read_response(sock, bytearray())
        assert status.startswith("HTTP/1.1 400"), status
    # Two different lengths: request smuggling's shape, refused, never guessed.
    with connect(services["gevent"]) as sock:
        sock.sendall(_request(body, headers="Content-Length: 5\r\n"))
        status, _, _ = read_response(sock, bytearray())
        assert status.startswith("HTTP/1.1 400"), status
    # A body over --http-max-input-size: Triton's error, and the connection closes
    # without the body being read.
    with connect(services["gevent"]) as sock:
        buf = bytearray()
        sock.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 999999999999\r\n\r\n"
        )
        status, headers, got = read_response(sock, buf)
        assert status == "HTTP/1.1 400 Bad Request"
        assert "--http-max-input-size" in json.loads(got)["error"]
        assert headers["connection"] == "close"
        assert sock.recv(1) == b""


_HEADERS_OVER_THE_COUNT = b"".join(b"X-H%d: 1\r\n" % i for i in range(120))  # gunicorn: 100


@pytest.mark.parametrize("server", ["gevent", "wsgi"])
@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /v2/models/" + b"m" * 5000 + b"/ready HTTP/1.1\r\nHost: t\r\n\r\n", 414),
        # An infer call in the plain form, but a request line over gunicorn's limit: the
        # gevent worker's own loop leaves it to gunicorn, so both paths answer alike.
        (
            b"POST /v2/models/" + b"m" * 5000 + b"/infer HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            414,
        ),
        (b"GET /v2/health/live HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"GET /v2/health/live HTTP/1.1\r\n" + _HEADERS_OVER_THE_COUNT + b"\r\n", 431),
        (b"GET /v2/health/live HTTP/1.1\r\nBad Header: x\r\n\r\n", 400),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
    ],
    ids=["long-uri", "long-infer-uri", "big-header", "many-headers", "bad-header", "garbage"],
)
def test_requests_gunicorn_refuses_get_tritons_json(
    services: dict[str, str], server: str, raw: bytes, status: int
) -> None:
    with connect(services[server]) as sock:
        sock.sendall(raw)
        line, headers, body = read_response(sock, bytearray())
        assert line.startswith(f"HTTP/1.1 {status} "), (line, body)
        assert headers["content-type"] == "application/json"
        assert set(json.loads(body)) == {"error"}, body
        assert headers["connection"] == "close"
        assert sock.recv(1) == b""
    # The worker that refused it still serves.
    assert requests.get(f"http://{services[server]}/v2/health/live", timeout=30).ok
