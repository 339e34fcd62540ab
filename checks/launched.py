"""The app as `make serve` starts it (deploy/launch.py: the HAProxy front door where it runs), for tools that need a
real server: on a copy of a config with a free port, HAProxy's files and ports in a private folder (other servers may
run on this machine), the launcher in a process group of its own; stopped as an operator stops `make serve`, Ctrl-C
(SIGINT) or a supervisor's SIGTERM to that group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config: Path, run_dir: Path, overrides: dict[str, object]) -> tuple[subprocess.Popen, str]:
    """The launcher on a copy of `config` in `run_dir` with a free port and `overrides` in its app's args, its output
    in the run's serve.log there, started and not waited for; its base URL."""
    from deploy.front_door import private_haproxy_files

    port = free_port()
    data = yaml.safe_load(config.read_text())
    data.setdefault("http_options", {})["port"] = port
    data["applications"][0].setdefault("args", {}).update(overrides)
    copy = run_dir / "serve.yaml"
    copy.write_text(yaml.safe_dump(data))
    env = {**os.environ, **private_haproxy_files(str(run_dir), free_port(), free_port())}
    env.pop("RAY_ADDRESS", None)
    log = open(run_dir / "serve.log", "w")  # noqa: SIM115  # the launcher's output, for after the run
    proc = subprocess.Popen([sys.executable, "-m", "deploy.launch", str(copy), "--metrics-export-port",
                             str(free_port())], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(proc: subprocess.Popen, url: str, run_dir: Path, timeout_s: float = 600.0) -> None:
    """Back when /health says ok; RuntimeError when the launcher exited, TimeoutError after `timeout_s` (the launcher
    still running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}); see {run_dir / 'serve.log'}")
        try:
            if httpx.get(url + "/health", timeout=5).json().get("status") == "ok":
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(2)
    raise TimeoutError(f"the server was not healthy within {timeout_s:g} s; see {run_dir / 'serve.log'}")


def start(config: Path, run_dir: Path, overrides: dict[str, object],
          timeout_s: float = 600.0) -> tuple[subprocess.Popen, str]:
    """launch, then wait_healthy; a launcher that does not get healthy is stopped before the error is raised."""
    proc, url = launch(config, run_dir, overrides)
    try:
        wait_healthy(proc, url, run_dir, timeout_s)
    except BaseException:
        stop(proc)
        raise
    return proc, url


def stop(proc: subprocess.Popen, signum: int = signal.SIGINT, timeout_s: float = 120.0) -> bool:
    """`signum` to the launcher's process group, as Ctrl-C (or a supervisor) stops `make serve`; SIGKILL to the group
    if the launcher has not ended within `timeout_s`. Whether it ended on `signum` alone."""
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout_s)
        return True
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(30)
        return False
