"""The listen guard tests/conftest.py runs over the whole session (tests/helpers/loopback.py): it finds a process of
the session listening beyond loopback, and only those. The processes here carry a mark of their own, not the
session's, so the session's guard does not count the one that listens on every interface on purpose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests.helpers.loopback import SESSION_ENV, ListenGuard, beyond_loopback, is_loopback

LISTEN = "import socket, sys, time; s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(); " \
         "print(s.getsockname()[1], flush=True); time.sleep(120)"


@pytest.fixture
def listener() -> Iterator:
    """Starts `python -c LISTEN host` under a session mark; yields a function (host, mark) -> its port (the process:
    `procs[-1]`)."""
    procs: list[subprocess.Popen] = []

    def start(host: str, mark: str) -> int:
        proc = subprocess.Popen([sys.executable, "-c", LISTEN, host], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, SESSION_ENV: mark})
        procs.append(proc)
        return int(proc.stdout.readline())

    start.procs = procs  # type: ignore[attr-defined]
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("ip", "loopback"), [
    ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("::ffff:127.0.0.1", True),  # as dual-stack shows it
    ("0.0.0.0", False), ("::", False), ("192.0.2.2", False), ("fe80::1%eth0", False),
])
def test_loopback_addresses(ip: str, loopback: bool) -> None:
    assert is_loopback(ip) is loopback


def test_finds_a_marked_process_listening_beyond_loopback_and_nothing_else(listener) -> None:
    mark, other = uuid.uuid4().hex, uuid.uuid4().hex
    wide = listener("0.0.0.0", mark)
    listener("127.0.0.1", mark)  # loopback: fine
    listener("0.0.0.0", other)  # another session's: never looked at
    found = beyond_loopback(mark, test="this test")
    assert [(f.address, f.test) for f in found] == [(f"0.0.0.0:{wide}", "this test")], found


def test_the_guard_keeps_what_it_sampled_after_the_process_ended(listener) -> None:
    mark = uuid.uuid4().hex
    guard = ListenGuard(mark, interval_s=0.1)
    guard.start()
    port = listener("0.0.0.0", mark)
    guard.sample()
    listener.procs[-1].kill()
    listener.procs[-1].wait()
    assert [f.address for f in guard.stop()] == [f"0.0.0.0:{port}"]


def test_serve_grpc_binds_on_every_interface_go_to_loopback_in_a_session_process() -> None:
    """tests/loopback_site/sitecustomize.py, as a process the session starts runs it: Ray Serve's two gRPC binds on
    "[::]" land on loopback; an explicit address is kept."""
    from tests.loopback_site.sitecustomize import on_loopback

    assert [on_loopback(a) for a in ("[::]:0", "0.0.0.0:9000", "10.1.2.3:5", "127.0.0.1:7")] == \
        ["localhost:0", "localhost:9000", "10.1.2.3:5", "127.0.0.1:7"]
    probe = ("import grpc, json, psutil; from concurrent import futures; "
             "from ray.serve._private.replica import add_port_to_grpc_server; "
             "from ray.serve._private.default_impl import add_grpc_address; "
             "s = grpc.server(futures.ThreadPoolExecutor(1)); add_port_to_grpc_server(s, '[::]:0'); s.start(); "
             "print(add_grpc_address.__name__, json.dumps(sorted({c.laddr.ip for c in "
             "psutil.Process().net_connections('tcp') if c.status == 'LISTEN'})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, SESSION_ENV: uuid.uuid4().hex}).stdout.split("\n")[-2]
    name, ips = out.split(" ", 1)
    assert name == "bind_on_loopback" and json.loads(ips) and all(map(is_loopback, json.loads(ips))), out
