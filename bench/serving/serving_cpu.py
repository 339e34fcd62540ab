"""CPU time of the serving processes, per role, read with psutil: where an HTTP request's CPU goes.

The processes are found among this process's descendants (the local Ray that `ray.init` started here), by the
title Ray gives each actor (`ray::ProxyActor`, `ray::ServeReplica:<app>:Ingress`, ...), so another Ray on the same
machine is never counted. A worker replica's threads are split by name (/proc/<pid>/task/<tid>/comm): its engine
thread, torch's compute threads and Ray's own threads show there separately.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# Title fragment -> role. Order matters: the first fragment found names the process. Behind HAProxy the proxy role
# is Ray's HAProxy manager actor and the HAProxy process it runs (`<binary> -db -f <config>`, deploy/front_door.py).
ROLES = (("ProxyActor", "proxy"), ("HAProxyManager", "proxy"), ("haproxy -db -f", "proxy"),
         ("ServeController", "controller"), (":Ingress", "ingress"),
         (":EngineWorker", "worker"), ("raylet", "raylet"), ("gcs_server", "gcs"))


def role_of(title: str, app: str | None = None) -> str | None:
    """The role of a process by its title; replicas of apps other than `app` (when given) are None."""
    for fragment, role in ROLES:
        if fragment in title:
            if role in ("ingress", "worker") and app is not None and f":{app}:" not in title:
                return None
            return role
    return None


def _title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _cpu_s(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0.0


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads, summed by thread name (Linux only; {} elsewhere)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            # stat: "tid (comm) state ..." fields 14, 15 (utime, stime) counted after the closing parenthesis.
            rest = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[name] = out.get(name, 0.0) + (int(rest[11]) + int(rest[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return out


@dataclass
class Snapshot:
    by_role: dict[str, float] = field(default_factory=dict)  # CPU seconds
    worker_threads: dict[str, float] = field(default_factory=dict)

    def minus(self, earlier: Snapshot) -> Snapshot:
        return Snapshot({k: v - earlier.by_role.get(k, 0.0) for k, v in self.by_role.items()},
                        {k: v - earlier.worker_threads.get(k, 0.0) for k, v in self.worker_threads.items()})


def snapshot(app: str | None = None, include_self: bool = True) -> Snapshot:
    """CPU seconds so far of each role of this process tree (replicas of `app` only, when given); `client` is this
    process itself (the bench's HTTP clients, or the in-process engine)."""
    me = psutil.Process()
    snap = Snapshot()
    if include_self:
        snap.by_role["client"] = _cpu_s(me)
    for proc in me.children(recursive=True):
        role = role_of(_title(proc), app)
        if role is None:
            continue
        snap.by_role[role] = snap.by_role.get(role, 0.0) + _cpu_s(proc)
        if role == "worker":
            for name, s in thread_cpu_s(proc.pid).items():
                snap.worker_threads[name] = snap.worker_threads.get(name, 0.0) + s
    return snap


def per_request_ms(delta: Snapshot, requests: int, roles: Iterable[str] | None = None) -> dict[str, float]:
    """CPU milliseconds per request of each role (all roles when None)."""
    keys = list(roles) if roles is not None else list(delta.by_role)
    return {k: 1e3 * delta.by_role.get(k, 0.0) / requests for k in keys}


def pids(app: str, roles: Iterable[str] = ("proxy", "ingress", "worker")) -> dict[str, int]:
    """role -> pid of this process tree's serving processes for `app` (the first found of each role)."""
    wanted = set(roles)
    out: dict[str, int] = {}
    for proc in psutil.Process().children(recursive=True):
        role = role_of(_title(proc), app)
        if role in wanted and role not in out:
            out[role] = proc.pid
    return out
