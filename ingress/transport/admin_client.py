"""The admin side of the transport: the worker deployment's registries (weights, LoRA adapters) and the generation
controls, for the admin routes (ingress/weights/, ingress/adapters/) and the adapter lookups of requests.

The registries are deployment-scoped Ray actors whose names are Serve's, known inside the worker deployment only: a
worker hands out a fresh handle on each (`weights_registry`, `adapters_registry`)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ingress.transport.ray_calls import call
from protocol import DEFAULT_WEIGHT_VERSION, WeightUpdate, WeightUpdateResult
from protocol.control import FlushCache, GenerationControl

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger(__name__)

# How long an ingress replica trusts its copy of the adapter registry.
ADAPTERS_TTL_S = 1.0
WEIGHT_UPDATES_OFF = "Weight updates are off on this deployment (config field `weight_updates`)."
CONTROLS_OFF = ("Generation controls reach every worker through the weight registry, which is off on this deployment "
                "(config field `weight_updates`).")


class AdminClient:
    """Weights, adapters and controls over the worker deployment's handle (Backend's admin methods)."""

    def __init__(self, worker: DeploymentHandle, weight_updates: bool = False) -> None:
        self._admin_worker = worker
        self._weight_updates = weight_updates
        self._adapters_cache: tuple[float, dict[str, str]] = (-1.0, {})

    async def adapters(self) -> dict[str, str]:
        """The registry's adapters, read at most once a second per ingress replica (a load or unload through another
        replica shows here within that second)."""
        stamp, paths = self._adapters_cache
        if time.monotonic() - stamp < ADAPTERS_TTL_S:
            return paths
        registry = await self._adapter_registry()
        paths = await registry.all.remote() if registry is not None else {}
        self._adapters_cache = (time.monotonic(), paths)
        return paths

    async def load_adapter(self, name: str, path: str) -> str | None:
        registry = await self._adapter_registry()
        if registry is None:
            return "No worker replica has started: there is no adapter registry yet."
        refused: str | None = await call(self._admin_worker.check_adapter, name, path)
        if refused is not None:
            return refused
        if not await registry.put.remote(name, path):
            return f"The adapter {name!r} is already loaded (POST /v1/unload_lora_adapter first)."
        self._adapters_cache = (-1.0, {})
        return None

    async def unload_adapter(self, name: str) -> bool:
        registry = await self._adapter_registry()
        removed: bool = registry is not None and await registry.remove.remote(name)
        self._adapters_cache = (-1.0, {})
        return removed

    async def update_weights(self, req: WeightUpdate) -> WeightUpdateResult:
        if not self._weight_updates:
            return WeightUpdateResult(False, WEIGHT_UPDATES_OFF)
        registry = await self._registry()
        if registry is None:
            return WeightUpdateResult(False, "No worker replica has started: there are no weights to update yet.")
        result: WeightUpdateResult = await registry.update.remote(req)
        return result

    async def control(self, op: GenerationControl) -> WeightUpdateResult:
        flush = isinstance(op, FlushCache)
        if not self._weight_updates:
            return WeightUpdateResult(False, WEIGHT_UPDATES_OFF if flush else CONTROLS_OFF)
        registry = await self._registry()
        if registry is None:
            return WeightUpdateResult(False, "No worker replica has started: there is no cache to flush." if flush
                                      else "No worker replica has started: there is no generation to control.")
        result: WeightUpdateResult = await registry.control.remote(op)
        return result

    async def weight_version(self) -> str:
        registry = await self._registry()
        if registry is None:
            return DEFAULT_WEIGHT_VERSION
        version: str = await registry.version.remote()
        return version

    async def _registry(self) -> Any:
        """The registry's actor handle, asked of a worker each time (its name is Serve's, per code version, and a
        handle held across Serve's recreation of the actor would point at the old one; the admin routes are rare);
        None with updates off or when no worker answers."""
        if not self._weight_updates:
            return None
        try:
            return await call(self._admin_worker.weights_registry)
        except Exception as exc:  # no worker, or the registry is being recreated
            logger.info("weight registry not reachable: %s", type(exc).__name__)
            return None

    async def _adapter_registry(self) -> Any:
        """The adapter registry's actor handle, asked of a worker as the weight registry's is; None when no worker
        answers."""
        try:
            return await call(self._admin_worker.adapters_registry)
        except Exception as exc:  # no worker, or the registry is being recreated
            logger.info("adapter registry not reachable: %s", type(exc).__name__)
            return None
