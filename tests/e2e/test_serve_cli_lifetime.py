"""What an operator types, on a head of its own: `ray start --head`, `serve run configs/local.yaml`, one scoring
request (exact against transformers), `serve shutdown`. Afterwards every actor the app created (replicas, the
deployment-scoped registries, Serve's controller and proxy) is DEAD in Ray's state API and none of their processes
is alive. The head is this test's alone: free ports, its own temp dir and no token file, stopped by ending its
`ray start --block` process; no other Ray on the machine is touched (never `ray stop`)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from ray.util.state.exception import RayStateApiException

from tests.helpers.reference import hf_scores
from tests.helpers.serve import alive, ids_of, score_body

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
# Every port `ray start --head` would otherwise take at its default (shared with other clusters on the machine).
PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port",
              "--node-manager-port", "--object-manager-port")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def actors(dashboard: str) -> list[dict[str, Any]]:
    """Every actor in Ray's state API, as `ray list actors --detail --address <dashboard>` lists them: the same
    client and the same dashboard endpoint, called in this process (each CLI call paid a Python start)."""
    from ray.util.state import list_actors

    return [dataclasses.asdict(a) for a in list_actors(address=dashboard, limit=1000, detail=True, timeout=60,
                                                       raise_on_missing_output=False)]


def wait_for(what: str, check: Any, timeout: float, proc: subprocess.Popen | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (httpx.HTTPError, subprocess.SubprocessError, RayStateApiException):
            pass
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process ended ({proc.returncode})")
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.5)


def test_serve_run_on_a_ray_start_head_then_shutdown_leaves_nothing(smollm2_path: Path) -> None:
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    (http_port,) = free_ports(1)
    temp = Path(tempfile.mkdtemp(prefix="rscli", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    config = yaml.safe_load((REPO / "configs/local.yaml").read_text())
    config["http_options"]["port"] = http_port  # configs/local.yaml, on a port of its own
    (temp / "local.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # No read or write of ~/.ray/auth_token; the loopback switch tests/conftest.py sets, so the head binds 127.0.0.1
    # (and its PYTHONPATH, for tests/loopback_site/).
    # RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0: on SIGTERM a `ray start --block` head first drains itself for up to
    # 30 s (for a Kubernetes pod whose proxies still route to it); a lone head never finishes draining, and by then
    # the app is shut down, so the test's head stops at once (the test is about what `serve shutdown` leaves).
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]]), RAY_AUTH_MODE="disabled",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    gcs, dashboard = f"127.0.0.1:{ports['--port']}", f"http://127.0.0.1:{ports['--dashboard-port']}"
    started = time.monotonic()
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", "--num-cpus", "4",
                             "--temp-dir", str(temp), "--include-dashboard", "true", "--node-ip-address", "127.0.0.1",
                             "--dashboard-host", "127.0.0.1", *(f"{k}={v}" for k, v in ports.items())],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    run = None
    try:
        wait_for("the head's dashboard", lambda: httpx.get(dashboard + "/api/version", timeout=5).is_success, 120,
                 head)
        run = subprocess.Popen([str(BIN / "serve"), "run", str(temp / "local.yaml")], cwd=REPO,
                               env={**env, "RAY_ADDRESS": gcs}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        url = f"http://127.0.0.1:{http_port}"
        wait_for("/health", lambda: httpx.get(url + "/health", timeout=10).status_code == 200, 300, run)
        ids = ids_of(24, 11)
        r = httpx.post(url + "/generate", json=score_body(ids, 0), timeout=120)
        assert r.status_code == 200, r.text
        rows = r.json()["meta_info"]["input_token_logprobs"]
        assert max(abs(v - e) for (v, _), e in zip(rows, hf_scores(smollm2_path, ids, 0), strict=True)) < 1e-4

        created = [a for a in actors(dashboard) if a["state"] == "ALIVE"]
        names = {a.get("name") or a["class_name"] for a in created}
        assert any("EngineWorker" in n for n in names) and any("Ingress" in n for n in names), names
        pids = {a["actor_id"]: a["pid"] for a in created}
        print(f"up and exact {time.monotonic() - started:.0f} s after `ray start`")
        t0 = time.monotonic()
        subprocess.run([str(BIN / "serve"), "shutdown", "-y", "-a", dashboard], env=env, check=True, timeout=120,
                       capture_output=True)
        print(f"`serve shutdown` took {time.monotonic() - t0:.1f} s")

        def all_gone() -> bool:
            states = {a["actor_id"]: a["state"] for a in actors(dashboard)}
            return all(states.get(i) == "DEAD" for i in pids) and not any(alive(p) for p in pids.values())

        t0 = time.monotonic()
        wait_for(f"every actor of the app DEAD and its processes gone: {names}", all_gone, 120)
        print(f"serve shutdown: {len(pids)} actors DEAD, their processes gone, {time.monotonic() - t0:.1f} s: "
              f"{sorted(names)}")
    finally:
        for proc in (run, head):  # ours only: each started in a session of its own
            if proc is not None and proc.poll() is None:
                t0 = time.monotonic()
                os.killpg(proc.pid, signal.SIGINT if proc is run else signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
                print(f"{'serve run' if proc is run else 'ray start'} ended {time.monotonic() - t0:.1f} s after its "
                      "signal")
    leftover = subprocess.run(["pgrep", "-f", str(temp)], capture_output=True, text=True).stdout.split()
    assert not leftover, f"processes of the test's head left: {leftover}"
    shutil.rmtree(temp, ignore_errors=True)
