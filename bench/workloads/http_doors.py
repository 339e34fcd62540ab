"""Workload 5's front doors: Serve's Python proxy and HAProxy with the throughput-optimized data plane, as
deploy/front_door.py gives a cluster. A front door is per Ray and read from the environment of Ray's processes at
their start, and a process holds one Ray, so `--front-door both` runs the workload once per front door in a process of
its own (each against its own in-process baseline, in that process), then reports both, marked by front door, and
HAProxy's requests/s over the Python proxy's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.lib.context import Context
from bench.lib.report import Row

NAME = "5 over HTTP, front doors"
DOORS = {"python": "Python proxy", "haproxy": "HAProxy"}
CONFIG = Path(__file__).parents[2] / "configs" / "local.yaml"  # the shipped front-door settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def enter(door: str) -> str:
    """Put `door`'s environment in this process's, before Ray starts here; its one-line description."""
    from deploy.front_door import front_door, private_haproxy_files

    environ = {**os.environ, "RAYSCORE_FRONT_DOOR": "python"} if door == "python" else dict(os.environ)
    chosen = front_door(yaml.safe_load(CONFIG.read_text()), environ)
    if door == "haproxy" and "RAY_SERVE_ENABLE_HA_PROXY" not in chosen.env:
        raise RuntimeError(f"HAProxy cannot run here: {chosen.description}")
    chosen.install()
    os.environ.update(chosen.env)
    if door == "haproxy":  # HAProxy's files and ports private to this run (others may run one on this machine)
        run_dir = tempfile.mkdtemp(prefix="rsb", dir="/tmp")  # short: HAProxy's socket paths are 97 bytes at most
        os.environ.update(private_haproxy_files(run_dir, _free_port(), _free_port()))
    return chosen.description


def child_command(ctx: Context, door: str, out: str) -> list[str]:
    s = ctx.settings
    mode = {"quick": ["--quick"], "smoke": ["--smoke"]}.get(s.mode, [])
    return [sys.executable, "-m", "bench", "run", "-w", "http", "--front-door", door, *mode, "--model", s.model,
            "--reps", str(s.reps), "--threads", str(s.threads), "--http-concurrency", str(s.http_concurrency),
            "--http-part", s.http_part, "--slow-budget", str(s.slow_side_budget_s), "--no-llamacpp", "--out", out]


def combine(results: dict[str, list[Row]]) -> list[Row]:
    """Each front door's rows, marked, then HAProxy's throughput over the Python proxy's on every shared measure."""
    rows = [Row(r.workload, f"{DOORS[door]}: {r.measure}", r.unit, r.rayscore, r.baseline_name, r.baseline, r.goal,
                r.note) for door, got in results.items() for r in got]
    python = {r.measure: r for r in results.get("python", ())}
    for r in results.get("haproxy", ()):
        p = python.get(r.measure)
        if p is not None and r.unit in ("req/s", "tok/s") and r.rayscore is not None:
            rows.append(Row(NAME, f"HAProxy over the Python proxy: {r.measure}", r.unit, r.rayscore, "Python proxy",
                            p.rayscore))
    return rows


def both(ctx: Context) -> tuple[list[Row], dict[str, Any]]:
    results: dict[str, list[Row]] = {}
    details: dict[str, Any] = {}
    for door in DOORS:
        with tempfile.TemporaryDirectory() as out:
            run = subprocess.run(child_command(ctx, door, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
            sys.stderr.write(run.stderr[-4000:])  # the child's progress lines
            found = list(Path(out).glob("*.json"))
            if not found:
                results[door] = [Row(NAME, f"FAILED ({DOORS[door]})", "", None,
                                     note=f"rc {run.returncode}: {run.stderr.strip().splitlines()[-1:]}")]
                continue
            data = json.loads(found[0].read_text())
        results[door] = [Row.from_json(r) for r in data["rows"]]
        details[door] = data["details"].get("http", {})
    return combine(results), details
