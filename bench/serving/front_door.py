"""Serve's Python proxy against the HAProxy front door with throughput mode (deploy/front_door.py), on the same app
and load, one after the other, each side in a process of its own (a process holds one Ray).

    python -m bench front_door [--clients 16] [--requests 400] [--tokens 48]

Per side: `requests` scoring requests of `tokens` random ids by `clients` concurrent clients against
configs/local.yaml's app (one worker), after a warm-up; requests per second, p50 and p99 latency, and the first rows
of every answer, which must agree within 1e-4 between the sides (the same engine behind both; batches differ, so
bits may). Prints one JSON line per
side and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import yaml

from checks.reliability import ids_of


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _load(url: str, prompts: list[list[int]], clients: int) -> tuple[list[float], list[list[float]], float]:
    sem = asyncio.Semaphore(clients)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as c:
        async def one(ids: list[int]) -> tuple[float, list[float]]:
            body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
            async with sem:
                t = time.perf_counter()
                r = await c.post(url + "/generate", json=body)
                latency = time.perf_counter() - t
            r.raise_for_status()
            return latency, [v for v, _ in r.json()["meta_info"]["input_token_logprobs"]]

        t0 = time.perf_counter()
        got = await asyncio.gather(*(one(p) for p in prompts))
    return [g[0] for g in got], [g[1] for g in got], time.perf_counter() - t0


def side(door: str, clients: int, requests: int, tokens: int) -> dict[str, Any]:
    """One front door, measured in this process."""
    from deploy.front_door import front_door, private_haproxy_files

    config = yaml.safe_load(open("configs/local.yaml"))
    environ = {**os.environ, "RAYSCORE_FRONT_DOOR": "python"} if door == "python" else dict(os.environ)
    chosen = front_door(config, environ)
    chosen.install()
    os.environ.update(chosen.env)
    os.environ.update(private_haproxy_files(tempfile.mkdtemp(prefix="rsb", dir="/tmp"), _free_port(), _free_port()))
    import ray
    from ray import serve

    from deploy.app import build_app

    port = _free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port, "keep_alive_timeout_s": 5},
                    proxy_location="HeadOnly", logging_config={"enable_access_log": False})
        serve.run(build_app(config["applications"][0]["args"]), name="bench", route_prefix="/", blocking=False)
        while (st := serve.status().applications.get("bench")) is None or st.status != "RUNNING":
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}"
        asyncio.run(_load(url, [ids_of(tokens, 90_000 + i) for i in range(2 * clients)], clients))  # warm-up
        latencies, rows, wall = asyncio.run(_load(url, [ids_of(tokens, i) for i in range(requests)], clients))
    finally:
        serve.shutdown()
        ray.shutdown()
    q = statistics.quantiles(latencies, n=100)
    return {"front_door": chosen.description, "requests": requests, "clients": clients, "tokens": tokens,
            "req_per_s": round(requests / wall, 2), "p50_ms": round(q[49] * 1000, 1), "p99_ms": round(q[98] * 1000, 1),
            "rows": [r[:4] for r in rows[:16]]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench front_door", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--side", choices=("python", "haproxy"), help=argparse.SUPPRESS)  # the child process's part
    opts = ap.parse_args(argv)
    if opts.side:
        print("SIDE " + json.dumps(side(opts.side, opts.clients, opts.requests, opts.tokens)), flush=True)
        return
    results: dict[str, dict[str, Any]] = {}
    for door in ("python", "haproxy"):
        run = subprocess.run([sys.executable, "-m", "bench", "front_door", "--side", door, "--clients",
                              str(opts.clients), "--requests", str(opts.requests), "--tokens", str(opts.tokens)],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        line = next((x for x in run.stdout.splitlines() if x.startswith("SIDE ")), None)
        if line is None:
            raise RuntimeError(f"the {door} side failed:\n{run.stderr[-4000:]}")
        results[door] = json.loads(line[5:])
        print(json.dumps({door: {k: v for k, v in results[door].items() if k != "rows"}}), flush=True)
    py, hap = results["python"], results["haproxy"]
    diff = max(abs(a - b) for ra, rb in zip(py["rows"], hap["rows"], strict=True)
               for a, b in zip(ra, rb, strict=True))
    print(json.dumps({"haproxy_over_python_req_per_s": round(hap["req_per_s"] / py["req_per_s"], 3),
                      "p50_ratio": round(hap["p50_ms"] / py["p50_ms"], 3), "rows_max_abs_diff": diff,
                      "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
