"""The machine's process table and listening TCP ports, read from /proc (Linux): which processes belong to a run
(its session, or a command line naming one of its folders) and which ports they listen on. Read-only: other servers
run on this machine, and only a run's own processes may be stopped."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    pid: int
    state: str  # /proc/<pid>/stat's state letter: Z is a zombie (ended, not yet reaped by its parent)
    session: int
    command: str  # the command line, spaces between arguments
    parent: int = 0
    start: int = 0  # clock ticks after boot: with the pid, which process it is (pids recur)

    def __str__(self) -> str:
        return f"{self.pid} {self.command[:120]}"


def read(pid: int) -> Proc | None:
    """The process `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ... starttime
    return Proc(pid, fields[0], int(fields[3]), command or stat[stat.index("(") + 1:stat.rindex(")")],
                parent=int(fields[1]), start=int(fields[19]))


def processes() -> list[Proc]:
    return [p for p in (read(int(d)) for d in os.listdir("/proc") if d.isdigit()) if p is not None]


def of_run(session: int, marks: Iterable[str]) -> list[Proc]:
    """Every process in `session` (the launcher's: it was started as a session leader), or whose command line names
    one of `marks` (the run's folders: a process that left the session still names them); never this one."""
    marks = [m for m in marks if m]
    return [p for p in processes() if p.pid != os.getpid()
            and (p.session == session or any(m in p.command for m in marks))]


def _socket_owners(pids: Iterable[int]) -> dict[str, int]:
    """socket inode -> pid, for the sockets `pids` hold open."""
    owners: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                owners[link[8:-1]] = pid
    return owners


def listening() -> dict[int, str]:
    """Every TCP port something listens on (IPv4 and IPv6), with its socket's inode."""
    ports: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                ports[int(fields[1].rsplit(":", 1)[1], 16)] = fields[9]
    return ports


def listening_ports(pids: Iterable[int]) -> dict[int, int]:
    """port -> pid, for the TCP ports `pids` listen on."""
    owners = _socket_owners(pids)
    return {port: owners[inode] for port, inode in listening().items() if inode in owners}


def port_owner(port: int) -> Proc | None:
    """The process listening on `port`, when there is one and it can be found."""
    inode = listening().get(port)
    if inode is None:
        return None
    owner = _socket_owners(int(d) for d in os.listdir("/proc") if d.isdigit()).get(inode)
    return read(owner) if owner is not None else None
