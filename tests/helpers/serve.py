"""Deploying the real application on the session's Ray cluster, and talking to it over HTTP."""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from typing import Any

import httpx
import yaml
from ray import serve

from deploy.app import build_app
from protocol import WorkerStats


def ids_of(n: int, seed: int) -> list[int]:
    """`n` random ids of the default model's vocabulary (49152), the same for the same seed."""
    rng = random.Random(seed)
    return [rng.randrange(0, 49152) for _ in range(n)]


def score_body(ids: list[int], n: int, k: int | None = None, stream: bool = False) -> dict:
    """A /generate body that scores ids[n+1:] (with the top `k` per row when given)."""
    body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": n, "stream": stream}
    if k is not None:
        body["top_logprobs_num"] = k
    return body


def app_args(**overrides: Any) -> dict[str, Any]:
    args = yaml.safe_load(open("configs/test.yaml"))["applications"][0]["args"]
    args.update(overrides)
    return args


def deploy(name: str, prefix: str, args: dict[str, Any]) -> None:
    serve.run(build_app(args), name=name, route_prefix=prefix, blocking=False)
    wait_ready(name)


def deploy_config(name: str, prefix: str, args: dict[str, Any],
                  deployments: list[dict[str, Any]] | None = None) -> None:
    """The app deployed from a config, as `serve deploy` and `serve run <config>` do (not waiting for it): a later
    deploy of the same args that changes only `deployments` entries (user_config, num_replicas) is Serve's
    lightweight update, nothing restarted."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    app: dict[str, Any] = {"name": name, "route_prefix": prefix, "import_path": "deploy.app:build_app",
                           "args": args}
    if deployments:
        app["deployments"] = deployments
    _get_global_client().deploy_apps(ServeDeploySchema(applications=[app]))


# The shared applications this session deployed (shared_app), by name.
_SHARED: set[str] = set()


def shared_name(**overrides: Any) -> str:
    """The name (and route prefix, after a slash) of the session's shared app of configs/test.yaml with `overrides`:
    the same overrides, the same name."""
    return "shared-" + hashlib.sha256(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:8]


def shared_app(serve_url: str, **overrides: Any) -> str:
    """The URL of the session's one application of configs/test.yaml with `overrides` (apps of other overrides run
    beside it), deployed at its first use and left until Serve stops at the session's end, so modules that only send
    requests to the same config pay its start-up once. A test that redeploys, kills, stops or needs counts no other
    test moved deploys an app of its own (`deploy`)."""
    name = shared_name(**overrides)
    if name not in _SHARED:
        deploy(name, f"/{name}", app_args(**overrides))
        _SHARED.add(name)
    return f"{serve_url}/{name}"


def wait_ready(name: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = serve.status().applications.get(name)
        if status is not None and status.status == "RUNNING":
            return
        time.sleep(0.5)
    raise TimeoutError(f"app {name} not RUNNING after {timeout}s: {serve.status().applications.get(name)}")


def worker_stats(app: str, samples: int = 24) -> dict[int, WorkerStats]:
    """Stats of each worker replica, by pid (the handle spreads calls over replicas)."""
    handle = serve.get_deployment_handle("EngineWorker", app_name=app)
    seen: dict[int, WorkerStats] = {}
    for _ in range(samples):
        st = handle.stats.remote().result(timeout_s=30)
        seen[st.pid] = st
    return seen


def alive(pid: int) -> bool:
    """Whether a process of this machine is still running (signal 0 only checks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def sse_events(resp: httpx.Response) -> list[Any]:
    """Parse a text/event-stream body into its JSON events; '[DONE]' stays a string."""
    events: list[Any] = []
    for block in resp.text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events
