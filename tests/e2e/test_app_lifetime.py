"""Nothing of a deploy outlives it, and runtime settings change in place, on the session's real Serve instance:
the app deployed from a config (as `serve deploy` and `serve run` of a config file do), its weight registry a
deployment-scoped actor of the workers; a redeploy that changes only the ingress's `user_config` (a limit) keeps
every replica (same replica ids, same worker PIDs) and enforces the new limit; after `serve.delete` no actor or
process of the app is left (the registry used to be a detached actor that every deploy leaked)."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import ray
from ray import serve
from ray.serve.context import _get_global_client
from ray.serve.schema import ServeDeploySchema

from tests.helpers.serve import app_args, wait_ready, worker_stats

APP, PREFIX = "lifetime", "/lifetime"
# 20 items x 2 labels = 40 worker requests: over the default max_batch_items (32), under 64.
SCORE = {"query": [5, 6, 7], "items": [[10 + i] for i in range(20)], "label_token_ids": [1, 2]}


def deploy_config(user_config: dict[str, Any] | None = None) -> None:
    app: dict[str, Any] = {"name": APP, "route_prefix": PREFIX, "import_path": "deploy.app:build_app",
                           "args": app_args(num_workers=1, weight_updates=True)}
    if user_config is not None:
        app["deployments"] = [{"name": "Ingress", "user_config": user_config}]
    _get_global_client().deploy_apps(ServeDeploySchema(applications=[app]))


def app_actors() -> dict[str, Any]:
    """This app's named actors (replicas and deployment-scoped actors), by name."""
    return {a["name"]: a for a in ray.util.list_named_actors(all_namespaces=True) if f"{APP}#" in a["name"]
            or f"::{APP}::" in a["name"]}


def pid_of(actor: dict[str, Any]) -> int:
    handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=30)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_limit_redeploy_in_place_and_nothing_left_after_delete(serve_url: str) -> None:
    url = serve_url + PREFIX
    deploy_config()
    wait_ready(APP)
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

            deploy_config({"max_batch_items": 64})  # a lightweight update: user_config only
            deadline = time.monotonic() + 120
            while (r := c.post("/v1/score", json=SCORE)).status_code == 400:
                assert time.monotonic() < deadline, "the new limit never reached the running ingress"
                time.sleep(0.5)
            assert r.status_code == 200 and len(r.json()["scores"]) == 20, r.text
        wait_ready(APP)
        after = app_actors()
        assert sorted(n for n in after if n.startswith("SERVE_REPLICA::")) == replicas  # no replica restarted
        assert set(worker_stats(APP, samples=4)) == worker_pids
        assert {n: pid_of(after[n]) for n in replicas + registry} == pids
    finally:
        serve.delete(APP)
    deadline = time.monotonic() + 60
    while app_actors() or any(alive(p) for p in pids.values()):
        assert time.monotonic() < deadline, f"left after delete: {app_actors()}, {pids}"
        time.sleep(0.5)
