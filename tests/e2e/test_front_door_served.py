"""The header guard in front of Serve's Python proxy on the session's Serve instance, with raw sockets against
127.0.0.1: a header value that is not UTF-8 in a header Serve reads itself (the request timeout, the multiplexed
model id) was the proxy's plain-text 500; it is a 400 naming the header, and such an X-Request-ID is replaced (one id
in every answer). Headers beyond max_header_bytes are a 431, a path beyond max_url_bytes a 414, and valid values of
those headers are served as before."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlparse

import pytest

from tests.helpers.serve import shared_app, shared_name

# The session's shared one-worker app (tests/helpers/serve.py: shared_app): this module only sends requests to it.
PREFIX = "/" + shared_name(num_workers=1)


@pytest.fixture(scope="module")
def port(serve_url: str):
    shared_app(serve_url, num_workers=1)
    return urlparse(serve_url).port


def raw(port: int, head: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(head + b"Connection: close\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # answered and closed before all of it was sent
            pass
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        if not out:
            return 0, b"reset"
    return int(out.split(b" ", 2)[1]), out.partition(b"\r\n\r\n")[2]


GET = f"GET {PREFIX}/v1/models HTTP/1.1\r\nHost: t\r\n".encode()


@pytest.mark.parametrize("name", [b"x-request-timeout-seconds", b"serve_multiplexed_model_id",
                                  b"serve-multiplexed-model-id", b"traceparent"])
def test_non_utf8_serve_headers_are_a_400(port: int, name: bytes) -> None:
    status, body = raw(port, GET + name + b": \xff\xfe\x80abc\r\n")
    assert status == 400, body
    assert json.loads(body)["error"]["param"] == name.decode().lower()
    assert raw(port, GET + name + b": plain-value\r\n")[0] == 200


def test_an_oversized_path_is_a_414_in_json(port: int) -> None:
    status, body = raw(port, b"GET " + PREFIX.encode() + b"/" + b"a" * 60000 + b" HTTP/1.1\r\nHost: t\r\n")
    assert status == 414 and "`max_url_bytes`" in json.loads(body)["error"]["message"], body[:300]


def test_one_request_id_in_every_answer(port: int) -> None:
    """A client id with spaces or beyond ASCII is replaced by one made id, never echoed beside it."""
    for value, kept in ((b"plain-1", True), (b"has spaces", False), ("caf\u00e9 \u2603".encode(), False)):
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(GET + b"X-Request-ID: " + value + b"\r\nConnection: close\r\n\r\n")
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        lines = out.partition(b"\r\n\r\n")[0].split(b"\r\n")
        ids = [x.split(b":", 1)[1].strip() for x in lines[1:] if x.lower().startswith(b"x-request-id:")]
        assert b" 200 " in lines[0] and len(ids) == 1 and (ids[0] == value) == kept, (value, lines)


def test_headers_are_bounded(port: int) -> None:
    status, body = raw(port, GET + b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 8192) for i in range(128)))
    # The guard's 431, the proxy's own parser refusing first, or the connection reset while still sending.
    assert status in (0, 400, 431), body
    assert raw(port, GET + b"X-H: " + b"a" * 12000 + b"\r\n")[0] == 200
