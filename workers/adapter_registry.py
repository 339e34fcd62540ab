"""The LoRA adapters a deployment serves, name -> PEFT folder, kept by one small actor: a deployment-scoped actor of
the workers (Ray Serve's `deployment_actors`, as the weight registry is), seeded from the config's lora_adapters,
changed by the ingress's load/unload routes, read by every ingress replica. It lives and dies with the deployment.
A request carries its adapter's folder, so any worker replica serves it (loading it on demand); Serve's model
multiplexing sends it to a replica that holds it already when one does (workers/router.py)."""

from __future__ import annotations

from typing import Any

from workers.deployment_actors import FIND_TIMEOUT_S, deployment_actor

# The registry's name among the worker deployment's actors (Serve scopes it to the deployment).
ADAPTERS_ACTOR = "adapters"


class AdapterRegistry:
    """Ray actor body."""

    def __init__(self, initial: dict[str, str] | None = None) -> None:
        self.paths: dict[str, str] = dict(initial or {})

    def all(self) -> dict[str, str]:
        return dict(self.paths)

    def put(self, name: str, path: str) -> bool:
        """False when the name is taken already."""
        if name in self.paths:
            return False
        self.paths[name] = path
        return True

    def remove(self, name: str) -> bool:
        return self.paths.pop(name, None) is not None


def adapter_registry_actor(timeout_s: float = FIND_TIMEOUT_S) -> Any:
    """A fresh handle on the worker deployment's adapter registry."""
    return deployment_actor(ADAPTERS_ACTOR, timeout_s)
