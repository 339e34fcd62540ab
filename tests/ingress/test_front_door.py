"""The front door's guard (ingress/edge/front_door.py) on a real HTTP server on 127.0.0.1, driven with raw sockets:
in front of an app that decodes header values as Serve's proxy and direct ingress do (a byte that is not UTF-8 is
their 500), no header value produces a 5xx; oversized headers are a 431; Serve's /-/ routes need a key when keys
are set, the health probe excepted. The served case is tests/e2e/test_front_door_served.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from ingress.edge.front_door import KEY_HASHES_ENV, FrontDoorGuard, key_sha256, middlewares


async def serve_like(scope: Scope, receive: Receive, send: Send) -> None:
    """Serve's handling: every header value decoded as UTF-8 (an exception here is uvicorn's plain-text 500)."""
    if scope["type"] != "http":
        return
    decoded = {k.decode(): v.decode() for k, v in scope["headers"]}
    body = json.dumps({"path": scope["path"], "request_id": decoded.get("x-request-id")}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(app) -> Iterator[int]:  # noqa: ANN001
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                           h11_max_incomplete_event_size=2 * 1024 * 1024))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def guarded() -> Iterator[int]:
    # k-1 from the environment, k-2 from an app config (the launcher passes its digest only).
    (mw,) = middlewares({"RAYSCORE_API_KEYS": "k-1", "RAYSCORE_MAX_HEADER_BYTES": "16384",
                         "RAYSCORE_MAX_URL_BYTES": "8192", KEY_HASHES_ENV: key_sha256("k-2")})
    yield from _serve(FrontDoorGuard(serve_like, **mw.kwargs))


@pytest.fixture(scope="module")
def bare() -> Iterator[int]:
    yield from _serve(serve_like)


def raw(port: int, head: bytes) -> tuple[int, bytes]:
    """Send a request head as bytes; the status code and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + b"\r\n")
        out = b""
        while b"\r\n\r\n" not in out or len(out.partition(b"\r\n\r\n")[2]) < _length(out):
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    status = int(out.split(b" ", 2)[1])
    return status, out.partition(b"\r\n\r\n")[2]


def _length(out: bytes) -> int:
    for line in out.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


GET = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
SERVE_READS = [b"X-Request-ID", b"x-request-timeout-seconds", b"serve_multiplexed_model_id", b"traceparent",
               b"X-Session-ID", b"X-Anything"]


@pytest.mark.parametrize("name", [n for n in SERVE_READS if n != b"X-Request-ID"])
def test_a_header_that_is_not_utf8_is_a_400_naming_it(guarded: int, bare: int, name: bytes) -> None:
    head = GET + name + b": \xff\xfe\x80abc\r\n"
    assert raw(bare, head)[0] == 500  # what Serve's own decoding answers without the guard
    status, body = raw(guarded, head)
    error = json.loads(body)["error"]
    assert status == 400 and error["param"].lower() == name.decode().lower() and "UTF-8" in error["message"]


def _request_ids(port: int, head: bytes) -> tuple[int, list[bytes], str | None]:
    """Status, every X-Request-ID header of the answer, and the id the app behind the guard saw."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + b"\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    top, _, body = out.partition(b"\r\n\r\n")
    lines = top.split(b"\r\n")[1:]
    ids = [line.split(b":", 1)[1].strip() for line in lines if line.lower().startswith(b"x-request-id:")]
    text = body[body.find(b"{"):body.rfind(b"}") + 1]  # the JSON inside a chunked body
    return int(top.split(b" ", 2)[1]), ids, json.loads(text).get("request_id") if text else None


@pytest.mark.parametrize("value", [b"has spaces", "caf\u00e9 \u2603".encode(), b"\xff\xfe\x80", b"a" * 4000, b""])
def test_an_unacceptable_request_id_is_replaced_never_passed_on(guarded: int, value: bytes) -> None:
    """Serve echoes the id it reads: the guard hands it exactly one, the client's when short and plain, else a made
    one in its place (so no answer carries the client's raw value beside the server's)."""
    status, _, seen = _request_ids(guarded, GET + b"X-Request-ID: " + value + b"\r\n")
    assert status == 200 and seen is not None and seen.encode() != value and len(seen) == 32
    status, _, seen = _request_ids(guarded, GET + b"X-Request-ID: ok-id.1\r\nX-Request-ID: second\r\n")
    assert status == 200 and seen == "ok-id.1"


def test_the_guards_own_answers_carry_one_request_id(guarded: int) -> None:
    status, ids, _ = _request_ids(guarded, GET + b"X-Request-ID: mine-1\r\nX-A: \xff\r\n")
    assert status == 400 and ids == [b"mine-1"]
    status, ids, _ = _request_ids(guarded, GET + b"X-Request-ID: has space\r\nX-A: \xff\r\n")
    assert status == 400 and len(ids) == 1 and len(ids[0]) == 32


@pytest.mark.parametrize("value", [b"abc", b"\xc3\xa9t\xc3\xa9", b"", b"a" * 4000, b"-1", b"nan", b"1e309"])
def test_valid_values_pass(guarded: int, value: bytes) -> None:
    for name in SERVE_READS:
        assert raw(guarded, GET + name + b": " + value + b"\r\n")[0] == 200


def test_oversized_headers_are_a_431(guarded: int) -> None:
    head = GET + b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 8192) for i in range(128))  # 1 MiB
    status, body = raw(guarded, head)
    assert status == 431 and "`max_header_bytes`" in json.loads(body)["error"]["message"]
    assert raw(guarded, GET + b"X-H: " + b"a" * 15000 + b"\r\n")[0] == 200


def test_an_oversized_request_target_is_a_414(guarded: int, bare: int) -> None:
    """A 60,000-byte path (or query) gets our JSON 414 naming the limit (never the path), once the server has read
    the request; one at the limit is served."""
    for target in (b"/" + b"a" * 60000, b"/v1/models?" + b"q" * 9000):
        status, body = raw(guarded, b"GET " + target + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n")
        error = json.loads(body)["error"]
        assert status == 414 and "`max_url_bytes`" in error["message"] and "aaaa" not in error["message"]
    assert raw(guarded, b"GET /" + b"a" * 8191 + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n")[0] == 200
    assert raw(guarded, b"GET /" + b"a" * 8192 + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n")[0] == 414


def test_serve_routes_need_a_key_but_the_probe(guarded: int) -> None:
    routes = b"GET /-/routes HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
    assert raw(guarded, routes)[0] == 401
    assert raw(guarded, routes + b"Authorization: Bearer nope\r\n")[0] == 401
    assert raw(guarded, routes + b"Authorization: Bearer k-1\r\n")[0] == 200
    assert raw(guarded, routes + b"Authorization: Bearer k-2\r\n")[0] == 200
    assert raw(guarded, routes + b"Authorization: Bearer " + key_sha256("k-2").encode() + b"\r\n")[0] == 401
    assert raw(guarded, b"GET /-/healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n")[0] == 200
    assert raw(guarded, GET)[0] == 200  # the app's own routes: the ingress checks their keys


def test_without_keys_serve_routes_stay_open() -> None:
    (mw,) = middlewares({})
    assert mw.kwargs["api_keys"] == () and mw.kwargs["key_hashes"] == () and mw.kwargs["max_header_bytes"] == 16384
    assert mw.kwargs["max_url_bytes"] == 8192
