"""Start and stop every shipped Serve config twice in a row, with a reload in between, as an operator does, and
what each run leaves behind: nothing of the app may outlive it, processes and listening ports included.

    python -m checks.config_lifetime [--config configs/local.yaml ...] [--rounds 2] [--step-timeout-s 600]

Per config (default: every configs/*.yaml with `applications`), --rounds times in a row:
1. start: the launcher as `make serve` runs it (checks/launched.py: deploy/launch.py on a copy of the config with free
   ports, HAProxy's files private to the run), until /health says ok; one scoring request (200, a logprob per token);
2. reload: `serve deploy` of the same config with one `args` field changed (max_batch_items + 1: Serve rebuilds the
   app, every replica restarts, and Ray starts HAProxy again with `-sf`), until the app is RUNNING again with more
   HAProxy processes recorded by the shim than before; a second scoring request;
3. stop: SIGINT to the launcher's process group (Ctrl-C) in odd rounds, SIGTERM (a supervisor) in even ones, until
   the launcher ends (SIGKILL after --step-timeout-s, a failure);
4. what is left once the launcher ended (up to 30 s for the rest to go, zombies reaped included): processes of the
   run (its session, or a command line naming its HAProxy folder or its Ray session) and ports the run listened on
   that still listen. Those processes are the run's own: they are then killed so the next round starts clean, and
   the round fails.
A config whose workers ask for GPUs runs on CPU where there are none, its device fields overridden (the table says so).
Each step is bounded by --step-timeout-s. Prints a table and one JSON line; exit status 1 when a round failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from checks import process_table
from checks.launched import launch, stop, wait_healthy

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
KEY = "k-lifetime"  # cluster.yaml binds 0.0.0.0 and starts only with keys; every run gets this one
# What a config whose workers ask for GPUs runs with on a machine without one: the same app on CPU, small.
CPU_FIT: dict[str, Any] = {"device": "cpu", "dtype": "float32", "worker_num_gpus": 0, "worker_num_cpus": 0.5,
                           "ingress_num_cpus": 0.2, "kv_cache_mb": 256, "num_threads": 1}
SETTLE_S = 30.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Round:
    config: str
    round: int
    signal: str
    fitted: bool = False  # run on CPU with CPU_FIT
    start_s: float | None = None
    reload_s: float | None = None
    stop_s: float | None = None
    gone_s: float | None = None  # from the launcher's end until no process of the run (zombies included) and no port
    haproxy_started: int = 0  # HAProxy processes the shim became (first start and reloads)
    reaped_by_launcher: int = 0  # of them, killed by the launcher after Serve stopped (deploy/launch.py)
    ports: list[int] = field(default_factory=list)  # TCP ports the run listened on
    left: list[str] = field(default_factory=list)  # processes of the run alive after the stop
    zombies: int = 0  # ended processes of the run still not reaped SETTLE_S after the launcher's end
    ports_left: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.left and not self.ports_left


def shipped() -> list[Path]:
    """The configs/*.yaml that are Serve configs (configs/prometheus.yml and the dashboard JSON are not)."""
    return [p for p in sorted(CONFIGS.glob("*.yaml")) if "applications" in (yaml.safe_load(p.read_text()) or {})]


def fit(config: dict[str, Any], has_gpu: bool) -> dict[str, Any]:
    """The args overrides a config needs to start on this machine: none, or CPU_FIT when its workers ask for GPUs
    and there are none."""
    args = config["applications"][0].get("args") or {}
    return dict(CPU_FIT) if (args.get("worker_num_gpus") or 0) > 0 and not has_gpu else {}


def reloaded(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with max_batch_items one higher: an `args` change, so Serve rebuilds the app (every replica)."""
    from deploy.config import AppConfig

    out = json.loads(json.dumps(config))
    args = out["applications"][0].setdefault("args", {})
    args["max_batch_items"] = AppConfig.model_validate(args).max_batch_items + 1
    return out


def dashboard_url(log: str) -> str | None:
    """The Ray dashboard's address, from the launcher's log (ray.init says where it started it)."""
    found = re.search(r"View the dashboard at\s+(http://\S+)", _ANSI.sub("", log))
    return found.group(1).rstrip("/") if found else None


def ray_session_dir(procs: list[process_table.Proc]) -> str | None:
    """The run's Ray session folder, named on its GCS server's command line."""
    for p in procs:
        found = re.search(r"--log_dir=(\S+)/logs", p.command)
        if found and "gcs_server" in p.command:
            return found.group(1)
    return None


def _score(url: str) -> None:
    body = {"text": "The capital of France is Paris.", "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
            "logprob_start_len": 0}
    r = httpx.post(url + "/generate", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    if r.status_code != 200 or len(r.json()["meta_info"]["input_token_logprobs"]) < 2:
        raise RuntimeError(f"scoring answered {r.status_code}: {r.text[:200]}")


def _recorded(run_dir: Path) -> int:
    """HAProxy processes the shim recorded for this run (deploy/haproxy_shim.py's pid file)."""
    from deploy.haproxy_shim import PID_SUFFIX

    return sum(len(p.read_text().split()) for p in run_dir.glob(f"*/haproxy.cfg{PID_SUFFIX}"))


def _serve(args: list[str], timeout_s: float, token_auth: bool) -> str:
    """Serve's CLI; with `token_auth`, told so (it does not find out itself that the cluster ray.init started uses the
    token in ~/.ray/auth_token)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if token_auth:
        env.setdefault("RAY_AUTH_MODE", "token")
    run = subprocess.run([str(Path(sys.executable).with_name("serve")), *args], capture_output=True, text=True,
                         timeout=timeout_s, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"serve {args[0]} exited {run.returncode}: {(run.stdout + run.stderr)[-500:]}")
    return run.stdout


def reload(url: str, run_dir: Path, timeout_s: float) -> None:
    """`serve deploy` of the reloaded config through the run's dashboard; back when the app is RUNNING again, HAProxy
    restarted (when the run has it) and a scoring request answers."""
    log = (run_dir / "serve.log").read_text()
    address = dashboard_url(log)
    if address is None:
        raise RuntimeError("no dashboard address in the launcher's log")
    config = yaml.safe_load((run_dir / "serve.yaml").read_text())
    (run_dir / "reload.yaml").write_text(yaml.safe_dump(reloaded(config)))
    app = config["applications"][0]["name"]
    haproxy = "HAProxy ingress" in log
    token = "Token authentication is enabled" in log
    before = _recorded(run_dir)
    deadline = time.monotonic() + timeout_s
    _serve(["deploy", str(run_dir / "reload.yaml"), "--address", address], timeout_s, token)
    while time.monotonic() < deadline:
        status = (yaml.safe_load(_serve(["status", "--address", address], 60, token)) or {}).get("applications") or {}
        if status.get(app, {}).get("status") == "RUNNING" and (not haproxy or _recorded(run_dir) > before):
            _score(url)
            return
        time.sleep(3)
    raise TimeoutError(f"not RUNNING again with HAProxy reloaded within {timeout_s:g} s")


def one_round(config_path: Path, number: int, step_timeout_s: float, has_gpu: bool) -> Round:
    signum = signal.SIGINT if number % 2 else signal.SIGTERM
    result = Round(config_path.name, number, signum.name)
    config = yaml.safe_load(config_path.read_text())
    overrides = fit(config, has_gpu)
    result.fitted = bool(overrides)
    run_dir = Path(tempfile.mkdtemp(prefix="rsl", dir="/tmp"))  # short: HAProxy's socket paths
    os.environ["RAYSCORE_API_KEYS"] = KEY  # the launcher's environment, and so Ray's
    started = time.monotonic()
    proc = None
    ports: dict[int, int] = {}
    marks = [str(run_dir)]
    try:
        proc, url = launch(config_path, run_dir, overrides)
        wait_healthy(proc, url, run_dir, step_timeout_s)
        _score(url)
        result.start_s = round(time.monotonic() - started, 1)
        run = process_table.of_run(proc.pid, marks)
        marks.append(ray_session_dir(run) or "")
        ports.update(process_table.listening_ports(p.pid for p in run))
        began = time.monotonic()
        reload(url, run_dir, step_timeout_s)
        result.reload_s = round(time.monotonic() - began, 1)
        ports.update(process_table.listening_ports(p.pid for p in process_table.of_run(proc.pid, marks)))
    except Exception as exc:  # the round's failure; the stop and the checks still run
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        result.haproxy_started = _recorded(run_dir)
        if proc is not None:
            began = time.monotonic()
            if not stop(proc, signum, step_timeout_s):
                result.error = result.error or f"the launcher did not end on {signum.name}; SIGKILL"
            result.stop_s = round(time.monotonic() - began, 1)
            leftovers(result, proc.pid, marks, ports)
        log = (run_dir / "serve.log").read_text() if (run_dir / "serve.log").exists() else ""
        reaped = re.search(r"rayscore: stopped (\d+) HAProxy", log)
        result.reaped_by_launcher = int(reaped.group(1)) if reaped else 0
    return result


def leftovers(result: Round, session: int, marks: list[str], ports: dict[int, int]) -> None:
    """Fill in what the run left once the launcher ended: wait up to SETTLE_S for every process of the run to be gone
    (zombies reaped too) and its ports closed; then kill the processes of the run still alive."""
    result.ports = sorted(ports)
    began = time.monotonic()
    while True:
        procs = process_table.of_run(session, marks)
        alive = [p for p in procs if p.state != "Z"]
        still = [port for port in ports if port in process_table.listening()]
        if (not procs and not still) or time.monotonic() - began > SETTLE_S:
            break
        time.sleep(0.5)
    if not procs and not still:
        result.gone_s = round(time.monotonic() - began, 1)
    result.left = [str(p) for p in alive]
    result.zombies = len(procs) - len(alive)
    result.ports_left = [f"{port} ({process_table.port_owner(port) or 'owner not found'})" for port in still]
    for p in alive:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except OSError:
            pass


def table(rounds: list[Round]) -> str:
    head = ("config", "round", "stop by", "start s", "reload s", "stop s", "all gone s", "HAProxy runs", "left",
            "ports left", "result")
    rows = [head] + [(r.config + (" (CPU fit)" if r.fitted else ""), str(r.round), r.signal, f"{r.start_s}",
                      f"{r.reload_s}", f"{r.stop_s}", f"{r.gone_s}", f"{r.haproxy_started} ({r.reaped_by_launcher} "
                      "reaped)",
                      f"{len(r.left)}" + (f" +{r.zombies} zombie" if r.zombies else ""), str(len(r.ports_left)),
                      "ok" if r.ok else (r.error or "leftovers")) for r in rounds]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checks.config_lifetime", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, action="append", help="a Serve config (repeatable; default: every "
                    "shipped one)")
    ap.add_argument("--rounds", type=int, default=2, help="starts and stops per config, in a row (default 2)")
    ap.add_argument("--step-timeout-s", type=float, default=600.0, help="bound on each start, reload and stop")
    args = ap.parse_args(argv)
    import torch

    has_gpu = torch.cuda.is_available()
    rounds: list[Round] = []
    for path in args.config or shipped():
        for number in range(1, args.rounds + 1):
            rounds.append(one_round(path, number, args.step_timeout_s, has_gpu))
            print(json.dumps(asdict(rounds[-1])), flush=True)
    print(table(rounds))
    print(json.dumps({"tool": "config_lifetime", "rounds": len(rounds), "failed": sum(not r.ok for r in rounds)}))
    return 0 if all(r.ok for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
