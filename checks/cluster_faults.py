"""Cluster faults an operator meets, on several raylets of one machine (Ray's own multi-node test utility,
`ray.cluster_utils.Cluster`): too slow for the e2e tier, so here, with figures.

    python -m bench cluster_faults [--clients 12] [--seconds 40]

- node_loss: two workers on two nodes (the head holds the ingress only), scoring clients throughout; the node of one
  worker is removed mid-load (its raylet and processes go), a fresh node is added. Every answer must be 200 and
  exact against transformers, or 503 with Retry-After; nothing hangs; the app is back to two running workers.
- redeploy: the same load while the app is redeployed with num_workers 2 -> 1 and max_batch_items 32 -> 4 (an
  `args` change: every replica restarts, Serve drains the old ones); nothing lost or wrong, and afterwards a
  request of 8 worker requests is a 400 naming `max_batch_items`.
Prints one JSON line per part.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from typing import Any

import httpx
import yaml

from checks.reliability import ids_of, reference

ATOL = 1e-4
APP = "faults"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Load:
    """`clients` threads scoring a fixed pool of prompts until stopped; each answer judged as it comes."""

    def __init__(self, url: str, clients: int) -> None:
        self.url, self.clients = url, clients
        self.prompts = [ids_of(48, 7000 + i) for i in range(8)]
        self.refs = [reference(p) for p in self.prompts]
        self.codes: dict[str, int] = {}
        self.wrong = 0
        self.no_retry_after = 0
        self.slowest_s = 0.0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, i: int) -> None:
        k = i
        with httpx.Client(timeout=180) as c:
            while not self._stop.is_set():
                k = (k + 1) % len(self.prompts)
                body = {"input_ids": self.prompts[k], "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
                t0 = time.perf_counter()
                try:
                    r = c.post(self.url + "/generate", json=body)
                    code = str(r.status_code)
                except httpx.HTTPError as exc:
                    code, r = type(exc).__name__, None
                self.slowest_s = max(self.slowest_s, time.perf_counter() - t0)
                self.codes[code] = self.codes.get(code, 0) + 1
                if r is not None and r.status_code == 200:
                    rows = r.json()["meta_info"]["input_token_logprobs"]
                    if max(abs(v - e) for (v, _), e in zip(rows, self.refs[k], strict=True)) > ATOL:
                        self.wrong += 1
                elif r is not None and r.status_code == 503 and "retry-after" not in r.headers:
                    self.no_retry_after += 1

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(300)

    def figures(self) -> dict[str, Any]:
        total = sum(self.codes.values())
        return {"answers": total, "codes": dict(sorted(self.codes.items())), "wrong": self.wrong,
                "lost": total - self.codes.get("200", 0) - self.codes.get("503", 0) + self.no_retry_after,
                "slowest_s": round(self.slowest_s, 1)}


def _workers(app: str) -> list[str]:
    from ray import serve

    status = serve.status().applications[app].deployments["EngineWorker"]
    return [f"{state}={n}" for state, n in status.replica_states.items()]


def _running_workers(app: str) -> int:
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None or "EngineWorker" not in status.deployments:
        return 0
    return int(status.deployments["EngineWorker"].replica_states.get("RUNNING", 0))


def _worker_nodes() -> dict[str, str]:
    """Worker replica actor name -> node id."""
    import ray
    from ray.util.state import list_actors

    try:
        actors = list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
        return {a.name: a.node_id for a in actors if a.name and "#EngineWorker#" in a.name}
    except Exception:  # no dashboard: ask each replica where it runs
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "#EngineWorker#" in a["name"]]
        return {n: ray.get(ray.get_actor(n, namespace="serve").__ray_call__.remote(
            lambda self: ray.get_runtime_context().get_node_id())) for n in names}


def node_loss(cluster: Any, nodes: list[Any], url: str, clients: int, seconds: float) -> dict[str, Any]:
    by_node = _worker_nodes()
    victim = next(n for n in nodes if n.node_id in by_node.values())
    with Load(url, clients) as load:
        time.sleep(seconds / 3)
        removed_at = time.monotonic()
        cluster.remove_node(victim, allow_graceful=False)
        nodes.remove(victim)
        nodes.append(cluster.add_node(num_cpus=2))
        back_s = None
        while time.monotonic() - removed_at < 2 * seconds:
            now = _worker_nodes()
            if back_s is None and len(now) == 2 and victim.node_id not in now.values() and _running_workers(APP) == 2:
                back_s = round(time.monotonic() - removed_at, 1)
            if back_s is not None and time.monotonic() - removed_at > seconds * 2 / 3:
                break
            time.sleep(0.5)
    return {"worker_nodes_before": len(set(by_node.values())), "replicas_back_s": back_s,
            "workers_after": _workers(APP), **load.figures()}


def redeploy(url: str, args: dict[str, Any], clients: int, seconds: float) -> dict[str, Any]:
    from ray import serve

    from deploy.app import build_app

    with Load(url, clients) as load:
        time.sleep(seconds / 3)
        t0 = time.monotonic()
        serve.run(build_app({**args, "num_workers": 1, "max_batch_items": 4}), name=APP, route_prefix="/",
                  blocking=False)
        redeploy_s = round(time.monotonic() - t0, 1)
        time.sleep(seconds / 3)
    batch = {"input_ids": [[1, 2, 3]] * 8, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
    r = httpx.post(url + "/generate", json=batch, timeout=60)
    return {"redeploy_s": redeploy_s, "workers_after": _workers(APP),
            "new_limit": r.status_code == 400 and "`max_batch_items`" in r.text, **load.figures()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench cluster_faults", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=40.0, help="load per part")
    ap.add_argument("--parts", nargs="+", choices=("node_loss", "redeploy"), default=["node_loss", "redeploy"])
    opts = ap.parse_args(argv)

    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from deploy.app import build_app
    from engine.loading.default_model import ensure_default_model

    ensure_default_model()
    # The head holds Serve's controller and proxy and the ingress (0.5 CPU); one CPU is too few for a worker, so
    # the two workers land on the two other nodes.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = [cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]
    ray.init(address=cluster.address, log_to_driver=False)
    port = _free_port()
    args = {**yaml.safe_load(open("configs/test.yaml"))["applications"][0]["args"],
            "num_workers": 2, "worker_num_cpus": 1, "ingress_num_cpus": 0.5}
    try:
        # HeadOnly, as configs/local.yaml: with a proxy on every raylet of one machine, all bind the same port and
        # a removed node takes its proxy's connections with it, which a real cluster's load balancer would not.
        serve.start(http_options={"host": "127.0.0.1", "port": port, "keep_alive_timeout_s": 5},
                    proxy_location="HeadOnly", logging_config={"enable_access_log": False})
        serve.run(build_app(args), name=APP, route_prefix="/", blocking=False)
        while _running_workers(APP) < 2:
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}"
        if "node_loss" in opts.parts:
            print(json.dumps({"node_loss": node_loss(cluster, nodes, url, opts.clients, opts.seconds)}), flush=True)
        if "redeploy" in opts.parts:
            print(json.dumps({"redeploy": redeploy(url, args, opts.clients, opts.seconds)}), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
