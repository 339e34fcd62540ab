"""Failures and placement on the real local cluster: a worker killed mid-request, fake-GPU placement."""

from __future__ import annotations

import threading
import time

import httpx
import ray
import yaml
from ray import serve

from tests.helpers.reference import hf_scores
from tests.helpers.serve import app_args, deploy, ids_of, score_body, worker_stats


def _replica_actors(app: str) -> list:
    names = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(f"SERVE_REPLICA::{app}#EngineWorker#")]
    return [ray.get_actor(a["name"], namespace=a["namespace"]) for a in names]


def test_worker_killed_mid_request_then_replaced(serve_url: str) -> None:
    app, url = "faults", serve_url + "/faults"
    deploy(app, "/faults", app_args(num_workers=1))
    try:
        events: list[str] = []
        done = threading.Event()

        def stream() -> None:
            body = {"prompt": "Count to a thousand:", "max_tokens": 1000, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
            done.set()

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        while len(events) < 3:
            assert time.monotonic() < deadline, "no streamed output"
            time.sleep(0.05)
        (actor,) = _replica_actors(app)
        killed_at = time.monotonic()
        ray.kill(actor, no_restart=True)
        assert done.wait(30), "the in-flight request hung after its worker died"
        assert time.monotonic() - killed_at < 30
        assert events[-1] == "[DONE]"
        import json

        last = json.loads(events[-2])
        assert last["meta_info"]["finish_reason"]["type"] == "error"

        # A request sent while no worker is alive is not answered 503: the lifecycle runs it again until Serve's
        # replacement takes it (within retry_deadline_s), so the very first one after the kill succeeds.
        r = httpx.post(url + "/generate", json=score_body([1, 2, 3, 4], 0), timeout=180)
        assert r.status_code == 200, r.text
        assert len(r.json()["meta_info"]["input_token_logprobs"]) == 3
    finally:
        serve.delete(app)


def test_cluster_config_places_one_gpu_per_replica(serve_url: str, smollm2_path) -> None:
    """The session cluster has 2 fake GPUs: each of the cluster config's GPU workers gets its own slot, sees
    no CUDA, falls back to CPU and answers exactly."""
    args = yaml.safe_load(open("configs/cluster.yaml"))["applications"][0]["args"]
    assert args["worker_num_gpus"] == 1
    args.update(num_workers=2, worker_autoscaling=None, ingress_autoscaling=None, kv_cache_mb=64,
                worker_num_cpus=0.5, ingress_num_cpus=0.1, num_threads=1, max_num_seqs=16,
                max_num_batched_tokens=512,
                dtype="float32")  # exactness is checked in float32; placement is what this test is about
    app, url = "gpu", serve_url + "/gpu"
    deploy(app, "/gpu", args)
    try:
        stats = worker_stats(app)
        assert len(stats) == 2
        slots = sorted(st.cuda_visible_devices for st in stats.values())
        assert slots == ["0", "1"], slots
        assert all(st.device == "cpu" for st in stats.values())
        ids = ids_of(30, 7)
        for _ in range(4):
            rows = httpx.post(url + "/generate", json=score_body(ids, 3), timeout=60).json()["meta_info"][
                "input_token_logprobs"]
            expected = hf_scores(smollm2_path, ids, 3)
            assert max(abs(v - e) for (v, _), e in zip(rows, expected, strict=True)) <= 1e-4
    finally:
        serve.delete(app)
