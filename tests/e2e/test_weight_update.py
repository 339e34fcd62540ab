"""Weight updates on the session's Serve instance (two workers of a tiny Llama): the RL teacher request
(input_logprob_temperature, top-k, token_ids_logprob) equals transformers before and after; after
POST /update_weights_from_disk every answer, a prompt cached before the update included, equals transformers on the
new weights and carries the new weight_version; a generation in flight during the update is answered entirely on
the weights it started with; a bad path is a 400 and changes nothing; a replica started after the update (the old
one killed) serves the new weights from its first request."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
import ray
import torch
from ray import serve

from tests.helpers.reference import hf_logits
from tests.helpers.rl import check_teacher, teacher
from tests.helpers.serve import app_args, deploy, worker_stats
from tests.helpers.tiny_models import build_tiny_model

APP, PREFIX = "weights", "/weights"
def generated_on(path: Path, ids: list[int], answer: dict) -> bool:
    """Every generated token's logprob equals transformers' on `path`'s weights."""
    out = answer["output_ids"]
    lp = torch.log_softmax(hf_logits(path, ids + out), -1)
    got = [v for v, _ in answer["meta_info"]["output_token_logprobs"]]
    want = [lp[len(ids) - 1 + j, t].item() for j, t in enumerate(out)]
    return max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-4


@pytest.fixture(scope="module")
def app(serve_url: str, tiny_models: dict[str, Path]):
    deploy(APP, PREFIX, app_args(model=str(tiny_models["llama"]), kv_cache_mb=8, score_rows_per_block=16,
                                 max_num_batched_tokens=64, weight_updates=True,
                                 open_admin_routes=True))
    yield f"{serve_url}{PREFIX}"
    serve.delete(APP)  # the weight registry (a deployment-scoped actor) goes with it: test_app_lifetime.py


def test_update_weights_on_every_replica(app: str, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    old = tiny_models["llama"]
    new = build_tiny_model(tmp_path / "llama-v2", "llama", seed=5)  # same config and shapes, other values
    ids = [3 + (11 * i) % 300 for i in range(40)]
    with httpx.Client(base_url=app, timeout=120) as c:
        for _ in range(3):  # cold, then cached (on either worker)
            check_teacher(c.post("/generate", json=teacher(ids)).json()["meta_info"], old, ids, "default")
        assert c.get("/model_info").json()["weight_version"] == "default"

        # A long generation in flight while the update runs.
        prompt = [7, 8, 9, 10]
        events: list[dict] = []
        first = threading.Event()

        def generate() -> None:
            body = {"input_ids": prompt, "max_tokens": 400, "ignore_eos": True, "temperature": 0,
                    "return_logprob": True, "stream": True}
            with httpx.Client(base_url=app, timeout=120) as g, g.stream("POST", "/generate", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))
                        first.set()

        gen = threading.Thread(target=generate)
        gen.start()
        assert first.wait(60)
        started = time.monotonic()
        r = c.post("/update_weights_from_disk", json={"model_path": str(new), "weight_version": "v2"})
        update_s = time.monotonic() - started
        gen.join(120)
        assert r.status_code == 200 and r.json()["success"], r.text
        print(f"update: {update_s:.2f} s, {r.json()}")
        # The in-flight answer: one version on every event, all of it computed on the old weights.
        assert {e["meta_info"]["weight_version"] for e in events} == {"default"}
        whole = {"output_ids": [t for e in events for t in e["output_ids"]],
                 "meta_info": {"output_token_logprobs": [x for e in events
                                                         for x in e["meta_info"]["output_token_logprobs"]]}}
        assert len(whole["output_ids"]) == 400 and generated_on(old, prompt, whole)

        # After: every answer (the prompt cached before included) on the new weights, on both workers.
        assert c.get("/model_info").json()["weight_version"] == "v2"
        for _ in range(4):
            check_teacher(c.post("/generate", json=teacher(ids)).json()["meta_info"], new, ids, "v2")
        # A bad path: 400, nothing changes.
        bad = c.post("/update_weights_from_disk",
                     json={"model_path": str(tmp_path / "missing"), "weight_version": "v3"})
        assert bad.status_code == 400 and bad.json()["success"] is False and "missing" in bad.json()["message"]
        check_teacher(c.post("/generate", json=teacher(ids)).json()["meta_info"], new, ids, "v2")

        # A replica started later (its predecessor killed) starts on the new weights.
        pids = set(worker_stats(APP, samples=12))
        victim = next(a for a in ray.util.list_named_actors(all_namespaces=True)
                      if a["name"].startswith(f"SERVE_REPLICA::{APP}#EngineWorker"))
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                stats = worker_stats(APP, samples=12)
            except Exception:  # the handle may still pick the dead replica for a moment
                continue
            if len(stats) == 2 and set(stats) != pids:
                break
            time.sleep(1)
        stats = worker_stats(APP, samples=12)
        assert set(stats) != pids and {s.weight_version for s in stats.values()} == {"v2"}
        for _ in range(4):
            check_teacher(c.post("/generate", json=teacher(ids)).json()["meta_info"], new, ids, "v2")
