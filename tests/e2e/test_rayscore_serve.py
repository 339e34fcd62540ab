"""`rayscore serve MODEL --port P` as a user types it (the console script, a local checkpoint folder): it starts its
own Ray with the front door `make serve` has, answers README's scoring request exactly (transformers' float32
forward, 1e-4), and Ctrl-C (SIGINT to its process group) leaves nothing: no process of the run alive, none of the
ports it listened on still listening (checks/config_lifetime.py's accounting). HAProxy's files and ports are private
to the run, as for every launcher the suite starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from checks import process_table
from checks.config_lifetime import Round, leftovers, ray_session_dir
from checks.launched import free_port, stop, wait_healthy
from deploy.front_door import private_haproxy_files
from tests.helpers.reference import hf_scores

BIN = Path(sys.executable).parent
README_IDS = [504, 3458, 282, 4649, 314, 7042, 30]  # README's scoring request


def test_rayscore_serve_a_folder_answers_exactly_and_ctrl_c_leaves_nothing(smollm2_path: Path) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="rss", dir="/tmp"))  # short: HAProxy's socket paths
    port = free_port()
    env = {**os.environ, **private_haproxy_files(str(run_dir), free_port(), free_port())}
    env.pop("RAY_ADDRESS", None)
    command = [str(BIN / "rayscore"), "serve", str(smollm2_path), "--port", str(port), "--metrics-export-port",
               str(free_port()), "--kv-cache-mb", "64", "--worker-num-cpus", "1", "--ingress-num-cpus", "0.2",
               "--num-threads", "1"]
    with open(run_dir / "serve.log", "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    marks = [str(run_dir)]
    ports: dict[int, int] = {}
    try:
        wait_healthy(proc, url, run_dir, timeout_s=600)
        body = {"input_ids": README_IDS, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0,
                "top_logprobs_num": 2}
        r = httpx.post(f"{url}/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        rows = r.json()["meta_info"]["input_token_logprobs"]
        assert [t for _, t in rows] == README_IDS[1:]
        want = hf_scores(smollm2_path, README_IDS, 0)
        assert max(abs(v - w) for (v, _), w in zip(rows, want, strict=True)) <= 1e-4
        run = process_table.of_run(proc.pid, marks)
        marks.append(ray_session_dir(run) or "")
        ports.update(process_table.listening_ports(p.pid for p in run))
        assert port in ports, "the run's HTTP port is among the ports its processes listen on"
    finally:
        ended = stop(proc, signal.SIGINT)
    result = Round("rayscore serve", 1, "SIGINT")
    leftovers(result, proc.pid, marks, ports)
    log = (run_dir / "serve.log").read_text()
    assert ended, f"rayscore serve did not end on Ctrl-C:\n{log[-2000:]}"
    assert not result.left and not result.ports_left, (result.left, result.ports_left, log[-2000:])
