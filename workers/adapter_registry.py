"""The LoRA adapters a deployment serves, name -> PEFT folder, kept by one small Ray actor per deploy: seeded from
the config's lora_adapters by the first worker replica, changed by the ingress's load/unload routes, read by every
ingress replica. A request carries its adapter's folder, so any worker replica serves it (loading it on demand);
Serve's model multiplexing sends it to a replica that holds it already when one does (workers/router.py)."""

from __future__ import annotations

from typing import Any

from workers.protocol import WEIGHTS_NAMESPACE


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


def adapter_registry_actor(name: str, initial: dict[str, str] | None) -> Any:
    """The deployment's registry, created by whichever replica comes first (detached, named per deploy)."""
    import ray

    actor = ray.remote(num_cpus=0)(AdapterRegistry)
    return actor.options(name=name, namespace=WEIGHTS_NAMESPACE, lifetime="detached",
                         get_if_exists=True).remote(initial)
