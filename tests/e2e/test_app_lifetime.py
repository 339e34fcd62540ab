"""Nothing of a deploy outlives it, and runtime settings change in place, on the session's real Serve instance:
the app deployed from a config (as `serve deploy` and `serve run` of a config file do), its weight registry a
deployment-scoped actor of the workers; a redeploy that changes only the ingress's `user_config` (a limit), then
one that changes only the workers' (their top-k limit and step budget), keeps every replica (same replica ids, same
worker PIDs) and enforces the new limits, the scores still exact; a worker user_config field that is not a runtime
setting fails the deploy, naming the runtime fields; after `serve.delete` no actor or
process of the app is left (the registry used to be a detached actor that every deploy leaked)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve

from tests.helpers.engine import rand_ids
from tests.helpers.reference import hf_scores
from tests.helpers.serve import alive, app_args, score_body, wait_ready, worker_stats
from tests.helpers.serve import deploy_config as serve_deploy_config

APP, PREFIX = "lifetime", "/lifetime"
# 40 items (one worker request each): over the default max_batch_items (32), under 64.
IDS = rand_ids(40, 7)
SCORE = {"query": [5, 6, 7], "items": [[10 + i] for i in range(40)], "label_token_ids": [1, 2]}


def deploy_config(model: Path, ingress: dict[str, Any] | None = None, worker: dict[str, Any] | None = None) -> None:
    """The app from a config, with each deployment's user_config when given (Serve's `deployments:` entries). The
    tiny Llama: the test is about the app's lifetime and settings, not the model (each of its four worker starts,
    the failing deploy's three retries included, loads it)."""
    serve_deploy_config(APP, PREFIX, app_args(model=str(model), num_workers=1, weight_updates=True),
                        [{"name": name, "user_config": config} for name, config in (("Ingress", ingress),
                                                                                   ("EngineWorker", worker)) if config])


def app_actors() -> dict[str, Any]:
    """This app's named actors (replicas and deployment-scoped actors), by name."""
    return {a["name"]: a for a in ray.util.list_named_actors(all_namespaces=True) if f"{APP}#" in a["name"]
            or f"::{APP}::" in a["name"]}


def pid_of(actor: dict[str, Any]) -> int:
    handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=30)


def wait_status(name: str, want: str, timeout: float = 120.0) -> str:
    """The app's status text (its message and its deployments') once it is `want`."""
    deadline = time.monotonic() + timeout
    while (app := serve.status().applications[name]).status != want:
        assert time.monotonic() < deadline, f"app {name} not {want}: {app}"
        time.sleep(0.5)
    return " ".join([app.message, *(d.message for d in app.deployments.values())])


def test_limit_redeploy_in_place_and_nothing_left_after_delete(serve_url: str, tiny_models: dict[str, Path]) -> None:
    url, path = serve_url + PREFIX, tiny_models["llama"]
    t0 = time.monotonic()
    deploy_config(path)
    wait_ready(APP)
    print(f"\ndeployed at {time.monotonic() - t0:.1f} s")
    try:
        before = app_actors()
        replicas = sorted(n for n in before if n.startswith("SERVE_REPLICA::"))
        registry = [n for n in before if n.endswith("::weights")]
        assert len(replicas) == 2 and len(registry) == 1, before  # ingress + worker; one registry
        worker_pids = set(worker_stats(APP, samples=4))
        pids = {n: pid_of(before[n]) for n in replicas + registry}
        with httpx.Client(base_url=url, timeout=120) as c:
            assert c.get("/model_info").json()["weight_version"] == "default"  # the registry, through a worker
            r = c.post("/v1/score", json=SCORE)
            assert r.status_code == 400 and "`max_batch_items`" in r.text, r.text

            print(f"checked before the redeploys at {time.monotonic() - t0:.1f} s")
            deploy_config(path, {"max_batch_items": 64})  # a lightweight update: user_config only
            deadline = time.monotonic() + 120
            while (r := c.post("/v1/score", json=SCORE)).status_code == 400:
                assert time.monotonic() < deadline, "the new limit never reached the running ingress"
                time.sleep(0.5)
            assert r.status_code == 200 and len(r.json()["scores"]) == 40, r.text
            assert c.post("/generate", json=score_body(IDS, 2, k=3)).status_code == 200
            print(f"the ingress's limit in place at {time.monotonic() - t0:.1f} s")

            # Only the worker's user_config changes: a lower top-k limit, and a step budget that chunks the prompt.
            deploy_config(path, {"max_batch_items": 64}, {"max_top_logprobs": 2, "max_num_batched_tokens": 16})
            deadline = time.monotonic() + 120
            while (r := c.post("/generate", json=score_body(IDS, 2, k=3))).status_code == 200:
                assert time.monotonic() < deadline, "the workers' new limit never reached the ingress's checks"
                time.sleep(0.5)
            assert r.status_code == 400 and "max_top_logprobs" in r.json()["message"], r.text
            r = c.post("/generate", json=score_body(IDS, 2, k=2))  # 37 rows over steps of 16 tokens now
            assert r.status_code == 200, r.text
            got = [row[0] for row in r.json()["meta_info"]["input_token_logprobs"]]
            assert len(got) == len(IDS) - 3
            print(f"the workers' limits in place at {time.monotonic() - t0:.1f} s")
            assert max(abs(a - b) for a, b in zip(got, hf_scores(path, IDS, 2), strict=True)) < 1e-4
        wait_ready(APP)
        info = serve.get_deployment_handle("EngineWorker", app_name=APP).model_info.remote().result(timeout_s=30)
        assert info.max_top_logprobs == 2
        after = app_actors()
        assert sorted(n for n in after if n.startswith("SERVE_REPLICA::")) == replicas  # no replica restarted
        assert set(worker_stats(APP, samples=4)) == worker_pids
        assert {n: pid_of(after[n]) for n in replicas + registry} == pids
        print(f"no replica restarted, checked at {time.monotonic() - t0:.1f} s")

        # A field that is not a runtime setting fails the deploy, naming the runtime fields (Serve stops a replica
        # whose reconfigure raises: deploy/launch.py checks a file before it starts anything).
        deploy_config(path, {"max_batch_items": 64}, {"max_top_logprobs": 2, "max_num_seqs": 8})
        status = wait_status(APP, "DEPLOY_FAILED")
        assert "`max_num_seqs` is not a runtime setting of the worker" in status, status
        assert "max_num_batched_tokens" in status, status
        print(f"the deploy failed at {time.monotonic() - t0:.1f} s")
    finally:
        serve.delete(APP)
    deadline = time.monotonic() + 60
    while app_actors() or any(alive(p) for p in pids.values()):
        assert time.monotonic() < deadline, f"left after delete: {app_actors()}, {pids}"
        time.sleep(0.5)
    print(f"nothing left at {time.monotonic() - t0:.1f} s")
