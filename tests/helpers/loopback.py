"""Tests touch nothing but loopback: every process the test session starts listens on 127.0.0.1 (or ::1) only.

tests/conftest.py gives the session a mark in the environment (SESSION_ENV, inherited by every process the session
starts however deep: `ray start` heads, Ray's GCS, raylets and workers, Serve's proxies, HAProxy, subprocesses, even
once re-parented away from pytest) and runs a `ListenGuard` for the whole session: every `interval_s` it lists the
TCP sockets in LISTEN state of the processes that carry the mark (and of pytest itself) and keeps any bound beyond
loopback, with the test that was running; the session fails at its end if it kept one. Processes of other sessions on
the machine carry another mark (or none) and are never looked at."""

from __future__ import annotations

import ipaddress
import os
import threading
from dataclasses import dataclass

import psutil

SESSION_ENV = "RAYSCORE_TEST_SESSION"


@dataclass(frozen=True)
class Listener:
    pid: int
    name: str
    address: str
    test: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.name}) listens on {self.address}, seen during {self.test or 'set-up'}"


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1 and IPv4-mapped loopback (::ffff:127.0.0.1, how a dual-stack socket shows 127.0.0.1)."""
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def beyond_loopback(session: str, test: str = "") -> list[Listener]:
    """LISTEN sockets not on loopback, of this process and of every process whose environment has `session` as
    SESSION_ENV (a process's starting environment: /proc/<pid>/environ)."""
    found: list[Listener] = []
    me = os.getpid()
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and proc.environ().get(SESSION_ENV) != session:
                continue
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and not is_loopback(conn.laddr.ip):
                    found.append(Listener(proc.pid, proc.name(), f"{conn.laddr.ip}:{conn.laddr.port}", test))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone, or not ours to read: a process of this session is ours, and is read
    return found


class ListenGuard:
    """A background thread that samples `beyond_loopback` every `interval_s` until `stop()`; `found` keeps each
    (process name, address) once, with the first test it was seen during."""

    def __init__(self, session: str, interval_s: float = 1.0) -> None:
        self.session = session
        self.interval_s = interval_s
        self.test = ""  # the running test's id, set by the conftest hook
        self.found: dict[tuple[str, str], Listener] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="listen-guard", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> None:
        for listener in beyond_loopback(self.session, self.test):
            self.found.setdefault((listener.name, listener.address), listener)

    def stop(self) -> list[Listener]:
        self._stop.set()
        self._thread.join()
        self.sample()
        return list(self.found.values())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()
