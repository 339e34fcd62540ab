"""Run as a script (tests/e2e/test_serve_pipeline.py starts it in its own process, since a process holds one Ray): a
two-node Ray cluster on this machine (ray.cluster_utils.Cluster, every node on 127.0.0.1), one fake GPU per node, and
the tiny Llama served at pipeline_parallel_size 2 with one rank (one GPU bundle) per stage, so the two stages sit on
the two nodes. Prints one JSON line of facts for the test to judge: the placement, the rows over HTTP against
transformers, then the loss of the second node under a bounded load loop (a replacement node joins, as an
autoscaler's would): every answer's status and exactness, how long until the replica answered again, and whether
anything of the old group is left."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Before Ray is imported: Ray resolves a 127.0.0.1 address to the machine's own IP unless told it is no real cluster,
# and this machine's other addresses are not reachable; every node of this cluster listens on loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import httpx  # noqa: E402
import psutil  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.serve import RunTarget  # noqa: E402

from deploy.app import build_app  # noqa: E402
from tests.helpers.engine import rand_ids  # noqa: E402
from tests.helpers.reference import hf_logits, hf_scores  # noqa: E402
from tests.helpers.serve import score_body, wait_ready  # noqa: E402
from tests.helpers.tiny_models import build_tiny_model  # noqa: E402
from workers.ranks import RANK_PREFIX  # noqa: E402

APP = "pp"
LOAD_S = 240.0  # the most the fault phase runs
# A Ray temp dir of this run's own (sessions, sockets, logs). Short: Ray's socket paths must stay under 107 bytes.
TEMP_DIR = tempfile.mkdtemp(prefix="rsp", dir="/tmp")
NODE = dict(num_cpus=1, num_gpus=1, node_ip_address="127.0.0.1", temp_dir=TEMP_DIR)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(path: Path) -> dict[str, Any]:
    return dict(model=str(path), dtype="float32", device="cpu", pipeline_parallel_size=2, num_workers=1,
                worker_num_cpus=1, worker_num_gpus=1, num_threads=1, ingress_num_cpus=0.1, kv_cache_mb=8,
                max_num_batched_tokens=64, weight_updates=False, retry_deadline_s=120,
                worker_graceful_shutdown_timeout_s=2)


def _diff(rows: list, want: list[float]) -> float:
    return max(abs(v - w) for (v, _), w in zip(rows, want, strict=True))


def _ranks() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(RANK_PREFIX)]


def _group_pids() -> set[int]:
    """The live processes of the worker's group, by Ray's process titles: the replica (rank 0) and its rank actors
    (each holds the group's sockets and rank 0 its rendezvous port)."""
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        title = " ".join(p.info["cmdline"] or [])
        if title.startswith("ray::RankActor") or title.startswith(f"ray::ServeReplica:{APP}:EngineWorker"):
            found.add(p.info["pid"])
    return found


def _placement() -> dict[str, Any]:
    pgs = [p for p in ray.util.placement_group_table().values() if p["state"] == "CREATED" and len(p["bundles"]) == 2]
    return {"strategy": [p["strategy"] for p in pgs],
            "nodes": [sorted(set(p["bundles_to_node_id"].values())) for p in pgs]}


def exact_rows(url: str, path: Path) -> dict[str, Any]:
    ids = rand_ids(40, 11)
    want = hf_scores(path, ids, 3)
    first = httpx.post(url + "/generate", json=score_body(ids, 3, k=2), timeout=120).json()["meta_info"]
    warm = httpx.post(url + "/generate", json=score_body(ids, 3), timeout=120).json()["meta_info"]
    body = {"input_ids": ids[:12], "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_logprob": True}
    gen = httpx.post(url + "/generate", json=body, timeout=120).json()
    out = [t for _, t in gen["meta_info"]["output_token_logprobs"]]
    lp = torch.log_softmax(hf_logits(path, ids[:12] + out), dim=-1)
    greedy = [(t == int(lp[11 + j].argmax()), abs(v - lp[11 + j, t].item()))
              for j, (v, t) in enumerate(gen["meta_info"]["output_token_logprobs"])]
    return {"score_diff": _diff(first["input_token_logprobs"], want), "warm_cached": warm["cached_tokens"],
            "warm_diff": _diff(warm["input_token_logprobs"], want), "greedy_argmax": all(g for g, _ in greedy),
            "greedy_diff": max(d for _, d in greedy), "greedy_tokens": len(out)}


def fault(cluster: Cluster, node: Any, url: str, path: Path) -> dict[str, Any]:
    """Scoring requests from 3 clients in a loop; the second node is removed under them, then a new node joins."""
    prompts = [rand_ids(24, 40 + i) for i in range(4)]
    wants = [hf_scores(path, p, 2) for p in prompts]
    answers: list[tuple[float, int, str | None, bool]] = []  # (sent at, status, Retry-After, exact)
    stop = threading.Event()

    def client(c: int) -> None:
        i = c
        with httpx.Client(timeout=300) as http:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    r = http.post(url + "/generate", json=score_body(prompts[i % 4], 2))
                except httpx.HTTPError as exc:  # no answer at all: the test shows it
                    answers.append((sent, -1, repr(exc), False))
                    continue
                exact = r.status_code == 200 and _diff(r.json()["meta_info"]["input_token_logprobs"],
                                                      wants[i % 4]) <= 1e-4
                answers.append((sent, r.status_code, r.headers.get("retry-after"), exact))
                i += 3

    old_ranks, old_pids = _ranks(), _group_pids()
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(3)]
    for t in threads:
        t.start()
    time.sleep(3)
    lost_at = time.monotonic()
    cluster.remove_node(node)
    cluster.add_node(**NODE)  # the replacement node (an autoscaler's role on a real cluster)
    back = None
    while time.monotonic() - lost_at < LOAD_S:
        late = [a for a in answers if a[0] > lost_at + 1 and a[1] == 200]
        if back is None and late:
            back = min(a[0] for a in late) - lost_at
        if len(late) >= 6:
            break
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(300)
    time.sleep(2)
    return {"answers": [(s, h, e) for _, s, h, e in answers], "before": sum(a[0] < lost_at for a in answers),
            "back_s": back, "old_ranks_left": sorted(set(old_ranks) & set(_ranks())), "new_ranks": len(_ranks()),
            "old_pids": len(old_pids), "old_pids_alive": len(old_pids & _group_pids()),
            "new_pids": len(_group_pids() - old_pids)}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="rayscore-pp-"))
    path = build_tiny_model(root / "llama", "llama")
    # Cluster records its head in the machine's Ray address file, which a plain ray.init() of any other process
    # here joins: what was there is put back at once.
    address_file = Path(ray._private.utils.get_ray_address_file(None))
    before = address_file.read_text() if address_file.exists() else None
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=3, num_gpus=1, node_ip_address="127.0.0.1",
                                                                 include_dashboard=False, temp_dir=TEMP_DIR))
    if before is None:
        address_file.unlink(missing_ok=True)
    else:
        address_file.write_text(before)
    ray.init(address=cluster.address, log_to_driver=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
    url = f"http://127.0.0.1:{port}/{APP}"
    facts: dict[str, Any] = {}
    try:
        # The second node joins once the app is deploying: the ingress has placed on the head, and the worker's
        # placement group (two one-GPU bundles) waits for it.
        serve.run_many([RunTarget(build_app(_args(path)), name=APP, route_prefix=f"/{APP}")],
                       wait_for_applications_running=False)
        time.sleep(2)
        second = cluster.add_node(**NODE)
        wait_ready(APP, timeout=300)
        facts["placement"] = _placement()
        facts["second_node"] = second.node_id
        facts["rows"] = exact_rows(url, path)
        facts["fault"] = fault(cluster, second, url, path)
        facts["rows_after"] = exact_rows(url, path)
    finally:
        print(json.dumps(facts), flush=True)
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(TEMP_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
